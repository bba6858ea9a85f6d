"""`mcp-sidecar hint URI...`: tell a running sidecar what changed at the source, as a CMS hook or a trigger would."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Sequence

from sidecar.config.hints import read_token

__all__ = ["DEFAULT_ADMIN_URL", "send_hint"]

DEFAULT_ADMIN_URL = "http://127.0.0.1:9464"
_TIMEOUT_S = 10.0


def send_hint(
    admin_url: str,
    token_file: str,
    uris: Sequence[str],
    lists: Sequence[str] = (),
    ca_file: str | None = None,
) -> tuple[int, str]:
    """POST the hint to `admin_url`/hints; (exit code, the line to print). Raises ValueError for a token file
    that cannot be read, OSError when the sidecar cannot be reached."""
    token = read_token(token_file)
    body: dict[str, list[str]] = {"uris": list(uris)}
    if lists:
        body["lists"] = list(lists)
    request = urllib.request.Request(
        admin_url.rstrip("/") + "/hints",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        method="POST",
    )
    context = ssl.create_default_context(cafile=ca_file) if ca_file else None
    try:
        with urllib.request.urlopen(request, timeout=_TIMEOUT_S, context=context) as answer:
            answered = json.loads(answer.read())
            hinted, warm_ms = answered.get("hinted"), answered.get("warm_ms")
            line = f"hinted {hinted} watch{'' if hinted == 1 else 'es'}"
            return 0, line if not warm_ms else f"{line}, warm for {warm_ms / 1000:g} s"
    except urllib.error.HTTPError as refused:
        try:
            reason = json.loads(refused.read()).get("error", refused.reason)
        except ValueError:
            reason = refused.reason
        return 1, f"{refused.code}: {reason}"
