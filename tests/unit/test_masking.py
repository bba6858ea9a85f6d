"""The one masking rule (`sidecar.masking`): a stdio command's credentials masked by shape, the program and its other
arguments kept; the configuration's credential values scrubbed from any text, a log line still valid JSON."""

from __future__ import annotations

import io
import json
import logging

import pytest

from sidecar.config import SidecarConfig
from sidecar.config.shown import secrets_in, shown_config
from sidecar.masking import remember_secrets, scrub, shown_upstream
from sidecar.observability.logs import configure_logging


@pytest.mark.parametrize(
    ("command", "shown"),
    [
        (
            ["npx", "-y", "@modelcontextprotocol/server-postgres", "postgresql://app:hunter2@db/shop"],
            "npx -y @modelcontextprotocol/server-postgres postgresql://app:***@db/shop",
        ),
        (
            ["server", "--url=https://api.example/v1?api_key=hunter2&region=eu"],
            "server '--url=https://api.example/v1?api_key=***&region=eu'",
        ),
        (["server", "--api-key", "hunter2", "--root", "/srv"], "server --api-key *** --root /srv"),
        (["server", "--password=hunter2", "--key", "tls.key"], "server --password=*** --key tls.key"),
        (["env", "GITHUB_TOKEN=hunter2", "server"], "env GITHUB_TOKEN=*** server"),
        (["uvx", "mcp-server-sqlite", "--db-path", "/srv/test.db"], "uvx mcp-server-sqlite --db-path /srv/test.db"),
    ],
)
def test_a_command_keeps_its_program_and_plain_arguments_and_masks_its_credentials(
    command: list[str], shown: str
) -> None:
    assert shown_upstream("", command) == "stdio: " + shown
    config = SidecarConfig.model_validate({"upstream": {"command": command}})
    assert "hunter2" not in str(shown_config(config)) and "hunter2" not in config.upstream.display_url


def test_every_credential_value_the_configuration_holds_is_scrubbed_from_any_text() -> None:
    config = SidecarConfig.model_validate(
        {
            "upstream": {
                "command": ["server", "postgresql://app:pg%2Fsecret@db/shop", "--token", "arg-token-1"],
                "env": {"API_KEY": "env-value-1"},
            },
            "bus": {"backend": "redis", "redis_url": "redis://:bus-secret-1@db:6379/0"},
        }
    )
    found = secrets_in(config)
    assert {"pg%2Fsecret", "pg/secret", "arg-token-1", "env-value-1", "bus-secret-1"} <= found
    remember_secrets(found)
    line = 'connecting to db as app with pg/secret; {"token": "arg-token-1", "env": "env-value-1"} port 5432'
    assert scrub(line) == 'connecting to db as app with ***; {"token": "***", "env": "***"} port 5432'


def test_a_header_value_and_the_token_inside_it_are_both_scrubbed() -> None:
    config = SidecarConfig.model_validate(
        {
            "upstream": {
                "url": "https://mcp.example/mcp?key=q-secret-1",
                "headers": {"authorization": "Bearer hdr-tok-1"},
            }
        }
    )
    remember_secrets(secrets_in(config))
    assert scrub("sent Bearer hdr-tok-1, then hdr-tok-1 alone, and q-secret-1") == "sent ***, then *** alone, and ***"


def test_a_url_in_any_text_has_its_password_masked_by_shape_and_a_short_value_is_left_alone() -> None:
    config = SidecarConfig.model_validate({"upstream": {"command": ["server"], "env": {"DEBUG": "true"}}})
    remember_secrets(secrets_in(config))
    text = "Traceback: could not connect to postgresql://app:s3cr@db/shop; debug is true"
    assert scrub(text) == "Traceback: could not connect to postgresql://app:***@db/shop; debug is true"


def test_a_json_log_line_is_scrubbed_and_stays_one_valid_json_line(monkeypatch: pytest.MonkeyPatch) -> None:
    remember_secrets({"json-line-secret-1"})
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        configure_logging("info", "json")
        logging.getLogger("sidecar.test").warning(
            'said "json-line-secret-1"', extra={"nested": {"args": ["x", "json-line-secret-1"]}, "n": 3}
        )
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    (line,) = stream.getvalue().splitlines()
    entry = json.loads(line)
    assert entry["msg"] == 'said "***"' and entry["nested"] == {"args": ["x", "***"]} and entry["n"] == 3
