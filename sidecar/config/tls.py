"""TLS settings: `listen.tls` and `admin.tls` (a listener's certificate, optionally requiring client
certificates), `upstream.tls` (whom the sidecar trusts as its upstream, and the certificate it shows it)."""

from __future__ import annotations

import os

from pydantic import Field, field_validator, model_validator

from sidecar.config.base import Section

__all__ = ["ListenerTLS", "UpstreamTLS"]


def _readable(value: str | None) -> str | None:
    if value is not None and not (os.path.isfile(value) and os.access(value, os.R_OK)):
        raise ValueError(f"{value!r} is not a readable file")
    return value


class ListenerTLS(Section):
    cert_file: str | None = Field(
        None, description="PEM certificate chain the listener presents; with key_file, it serves HTTPS only."
    )
    key_file: str | None = Field(None, description="PEM private key of cert_file.")
    client_ca_file: str | None = Field(
        None, description="PEM CA bundle: when set, a client must present a certificate it signed (mutual TLS)."
    )

    _files = field_validator("cert_file", "key_file", "client_ca_file")(_readable)

    @model_validator(mode="after")
    def _complete(self) -> ListenerTLS:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together: set both, or neither for plain HTTP")
        if self.client_ca_file is not None and self.cert_file is None:
            raise ValueError("client_ca_file needs cert_file and key_file (client certificates are a TLS feature)")
        return self

    @property
    def enabled(self) -> bool:
        return self.cert_file is not None


class UpstreamTLS(Section):
    ca_file: str | None = Field(
        None, description="PEM CA bundle the upstream's certificate must chain to; absent: the system's trust store."
    )
    client_cert_file: str | None = Field(
        None, description="PEM certificate (chain) presented to an upstream that asks for one (mutual TLS)."
    )
    client_key_file: str | None = Field(None, description="PEM private key of client_cert_file.")
    server_name: str | None = Field(
        None, description="Name sent as SNI and checked against the upstream's certificate; absent: the URL's host."
    )
    verify: bool = Field(
        True,
        description="false accepts any certificate: anyone on the path can read and change the traffic (logged "
        "as a warning at start). For tests only.",
    )

    _files = field_validator("ca_file", "client_cert_file", "client_key_file")(_readable)

    @model_validator(mode="after")
    def _complete(self) -> UpstreamTLS:
        if (self.client_cert_file is None) != (self.client_key_file is None):
            raise ValueError("client_cert_file and client_key_file go together: set both, or neither")
        return self

    @property
    def configured(self) -> bool:
        return self != UpstreamTLS()
