"""Benchmarks for mcp-sidecar: `python -m bench` (full run, writes bench/RESULTS.md and plots) or `--quick`."""
