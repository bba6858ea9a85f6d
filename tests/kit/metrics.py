"""The one `/metrics` scrape of the tests: the text parsed by prometheus_client's own parser.

`value` asks for one exposed sample (exact labels, None when it is not there); `total` adds up the samples
whose labels include the ones given (0 when there is none), for a sum over workers or label values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

__all__ = ["Sample", "Scrape", "parse", "scrape"]


class Sample(NamedTuple):
    """One exposed sample; unpacks as `(name, labels, value)`."""

    name: str
    labels: dict[str, str]
    value: float


@dataclass
class Scrape:
    """One `/metrics` answer, parsed."""

    families: dict[str, str] = field(default_factory=dict)
    """Family name -> type (counter, gauge, histogram)."""
    samples: list[Sample] = field(default_factory=list)

    def value(self, name: str, **labels: str) -> float | None:
        """The sample `name` whose labels are exactly `labels`; None when it is not exposed."""
        for sample in self.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
        return None

    def total(self, name: str, **labels: str) -> float:
        """The sum of the samples named `name` whose labels include `labels` (0 when there is none)."""
        return sum(
            s.value for s in self.samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        )

    def nonzero(self, name: str, label: str) -> dict[str, float]:
        """The samples of `name` that are not 0, keyed by the value of their `label`."""
        return {s.labels.get(label, ""): s.value for s in self.samples if s.name == name and s.value}

    def labelled(self, name: str) -> dict[tuple[tuple[str, str], ...], float]:
        """Every sample of `name`, keyed by its sorted label pairs."""
        return {tuple(sorted(s.labels.items())): s.value for s in self.samples if s.name == name}


def parse(text: str) -> Scrape:
    parsed = Scrape()
    for family in text_string_to_metric_families(text):
        parsed.families[family.name] = family.type
        parsed.samples.extend(Sample(s.name, dict(s.labels), s.value) for s in family.samples)
    return parsed


async def scrape(http: aiohttp.ClientSession, base_url: str, path: str = "/metrics") -> Scrape:
    """GET `base_url + path` (the admin listener), checked to be the text exposition, parsed."""
    async with http.get(f"{base_url}{path}") as resp:
        assert resp.status == 200, await resp.text()
        assert resp.headers["Content-Type"].startswith("text/plain")
        return parse(await resp.text())
