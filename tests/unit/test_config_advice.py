"""What the configuration tells an operator beyond "bad key": the key an unknown one was meant to be, and values
that each load but contradict one another (which one applies, named as the operator wrote it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.config import ConfigError, load_config

UPSTREAM = "upstream:\n  url: http://127.0.0.1:9000/mcp\n"


def _error(tmp_path: Path, text: str, environ: dict[str, str] | None = None) -> str:
    path = tmp_path / "sidecar.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(path, environ=environ or {})
    return str(info.value)


def _warnings(tmp_path: Path, text: str, environ: dict[str, str] | None = None) -> list[str]:
    path = tmp_path / "sidecar.yaml"
    path.write_text(UPSTREAM + text, encoding="utf-8")
    return load_config(path, environ=environ or {}).warnings()


@pytest.mark.parametrize(
    ("text", "said"),
    [
        pytest.param(
            "polling:\n  default_intervl_ms: 5000\n",
            "polling.default_intervl_ms: unknown key; did you mean 'default_interval_ms'?",
            id="misspelt-key",
        ),
        pytest.param(
            "upsteam:\n  url: http://127.0.0.1:9/mcp\n", "upsteam: unknown key; did you mean 'upstream'?", id="section"
        ),
        pytest.param(
            UPSTREAM + "listen:\n  tls:\n    cert_fle: /x\n",
            "listen.tls.cert_fle: unknown key; did you mean 'cert_file'?",
            id="nested-section",
        ),
        pytest.param(
            UPSTREAM + "polling:\n  rules:\n    - match: 'a://*'\n      intervl_ms: 5\n",
            "polling.rules[0].intervl_ms: unknown key; did you mean 'interval_ms'?",
            id="in-a-list",
        ),
        pytest.param(
            UPSTREAM + "polling:\n  default_interval_ms: 1000\nmin_interval_ms: 250\n",
            "min_interval_ms: unknown key; did you mean polling.min_interval_ms? (check the indentation)",
            id="dedented-key",
        ),
        pytest.param(
            "upstream:\nurl: http://127.0.0.1:9/mcp\n",
            "url: unknown key; did you mean upstream.url? (check the indentation)",
            id="dedented-under-its-section",
        ),
    ],
)
def test_an_unknown_key_is_answered_with_the_key_it_was_likely_meant_to_be(
    tmp_path: Path, text: str, said: str
) -> None:
    assert said in _error(tmp_path, text).splitlines()


def test_an_unknown_key_like_no_known_one_gets_no_guess(tmp_path: Path) -> None:
    # A guess far from what was written would mislead more than it helps.
    assert "polling.zzz: unknown key" in _error(tmp_path, UPSTREAM + "polling:\n  zzz: 1\n").splitlines()


def test_an_unknown_key_from_the_environment_is_answered_too(tmp_path: Path) -> None:
    message = _error(tmp_path, UPSTREAM, environ={"MCP_SIDECAR__POLLING__DEFAULT_INTERVL_MS": "5"})
    assert "did you mean 'default_interval_ms'?" in message
    assert "MCP_SIDECAR__POLLING__DEFAULT_INTERVL_MS" in message


def test_a_default_interval_below_the_minimum_is_warned_about_naming_both_and_what_applies(tmp_path: Path) -> None:
    assert _warnings(tmp_path, "polling:\n  default_interval_ms: 100\n  min_interval_ms: 250\n") == [
        "polling.default_interval_ms is 100, below polling.min_interval_ms of 250: "
        "resources without a ttlMs are polled every 250 ms"
    ]


def test_a_default_interval_above_the_maximum_is_warned_about(tmp_path: Path) -> None:
    (warning,) = _warnings(tmp_path, "polling:\n  default_interval_ms: 90000\n  max_interval_ms: 60000\n")
    assert warning.startswith("polling.default_interval_ms is 90000, above polling.max_interval_ms of 60000")


def test_a_value_from_the_environment_is_named_by_its_variable(tmp_path: Path) -> None:
    (warning,) = _warnings(tmp_path, "", environ={"MCP_SIDECAR__POLLING__DEFAULT_INTERVAL_MS": "100"})
    assert warning.startswith(
        "polling.default_interval_ms (from MCP_SIDECAR__POLLING__DEFAULT_INTERVAL_MS) is 100, below "
        "polling.min_interval_ms of 250"
    )


def test_a_rule_interval_outside_the_bounds_is_warned_about(tmp_path: Path) -> None:
    text = (
        "polling:\n  rules:\n"
        "    - match: 'a://*'\n      interval_ms: 10\n"
        "    - match: 'b://*'\n      interval_ms: 500\n"
    )
    (warning,) = _warnings(tmp_path, text)
    assert warning.startswith("polling.rules[0].interval_ms is 10, below polling.min_interval_ms of 250")
    assert "URIs matching 'a://*' are polled every 250 ms" in warning


def test_intervals_within_the_bounds_warn_nobody(tmp_path: Path) -> None:
    text = (
        "polling:\n  default_interval_ms: 250\n  max_interval_ms: 250\n"
        "  rules:\n    - match: 'a://*'\n      interval_ms: 250\n"
    )
    assert _warnings(tmp_path, text) == []
