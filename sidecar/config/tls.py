"""TLS settings: `listen.tls` and `admin.tls` (a listener's certificate, optionally requiring client
certificates), `upstream.tls` (whom the sidecar trusts as its upstream, and the certificate it shows it).

The files are loaded when the configuration is, the way the listeners and the upstream client load them (the ssl
module), so a file that is not PEM, a certificate and key of different pairs, or a CA bundle with no certificate
is an error naming its key, from `check-config` as from `run`."""

from __future__ import annotations

import os
import re
import ssl

from pydantic import Field, ValidationInfo, field_validator, model_validator

from sidecar.config.base import Section
from sidecar.config.syntax import check_host

__all__ = ["ListenerTLS", "UpstreamTLS"]

_PEM_BLOCK = re.compile(rb"-----BEGIN ([A-Z0-9 ]+)-----")


def _readable(value: str | None) -> str | None:
    if value is not None and not (os.path.isfile(value) and os.access(value, os.R_OK)):
        raise ValueError(f"{value!r} is not a readable file")
    return value


def _pem_blocks(path: str) -> set[str]:
    """The kinds of PEM block in the file ("CERTIFICATE", "PRIVATE KEY", "RSA PRIVATE KEY", ...)."""
    try:
        with open(path, "rb") as file:
            text = file.read()
    except OSError as exc:
        raise ValueError(f"{path!r} cannot be read: {exc.strerror}") from None
    kinds = {match.decode() for match in _PEM_BLOCK.findall(text)}
    if b"Proc-Type: 4,ENCRYPTED" in text:
        kinds.add("ENCRYPTED PRIVATE KEY")
    return kinds


def _is_key(kind: str) -> bool:
    return kind.endswith("PRIVATE KEY")


def _certificate(path: str | None, key_key: str) -> str | None:
    """A readable PEM file with a certificate (chain) in it, each certificate parseable."""
    if path is None:
        return None
    _readable(path)
    kinds = _pem_blocks(path)
    if "CERTIFICATE" not in kinds:
        if any(_is_key(kind) for kind in kinds):
            raise ValueError(f"{path!r} holds a private key, not a certificate: are it and {key_key} swapped?")
        raise ValueError(f"{path!r} is not a PEM certificate (no -----BEGIN CERTIFICATE----- block)")
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=path)
    except ssl.SSLError as exc:
        raise ValueError(f"{path!r}: a certificate in it cannot be read ({exc.reason or exc})") from None
    return path


def _private_key(path: str | None, cert_key: str, cert_file: str | None) -> str | None:
    """A readable, unencrypted PEM private key; with `cert_file` (already checked), the key of that certificate."""
    if path is None:
        return None
    _readable(path)
    kinds = _pem_blocks(path)
    if "ENCRYPTED PRIVATE KEY" in kinds:
        raise ValueError(f"{path!r} is an encrypted key; give it unencrypted (the sidecar asks for no passphrase)")
    if not any(_is_key(kind) for kind in kinds):
        if "CERTIFICATE" in kinds:
            raise ValueError(f"{path!r} holds a certificate, not a private key: are it and {cert_key} swapped?")
        raise ValueError(f"{path!r} is not a PEM private key (no -----BEGIN ... PRIVATE KEY----- block)")
    if cert_file is None:
        return path
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert_file, path, password=_no_passphrase)
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise ValueError(f"{path!r} is not the private key of {cert_key} (another certificate's key)") from None
        raise ValueError(f"{path!r} cannot be loaded with {cert_key} ({exc.reason or exc})") from None
    return path


def _no_passphrase() -> bytes:
    raise ValueError("the key is encrypted")


def _ca_bundle(path: str | None) -> str | None:
    """A readable PEM bundle holding at least one certificate."""
    if path is None:
        return None
    _readable(path)
    no_certificate = f"{path!r} holds no PEM certificate (a CA bundle is -----BEGIN CERTIFICATE----- blocks)"
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        context.load_verify_locations(cafile=path)
    except ssl.SSLError as exc:
        if "CERTIFICATE" not in _pem_blocks(path):
            raise ValueError(no_certificate) from None
        raise ValueError(f"{path!r}: a certificate in it cannot be read ({exc.reason or exc})") from None
    if context.cert_store_stats()["x509"] == 0:
        raise ValueError(no_certificate)
    return path


class ListenerTLS(Section):
    cert_file: str | None = Field(
        None, description="PEM certificate chain the listener presents; with key_file, it serves HTTPS only."
    )
    key_file: str | None = Field(None, description="PEM private key of cert_file.")
    client_ca_file: str | None = Field(
        None, description="PEM CA bundle: when set, a client must present a certificate it signed (mutual TLS)."
    )

    @field_validator("cert_file")
    @classmethod
    def _cert(cls, value: str | None) -> str | None:
        return _certificate(value, "key_file")

    @field_validator("key_file")
    @classmethod
    def _key(cls, value: str | None, info: ValidationInfo) -> str | None:
        return _private_key(value, "cert_file", info.data.get("cert_file"))

    @field_validator("client_ca_file")
    @classmethod
    def _client_ca(cls, value: str | None) -> str | None:
        return _ca_bundle(value)

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

    @field_validator("ca_file")
    @classmethod
    def _ca(cls, value: str | None) -> str | None:
        return _ca_bundle(value)

    @field_validator("client_cert_file")
    @classmethod
    def _cert(cls, value: str | None) -> str | None:
        return _certificate(value, "client_key_file")

    @field_validator("client_key_file")
    @classmethod
    def _key(cls, value: str | None, info: ValidationInfo) -> str | None:
        return _private_key(value, "client_cert_file", info.data.get("client_cert_file"))

    @field_validator("server_name")
    @classmethod
    def _host_name(cls, value: str | None) -> str | None:
        if value is not None:
            check_host(value)
        return value

    @model_validator(mode="after")
    def _complete(self) -> UpstreamTLS:
        if (self.client_cert_file is None) != (self.client_key_file is None):
            raise ValueError("client_cert_file and client_key_file go together: set both, or neither")
        return self

    @property
    def configured(self) -> bool:
        return self != UpstreamTLS()
