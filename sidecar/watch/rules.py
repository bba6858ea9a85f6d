"""`polling.rules` at work: which rule a URI falls under, and what of a read's contents counts as a change.

The client still reads the whole content: a rule changes only the fingerprint a watch compares (and its
interval), never what is served.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Any

import orjson

from sidecar.config.polling_rules import PollingRule

__all__ = ["NO_RULES", "Rule", "Rules", "glob_pattern"]

_RULE_CACHE = 4096
"""URIs whose rule is remembered (most recently used): a poll looks its rule up on every read."""


def glob_pattern(glob: str) -> re.Pattern[str]:
    """A glob in which `*` matches any run of characters (slashes included) and nothing else is special."""
    return re.compile(".*".join(re.escape(part) for part in glob.split("*")), re.DOTALL)


def _tokens(pointer: str) -> tuple[str, ...]:
    return tuple(token.replace("~1", "/").replace("~0", "~") for token in pointer.split("/")[1:])


def _remove(document: Any, tokens: tuple[str, ...]) -> None:
    """Remove what `tokens` point at, if it is there (a pointer to nothing removes nothing)."""
    parent = document
    for token in tokens[:-1]:
        if isinstance(parent, dict):
            parent = parent.get(token)
        elif isinstance(parent, list) and token.isdigit() and int(token) < len(parent):
            parent = parent[int(token)]
        else:
            return
    last = tokens[-1]
    if isinstance(parent, dict):
        parent.pop(last, None)
    elif isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        del parent[int(last)]


class Rule:
    """One rule, compiled: its interval and what it ignores."""

    def __init__(self, rule: PollingRule) -> None:
        self.match = rule.match
        self.interval_ms = rule.interval_ms
        self._pointers = [_tokens(pointer) for pointer in rule.ignore.json_pointers]
        self._patterns = [re.compile(pattern) for pattern in rule.ignore.patterns]

    @property
    def ignores(self) -> bool:
        return bool(self._pointers or self._patterns)

    def _without_pointers(self, value: Any) -> Any:
        copy = orjson.loads(orjson.dumps(value))  # never edit the answer a client may be served
        for tokens in self._pointers:
            _remove(copy, tokens)
        return copy

    def _text(self, text: str) -> str:
        if self._pointers:
            try:
                parsed = orjson.loads(text)
            except orjson.JSONDecodeError:
                pass
            else:
                text = orjson.dumps(self._without_pointers(parsed), option=orjson.OPT_SORT_KEYS).decode()
        for pattern in self._patterns:
            text = pattern.sub("", text)
        return text

    def significant(self, contents: Any) -> Any:
        """The part of a read's `contents` that counts as a change."""
        if not self.ignores or not isinstance(contents, list):
            return contents
        kept: list[Any] = []
        for item in contents:
            if not isinstance(item, dict):
                kept.append(item)
                continue
            copy = dict(item)
            for name, value in item.items():
                if name == "text" and isinstance(value, str):
                    copy[name] = self._text(value)
                elif isinstance(value, dict | list) and self._pointers:
                    copy[name] = self._without_pointers(value)  # structured content
            kept.append(copy)
        return kept


class Rules:
    """The configured rules in order; the first whose glob fits a URI is its rule."""

    def __init__(self, rules: Sequence[PollingRule] = ()) -> None:
        self._rules = [(glob_pattern(rule.match), Rule(rule)) for rule in rules]
        self.for_uri = functools.lru_cache(maxsize=_RULE_CACHE)(self._find)

    def __bool__(self) -> bool:
        return bool(self._rules)

    def _find(self, uri: str | None) -> Rule | None:
        if uri is None:
            return None
        for pattern, rule in self._rules:
            if pattern.fullmatch(uri):
                return rule
        return None


NO_RULES = Rules()
