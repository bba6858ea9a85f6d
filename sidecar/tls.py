"""TLS contexts for both legs, and their certificates read again when the files change or on SIGHUP.

A listener's context is the one its server holds: a reload loads the new certificate chain into that same
context, so connections made after it see the new certificate, and open ones (hours-long listen streams) are
left as they are. A client CA added to `client_ca_file` is trusted after a reload; one removed stays trusted
until a restart (OpenSSL can add to a context's trust store, not take from it). The upstream's context is
built anew on a reload and handed to the connection pool: new connections use it, kept-alive ones finish
their life on the old one.
"""

from __future__ import annotations

import logging
import os
import ssl
from collections.abc import Callable

from sidecar.config.tls import ListenerTLS, UpstreamTLS

__all__ = ["CertificateWatch", "server_context", "upstream_context"]

logger = logging.getLogger(__name__)


def server_context(tls: ListenerTLS) -> ssl.SSLContext | None:
    """The listener's context (None: plain HTTP)."""
    if tls.cert_file is None or tls.key_file is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    _load_server_files(context, tls)
    return context


def _load_server_files(context: ssl.SSLContext, tls: ListenerTLS) -> None:
    assert tls.cert_file is not None and tls.key_file is not None
    # Tried on a scratch context first: OpenSSL installs a new certificate before it finds that the key on disk
    # does not match (a half-copied Secret), and the serving context would be left with no usable pair.
    scratch = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    scratch.load_cert_chain(tls.cert_file, tls.key_file)
    if tls.client_ca_file is not None:
        scratch.load_verify_locations(cafile=tls.client_ca_file)
    context.load_cert_chain(tls.cert_file, tls.key_file)
    if tls.client_ca_file is not None:
        context.load_verify_locations(cafile=tls.client_ca_file)
        context.verify_mode = ssl.CERT_REQUIRED


def upstream_context(tls: UpstreamTLS) -> ssl.SSLContext:
    """The context of the sidecar's connections to an https upstream."""
    context = ssl.create_default_context(cafile=tls.ca_file)
    if tls.client_cert_file is not None and tls.client_key_file is not None:
        context.load_cert_chain(tls.client_cert_file, tls.client_key_file)
    if not tls.verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


class CertificateWatch:
    """The certificate files in use, each with what to do when it changes; `check` looks at their modification
    times (call it every few seconds), `reload` reloads everything (SIGHUP). A file that cannot be loaded is
    logged and the certificate in use is kept."""

    def __init__(self) -> None:
        self._watched: list[tuple[str, tuple[str, ...], Callable[[], None]]] = []
        self._seen: dict[str, float | None] = {}

    def listener(self, name: str, context: ssl.SSLContext, tls: ListenerTLS) -> None:
        self._add(name, (tls.cert_file, tls.key_file, tls.client_ca_file), lambda: _load_server_files(context, tls))

    def upstream(self, tls: UpstreamTLS, install: Callable[[ssl.SSLContext], None]) -> None:
        files = (tls.ca_file, tls.client_cert_file, tls.client_key_file)
        self._add("upstream", files, lambda: install(upstream_context(tls)))

    def _add(self, name: str, files: tuple[str | None, ...], reload: Callable[[], None]) -> None:
        paths = tuple(path for path in files if path is not None)
        if not paths:
            return
        self._watched.append((name, paths, reload))
        for path in paths:
            self._seen[path] = _mtime(path)

    @property
    def watching(self) -> bool:
        return bool(self._watched)

    def check(self) -> None:
        """Reload what uses a file that changed since it was last loaded."""
        changed = {path for path, seen in self._seen.items() if _mtime(path) != seen}
        for name, paths, reload in self._watched:
            if changed.intersection(paths):
                self._reload(name, paths, reload)

    def reload(self) -> None:
        for name, paths, reload in self._watched:
            self._reload(name, paths, reload)

    def _reload(self, name: str, paths: tuple[str, ...], reload: Callable[[], None]) -> None:
        for path in paths:
            self._seen[path] = _mtime(path)
        try:
            reload()
        except (OSError, ssl.SSLError, ValueError) as exc:
            logger.error(
                "certificate files could not be loaded; the ones in use are kept",
                extra={"tls": name, "files": list(paths), "reason": str(exc)},
            )
            return
        logger.info("certificate files loaded", extra={"tls": name, "files": list(paths)})


def _mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime_ns / 1e9
    except OSError:
        return None
