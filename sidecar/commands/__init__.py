"""The commands of `mcp-sidecar` other than parsing the command line (`sidecar/cli.py`): each in a module."""

__all__: list[str] = []
