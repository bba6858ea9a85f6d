"""The configuration as shown (check-config, the start-up log line): secrets masked, nothing else."""

from __future__ import annotations

import pytest

from sidecar.config import SidecarConfig
from sidecar.config.shown import masked_url, shown_config


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("redis://:hunter2@db:6379/0", "redis://:***@db:6379/0"),
        ("rediss://app:hunter2@db:6380", "rediss://app:***@db:6380"),
        ("redis://app@db:6379", "redis://app@db:6379"),  # an ACL user's name, no password: nothing secret
        ("redis+cluster://app:hunter2@a:7000,b:7001/0", "redis+cluster://app:***@a:7000,b:7001/0"),
        ("unix:///run/redis.sock?db=1&password=hunter2", "unix:///run/redis.sock?db=1&password=***"),
        ("redis://db?password=hunter2", "redis://db?password=***"),
        ("https://ghp_t0ken@mcp.example/mcp", "https://***@mcp.example/mcp"),
        ("https://user:hunter2@[::1]:8443/mcp", "https://***@[::1]:8443/mcp"),  # an HTTP userinfo is all credential
        ("https://ghp_t0ken:x-oauth-basic@mcp.example/mcp", "https://***@mcp.example/mcp"),
        ("postgresql://app:hunter2@db:5432/shop", "postgresql://app:***@db:5432/shop"),
        (
            "https://mcp.example/mcp?access_token=hunter2&apiKey=k&q=1",
            "https://mcp.example/mcp?access_token=***&apiKey=***&q=1",
        ),
        ("https://mcp.example/mcp?api_key=hunter2&region=eu#x", "https://mcp.example/mcp?api_key=***&region=eu#x"),
        ("not a url", "not a url"),
    ],
)
def test_masked_url_hides_a_password_and_credential_parameters_only(url: str, shown: str) -> None:
    assert masked_url(url) == shown


def test_shown_config_masks_header_and_env_values_and_url_passwords() -> None:
    config = SidecarConfig.model_validate(
        {
            "upstream": {"url": "https://u:hunter2@mcp.example/mcp", "headers": {"x-api-key": "k3y"}},
            "bus": {"backend": "redis", "redis_url": "redis://db:6379/0"},
        }
    )
    shown = shown_config(config)
    assert shown["upstream"]["url"] == "https://***@mcp.example/mcp"
    assert shown["upstream"]["headers"] == {"x-api-key": "**********"}
    assert shown["bus"]["redis_url"] == "redis://db:6379/0"
    assert "hunter2" not in str(shown) and "k3y" not in str(shown)
