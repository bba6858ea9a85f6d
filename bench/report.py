"""The bench's output: the table (terminal and Markdown), bench/RESULTS.md, and the two plots."""

from __future__ import annotations

import datetime
import importlib.metadata
import math
import os
import platform
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

__all__ = ["Results", "Row", "machine_info", "write_plots", "write_results"]


@dataclass
class Row:
    scenario: str
    measure: str
    value: str
    target: str = ""
    ok: bool | None = None
    """True or False against the target; None when the row has no target (or could not be measured)."""

    @property
    def verdict(self) -> str:
        return {True: "met", False: "MISSED", None: ""}[self.ok]


@dataclass
class Results:
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    cdf: dict[str, list[float]] = field(default_factory=dict)
    """Latency samples in seconds, by series name, for the CDF plot."""
    configs: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Each sidecar's run config (YAML), by process name."""
    coalescing: list[tuple[int, float, float]] = field(default_factory=list)
    """(subscribers, upstream reads/s, nominal interval in seconds) for the reads-vs-subscribers plot."""

    def add(self, scenario: str, measure: str, value: str, target: str = "", ok: bool | None = None) -> None:
        self.rows.append(Row(scenario, measure, value, target, ok))

    def note(self, text: str) -> None:
        self.notes.append(text)

    def text_table(self) -> str:
        header = ("scenario", "measure", "value", "target", "")
        rows = [header, *((r.scenario, r.measure, r.value, r.target, r.verdict) for r in self.rows)]
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        lines = []
        for index, row in enumerate(rows):
            lines.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
            if index == 0:
                lines.append("  ".join("-" * w for w in widths))
        return "\n".join(lines)

    def markdown_table(self) -> str:
        lines = ["| scenario | measure | value | target | |", "| --- | --- | --- | --- | --- |"]
        for r in self.rows:
            cells = (r.scenario, r.measure, r.value, r.target, f"**{r.verdict}**" if r.ok is False else r.verdict)
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        return "\n".join(lines)


def fmt(value: float | None, unit: str = "", digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:,.{digits}f}{(' ' + unit) if unit else ''}"


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _binary_version(argv: list[str]) -> str:
    if shutil.which(argv[0]) is None and shutil.which(argv[0], path="/usr/sbin:/sbin") is None:
        return "not installed"
    binary = shutil.which(argv[0]) or shutil.which(argv[0], path="/usr/sbin:/sbin") or argv[0]
    try:
        done = subprocess.run([binary, *argv[1:]], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return (done.stdout + done.stderr).strip().splitlines()[0] if (done.stdout + done.stderr).strip() else "unknown"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info() -> dict[str, str]:
    load = os.getloadavg()
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": str(os.cpu_count()),
        "CPU": _cpu_model(),
        "kernel": platform.release(),
        "Python": platform.python_version(),
        "aiohttp": aiohttp.__version__,
        "mcp (SDK)": _version("mcp"),
        "fastmcp (peer proxy)": _version("fastmcp"),
        "mcp-sidecar": _version("mcp-sidecar"),
        "nginx": _binary_version(["nginx", "-v"]),
        "redis-server": " ".join(_binary_version(["redis-server", "--version"]).split()[:3]),
        "load average at start": " ".join(f"{x:.2f}" for x in load),
    }


_PLOT_TITLES = {
    "latency_cdf.png": "notification latency CDF",
    "reads_vs_subscribers.png": "upstream reads per second vs subscribers",
}


def write_results(
    path: Path, results: Results, info: dict[str, str], duration_s: float, command: str, plots: list[Path]
) -> None:
    images = "".join(f"\n![{_PLOT_TITLES.get(p.name, p.stem)}]({p.name})\n" for p in plots)
    machine = "\n".join(f"| {key} | {value} |" for key, value in info.items())
    notes = "\n".join(f"- {text}" for text in results.notes)
    configs = "\n\n".join(
        f"`{name}`:\n\n```yaml\n{yaml.safe_dump(_portless(config), sort_keys=False).strip()}\n```"
        for name, config in results.configs.items()
    )
    text = f"""# mcp-sidecar benchmark results

Produced by `{command}` in {duration_s:.0f} s. Every figure and every baseline below was measured in the same
run, on this machine, with every server on 127.0.0.1 and the load coming from a separate process
(`bench/loadgen.py`, aiohttp). Targets are goals to report, not gates.

## Machine

| | |
| --- | --- |
{machine}

## Results

{results.markdown_table()}
{images}
## Notes

{notes}

## Sidecar configurations

Each sidecar ran as `python -m sidecar.cli run --config FILE` (plus `--workers 2` for that row), on a free port,
with these files (every other key at its default):

{configs}
"""
    path.write_text(text, encoding="utf-8")


def _portless(config: dict[str, Any]) -> dict[str, Any]:
    """A config without the run's random ports (they say nothing about the result)."""
    out = {section: dict(values) for section, values in config.items()}
    out.get("listen", {}).pop("port", None)
    for section, key in (("upstream", "url"), ("bus", "redis_url")):
        if key in out.get(section, {}):
            out[section][key] = "(this run's " + ("upstream" if section == "upstream" else "redis-server") + ")"
    return out


def write_plots(directory: Path, results: Results) -> list[Path]:
    """The latency CDF and the reads-vs-subscribers plot as PNGs; [] when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written: list[Path] = []

    if results.cdf:
        fig, ax = plt.subplots(figsize=(8, 5))
        for name, samples in results.cdf.items():
            if not samples:
                continue
            ordered = sorted(s * 1000 for s in samples)
            ys = [(i + 1) / len(ordered) for i in range(len(ordered))]
            ax.step(ordered, ys, where="post", label=f"{name} (n={len(ordered):,})")
        ax.set_xscale("log")
        ax.set_xlabel("change to notification at the client (ms, log scale)")
        ax.set_ylabel("fraction of notifications")
        ax.set_title("mcp-sidecar: change-to-notification latency")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="lower right")
        path = directory / "latency_cdf.png"
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)

    if results.coalescing:
        points = sorted(results.coalescing)
        xs = [p[0] for p in points]
        fig, ax = plt.subplots(figsize=(8, 5))
        ax.plot(xs, [p[1] for p in points], "o-", label="mcp-sidecar: measured upstream reads/s")
        ax.plot(xs, [1 / p[2] for p in points], "--", label="one read per interval (ideal)")
        ax.plot(xs, [p[0] / p[2] for p in points], ":", label="one read per subscriber per interval (no sharing)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("listen streams on one URI")
        ax.set_ylabel("upstream resources/read per second")
        ax.set_title("Coalescing: upstream load vs number of subscribers")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="upper left")
        path = directory / "reads_vs_subscribers.png"
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written
