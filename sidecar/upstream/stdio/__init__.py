"""The upstream as a stdio child process: `StdioUpstream`, over one supervised child (`supervisor`, `child`) whose
pipes carry newline-delimited JSON-RPC (`lines`, `frames`) and whose process group ends with it (`process`)."""

from __future__ import annotations

from sidecar.upstream.stdio.client import StdioUpstream

__all__ = ["StdioUpstream"]
