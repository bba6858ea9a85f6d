"""The bearer token of `POST /hints`: read from `hints.token_file` at start and again on SIGHUP (rotation)."""

from __future__ import annotations

import hashlib
import hmac
import logging

from sidecar.config.hints import read_token

__all__ = ["HintToken"]

logger = logging.getLogger(__name__)


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


class HintToken:
    """The token one file holds. Only its digest is kept: compared in constant time, whatever the length given."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._digest = _digest(read_token(path))

    def reload(self) -> None:
        """Read the file again (SIGHUP); a file that cannot be read or holds none keeps the token in use."""
        try:
            self._digest = _digest(read_token(self.path))
        except ValueError as exc:
            logger.warning("hints.token_file not reloaded; the previous token stays in use", extra={"reason": str(exc)})
            return
        logger.info("hints.token_file reloaded")

    def accepts(self, authorization: str | None) -> bool:
        """True for `Authorization: Bearer <the token>` (the scheme in any case)."""
        scheme, _, given = (authorization or "").strip().partition(" ")
        matches = hmac.compare_digest(_digest(given.strip()), self._digest)
        return scheme.lower() == "bearer" and matches
