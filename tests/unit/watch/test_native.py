"""The upstream's own notifications as hints (`sidecar.watch.native`), on the hand-moved clock against a scripted
upstream that can push: what each context's notification stream asks the upstream for, what it then covers (only
what the upstream honoured), the hints its notifications give, refiltering without a gap, reopening with
backoff, an upstream that cannot push, the stream limit, and the credential leaving with the last stream."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, cast

import pytest

from sidecar.changes import WatchKey, WatchKind
from sidecar.config import PollingConfig
from sidecar.identity import ANONYMOUS_IDENTITY, PUBLIC, Identity
from sidecar.observability.metrics import Metrics
from sidecar.protocol.errors import UpstreamError, UpstreamHTTPError, UpstreamRpcError, UpstreamUnavailable
from sidecar.upstream.answers import UpstreamInfo
from sidecar.upstream.base import Upstream
from sidecar.watch import native_stream
from sidecar.watch.native import NativeNotifications
from sidecar.watch.native_stream import NativeStream
from sidecar.watch.poller import Watch
from tests.unit.watch.manual_clock import ManualClock, settle
from tests.unit.watch.scripted_upstream import URL, ScriptedUpstream

JsonObject = dict[str, Any]
ALICE = Identity("alice", (("authorization", "Bearer a"),), client="alice-laptop")
BOB = Identity("bob", (("authorization", "Bearer b"),), client="bob-laptop")
DOC = "file:///doc"
OTHER = "file:///other"
ACKNOWLEDGED = "notifications/subscriptions/acknowledged"
UPDATED = "notifications/resources/updated"
EVERYTHING = {
    "resources": {"subscribe": True, "listChanged": True},
    "tools": {"listChanged": True},
    "prompts": {"listChanged": True},
}
DEBOUNCE_S = 0.05
"""The pause after a change of what a context watches before its stream is asked for again."""


@dataclass
class Opened:
    """One notification stream the upstream opened: for whom, what was asked, and the test's hold on it."""

    identity: Identity
    wanted: JsonObject
    queue: asyncio.Queue[JsonObject | BaseException | None] = field(default_factory=asyncio.Queue)
    closed: asyncio.Event = field(default_factory=asyncio.Event)

    def push(self, method: str, params: Any = None) -> None:
        self.queue.put_nowait({"method": method, "params": params} if params is not None else {"method": method})

    def end(self) -> None:
        """The upstream closes the stream."""
        self.queue.put_nowait(None)

    def fail(self, exc: BaseException) -> None:
        self.queue.put_nowait(exc)


def _acknowledge_all(wanted: JsonObject) -> JsonObject:
    return {"method": ACKNOWLEDGED, "params": {"notifications": wanted}}


class PushingUpstream(ScriptedUpstream):
    """The scripted upstream with notification streams the test opens, feeds, ends and refuses."""

    def __init__(self, era: str = "legacy", capabilities: JsonObject | None = None) -> None:
        super().__init__()
        self.info = UpstreamInfo(era, EVERYTHING if capabilities is None else capabilities, None, None)  # type: ignore[arg-type]
        self.opened: list[Opened] = []
        self.refusals: list[BaseException] = []
        self.closing_gate: asyncio.Event | None = None
        """While set and not yet open, closing a stream waits for it."""
        self.refused_uris: set[str] = set()
        """URIs `resources/subscribe` refuses."""
        """What the next attempts to open a stream raise, in order."""
        self.honour: Callable[[JsonObject], Any] = _acknowledge_all
        """A 2026-07-28 listen's first message, from its filter (`None`: the upstream sends none)."""

    async def call(self, method: str, params: JsonObject, identity: Identity) -> JsonObject:
        if method == "resources/subscribe" and params.get("uri") in self.refused_uris:
            self.calls.append((method, params["uri"], identity.context))
            raise UpstreamRpcError(URL, {"code": -32602, "message": "no such resource"})
        return await super().call(method, params, identity)

    @property
    def open(self) -> list[Opened]:
        return [opened for opened in self.opened if not opened.closed.is_set()]

    @contextlib.asynccontextmanager
    async def open_notifications(
        self, identity: Identity, wanted: JsonObject
    ) -> AsyncIterator[AsyncIterator[JsonObject]]:
        if self.refusals:
            raise self.refusals.pop(0)
        opened = Opened(identity, dict(wanted))
        self.opened.append(opened)
        if self.info.era == "modern":
            ack = self.honour(opened.wanted)
            if ack is not None:
                opened.queue.put_nowait(ack)

        async def messages() -> AsyncIterator[JsonObject]:
            while True:
                item = await opened.queue.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item

        try:
            yield messages()
        finally:
            try:
                if self.closing_gate is not None:
                    await self.closing_gate.wait()  # a stream slow to close (its connection lingers)
            finally:
                opened.closed.set()


class HeardWatch:
    """A watch as the notifications see it: the hints it got and whether they cover it."""

    def __init__(self, key: WatchKey) -> None:
        self.key = key
        self.native = False
        self.hints = 0

    def hint(self) -> None:
        self.hints += 1

    def set_native(self, native: bool) -> None:
        self.native = native


class FixedJitter:
    def __init__(self, value: float) -> None:
        self.value = value

    def random(self) -> float:
        return self.value


CONFIG = PollingConfig(max_native_streams=2)


@dataclass
class Bench:
    clock: ManualClock
    upstream: PushingUpstream
    metrics: Metrics
    native: NativeNotifications
    watches: dict[WatchKey, HeardWatch] = field(default_factory=dict)

    def watch(self, kind: WatchKind, uri: str | None, identity: Identity, *, public: bool = False) -> HeardWatch:
        """What the registry does for a stream's new interest: the watch (new or not) and the context's hold."""
        key = WatchKey(kind, uri, PUBLIC if public else identity.context)
        watch = self.watches.get(key)
        if watch is None:
            watch = self.watches[key] = HeardWatch(key)
            self.native.update(cast(Watch, watch))
        self.native.hold(identity, kind, uri)
        return watch

    def hints(self) -> dict[WatchKey, int]:
        return {key: watch.hints for key, watch in self.watches.items() if watch.hints}

    def covered(self) -> set[WatchKey]:
        return {key for key, watch in self.watches.items() if watch.native}

    def gauge(self, name: str, **labels: str) -> float | None:
        return self.metrics.registry.get_sample_value(name, labels)

    def clear_hints(self) -> None:
        for watch in self.watches.values():
            watch.hints = 0


def _bench(era: str = "legacy", capabilities: JsonObject | None = None, config: PollingConfig = CONFIG) -> Bench:
    clock = ManualClock()
    upstream = PushingUpstream(era, capabilities)
    metrics = Metrics()
    bench = Bench(clock, upstream, metrics, cast(NativeNotifications, None))
    bench.native = NativeNotifications(
        cast(Upstream, upstream), config, metrics, watch_of=lambda key: cast(Watch, bench.watches.get(key)), clock=clock
    )
    return bench


@pytest.fixture(autouse=True)
def _middle_jitter(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Backoff is its base exactly (the jitter's factor 0.5 + 0.5); tests that need another set their own."""
    monkeypatch.setattr(native_stream, "RETRY", replace(native_stream.RETRY, rand=FixedJitter(0.5).random))
    yield


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]


@pytest.fixture
async def legacy(caplog: pytest.LogCaptureFixture) -> AsyncIterator[Bench]:
    bench = _bench("legacy")
    yield bench
    await bench.native.aclose()
    assert _warnings(caplog) == [], "nothing failed unless the test asked for it"


@pytest.fixture
async def modern(caplog: pytest.LogCaptureFixture) -> AsyncIterator[Bench]:
    bench = _bench("modern")
    yield bench
    await bench.native.aclose()
    assert _warnings(caplog) == [], "nothing failed unless the test asked for it"


# -- 2025-11-25: the context's session stream, URIs subscribed one by one ----------------------------------------


async def test_a_legacy_upstream_gets_a_session_stream_and_one_subscription_per_uri_as_the_context(
    legacy: Bench,
) -> None:
    doc = legacy.watch("resource", DOC, ALICE)
    await settle()
    assert [(opened.identity, opened.wanted) for opened in legacy.upstream.opened] == [(ALICE, {})]
    assert legacy.upstream.calls == [("resources/subscribe", DOC, "alice")]
    assert doc.native and legacy.gauge("mcp_sidecar_native_watches") == 1
    assert legacy.gauge("mcp_sidecar_native_streams") == 1
    assert doc.hints == 1, "a newly covered key is polled once (a change before the subscription would wait)"


async def test_a_uri_the_upstream_refuses_to_subscribe_stays_polled_and_the_others_are_covered(
    legacy: Bench,
) -> None:
    legacy.upstream.errors["resources/subscribe"] = {"code": -32602, "message": "no such resource"}
    doc = legacy.watch("resource", DOC, ALICE)
    await settle()
    assert not doc.native and doc.hints == 0
    del legacy.upstream.errors["resources/subscribe"]
    other = legacy.watch("resource", OTHER, ALICE)
    await legacy.clock.advance(DEBOUNCE_S)
    assert [call for call in legacy.upstream.calls if call[1] == OTHER] == [("resources/subscribe", OTHER, "alice")]
    assert other.native
    assert doc.native, "asked again with the next change of what the context watches: honoured this time"
    assert len(legacy.upstream.opened) == 1, "one session stream throughout"


async def test_a_legacy_upstream_without_subscribe_covers_only_the_lists_it_announces() -> None:
    bench = _bench("legacy", {"resources": {"listChanged": True}, "tools": {"listChanged": True}, "prompts": {}})
    tools = bench.watch("tools_list", None, ALICE)
    prompts = bench.watch("prompts_list", None, ALICE)
    resources = bench.watch("resources_list", None, ALICE)
    doc = bench.watch("resource", DOC, ALICE)
    await settle()
    assert bench.covered() == {tools.key, resources.key}
    assert not prompts.native and not doc.native
    assert bench.upstream.calls == [], "no subscription where the upstream declares none"
    await bench.native.aclose()


async def test_dropping_a_uri_unsubscribes_it_upstream_and_uncovers_it(legacy: Bench) -> None:
    doc = legacy.watch("resource", DOC, ALICE)
    other = legacy.watch("resource", OTHER, ALICE)
    await settle()
    assert legacy.covered() == {doc.key, other.key}
    legacy.upstream.calls.clear()
    legacy.native.drop("alice", "resource", DOC)
    await legacy.clock.advance(DEBOUNCE_S)
    assert legacy.upstream.calls == [("resources/unsubscribe", DOC, "alice")]
    assert legacy.covered() == {other.key}
    assert legacy.gauge("mcp_sidecar_native_watches") == 1


async def test_one_uri_refused_does_not_keep_the_others_from_being_subscribed(legacy: Bench) -> None:
    legacy.upstream.refused_uris = {DOC}
    doc = legacy.watch("resource", DOC, ALICE)
    other = legacy.watch("resource", OTHER, ALICE)
    await settle()
    assert [call[1] for call in legacy.upstream.calls] == [DOC, OTHER]
    assert other.native and not doc.native


async def test_an_unsubscribe_the_upstream_fails_still_uncovers_the_uri(legacy: Bench) -> None:
    doc = legacy.watch("resource", DOC, ALICE)
    legacy.watch("resource", OTHER, ALICE)
    await settle()
    legacy.upstream.errors["resources/unsubscribe"] = {"code": -32603, "message": "boom"}
    legacy.native.drop("alice", "resource", DOC)
    await legacy.clock.advance(DEBOUNCE_S)
    assert not doc.native
    assert legacy.upstream.open, "the stream goes on"


# -- 2026-07-28: a listen per context, covering only what it acknowledged -------------------------------------


async def test_a_modern_upstream_gets_a_listen_with_the_contexts_filter(modern: Bench) -> None:
    modern.watch("resource", OTHER, ALICE)
    modern.watch("resource", DOC, ALICE)
    modern.watch("tools_list", None, ALICE)
    modern.watch("prompts_list", None, ALICE)
    modern.watch("resources_list", None, ALICE)
    await settle()
    assert modern.upstream.opened[0].identity == ALICE
    assert modern.upstream.opened[0].wanted == {
        "resourceSubscriptions": [DOC, OTHER],
        "toolsListChanged": True,
        "promptsListChanged": True,
        "resourcesListChanged": True,
    }
    assert len(modern.covered()) == 5
    assert modern.upstream.calls == [], "a listen subscribes through its filter, not with resources/subscribe"


async def test_the_filter_asks_only_for_what_the_upstream_declares() -> None:
    bench = _bench("modern", {"resources": {"subscribe": True}, "tools": {"listChanged": True}})
    bench.watch("resource", DOC, ALICE)
    bench.watch("tools_list", None, ALICE)
    await settle()
    bench.native.hold(ALICE, "prompts_list", None)  # the registry holds what the upstream cannot push: no effect
    await bench.clock.advance(DEBOUNCE_S)
    assert [opened.wanted for opened in bench.upstream.opened] == [
        {"resourceSubscriptions": [DOC], "toolsListChanged": True}
    ]
    await bench.native.aclose()


async def test_only_what_the_upstream_acknowledged_is_covered(modern: Bench) -> None:
    modern.upstream.honour = lambda wanted: {
        "method": ACKNOWLEDGED,
        "params": {"notifications": {"resourceSubscriptions": [DOC, 7], "toolsListChanged": "yes"}},
    }
    doc = modern.watch("resource", DOC, ALICE)
    other = modern.watch("resource", OTHER, ALICE)
    tools = modern.watch("tools_list", None, ALICE)
    await settle()
    assert modern.covered() == {doc.key}
    assert modern.hints() == {doc.key: 1}
    assert not other.native and not tools.native


@pytest.mark.parametrize(
    "first",
    [
        {"method": "notifications/message", "params": {"notifications": {"toolsListChanged": True}}},
        {"method": ACKNOWLEDGED},
        {"method": ACKNOWLEDGED, "params": ["notifications"]},
        {"method": ACKNOWLEDGED, "params": {"notifications": ["toolsListChanged"]}},
    ],
    ids=["not-an-ack", "no-params", "params-not-an-object", "notifications-not-an-object"],
)
async def test_a_first_message_that_is_no_acknowledgment_covers_nothing(modern: Bench, first: JsonObject) -> None:
    modern.upstream.honour = lambda wanted: first
    modern.watch("tools_list", None, ALICE)
    await settle()
    assert modern.upstream.open, "the listen stays open (its notifications still hint)"
    assert modern.covered() == set()
    assert modern.gauge("mcp_sidecar_native_streams") == 1


async def test_a_new_interest_opens_a_new_listen_before_the_old_one_closes(modern: Bench) -> None:
    modern.watch("resource", DOC, ALICE)
    await settle()
    first = modern.upstream.opened[0]
    modern.watch("resource", OTHER, ALICE)
    modern.watch("tools_list", None, ALICE)
    await settle()
    assert len(modern.upstream.opened) == 1, "a burst of interest waits out the debounce"
    await modern.clock.advance(DEBOUNCE_S / 2)
    assert len(modern.upstream.opened) == 1
    await modern.clock.advance(DEBOUNCE_S / 2)
    assert [opened.wanted for opened in modern.upstream.opened] == [
        {"resourceSubscriptions": [DOC]},
        {"resourceSubscriptions": [DOC, OTHER], "toolsListChanged": True},
    ], "one new listen for the whole burst"
    assert first.closed.is_set() and modern.upstream.open == [modern.upstream.opened[1]]
    assert modern.gauge("mcp_sidecar_native_streams") == 1, "still one stream for the context"
    assert len(modern.covered()) == 3


async def test_no_notification_falls_between_the_old_listen_and_the_new_one(modern: Bench) -> None:
    doc = modern.watch("resource", DOC, ALICE)
    await settle()
    first = modern.upstream.opened[0]
    gate = asyncio.Event()
    honour = modern.upstream.honour

    def late_ack(wanted: JsonObject) -> None:
        async def acknowledge() -> None:
            await gate.wait()
            modern.upstream.opened[-1].queue.put_nowait(honour(wanted))

        asyncio.get_running_loop().create_task(acknowledge())

    modern.upstream.honour = late_ack
    modern.watch("resource", OTHER, ALICE)
    await modern.clock.advance(DEBOUNCE_S)
    assert len(modern.upstream.opened) == 2 and not first.closed.is_set(), "the old listen waits for the new ack"
    doc.hints = 0
    first.push(UPDATED, {"uri": DOC})
    await settle()
    assert doc.hints == 1, "heard on the old listen while the new one is acknowledged"
    gate.set()
    await settle()
    assert first.closed.is_set()


async def test_a_listen_without_acknowledgment_is_given_up_and_opened_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bench = _bench("modern")
    bench.upstream.honour = lambda wanted: None
    bench.watch("resource", DOC, ALICE)
    await settle()
    assert len(bench.upstream.opened) == 1
    caplog.set_level(logging.INFO, logger="sidecar.watch.native")
    await bench.clock.advance(9.9)
    assert bench.upstream.open, "waits ten seconds for the acknowledgment"
    await bench.clock.advance(0.1)
    assert bench.upstream.open == [] and bench.covered() == set()
    assert bench.gauge("mcp_sidecar_native_streams") == 0, "a stream never acknowledged was never open"
    assert [(r.getMessage(), getattr(r, "reason", None)) for r in caplog.records] == [
        ("upstream notification stream failed", "no acknowledgment within 10 s")
    ]
    bench.upstream.honour = _acknowledge_all
    await bench.clock.advance(0.5)
    assert len(bench.upstream.opened) == 2 and bench.covered() == {WatchKey("resource", DOC, "alice")}
    await bench.native.aclose()
    assert _warnings(caplog) == []


async def test_a_listen_that_ends_before_its_acknowledgment_is_opened_again(modern: Bench) -> None:
    modern.upstream.honour = lambda wanted: None
    modern.watch("resource", DOC, ALICE)
    await settle()
    modern.upstream.opened[0].end()
    await settle()
    assert modern.upstream.open == []
    modern.upstream.honour = _acknowledge_all
    await modern.clock.advance(0.5)
    assert len(modern.upstream.open) == 1 and len(modern.covered()) == 1


async def test_a_context_that_stops_watching_what_the_upstream_can_push_closes_its_listen(modern: Bench) -> None:
    modern.watch("resource", DOC, ALICE)
    modern.watch("tools_list", None, ALICE)
    await settle()
    modern.native.drop("alice", "resource", DOC)
    await modern.clock.advance(DEBOUNCE_S)
    assert [opened.wanted for opened in modern.upstream.open] == [{"toolsListChanged": True}]
    modern.native.drop("alice", "tools_list", None)
    await settle()
    assert modern.upstream.open == [] and modern.covered() == set()
    assert modern.gauge("mcp_sidecar_native_streams") == 0


# -- what the notifications hint ------------------------------------------------------------------------------


async def test_a_resource_update_hints_that_contexts_watch_and_the_public_one(legacy: Bench) -> None:
    own = legacy.watch("resource", DOC, ALICE)
    public = legacy.watch("resource", DOC, ALICE, public=True)
    bobs = legacy.watch("resource", DOC, BOB)
    await settle()
    legacy.clear_hints()
    alices = next(opened for opened in legacy.upstream.opened if opened.identity == ALICE)
    alices.push(UPDATED, {"uri": DOC})
    await settle()
    assert legacy.hints() == {own.key: 1, public.key: 1}, "not bob's: his stream says what he sees"
    assert bobs.hints == 0
    assert legacy.gauge("mcp_sidecar_upstream_notifications_total", method=UPDATED) == 1


@pytest.mark.parametrize(
    "method",
    ["notifications/tools/list_changed", "notifications/prompts/list_changed", "notifications/resources/list_changed"],
)
async def test_a_list_changed_hints_that_list(legacy: Bench, method: str) -> None:
    lists = {kind: legacy.watch(kind, None, ALICE) for kind in ("tools_list", "prompts_list", "resources_list")}
    await settle()
    legacy.clear_hints()
    legacy.upstream.opened[0].push(method)
    await settle()
    kind = cast(WatchKind, method.split("/")[1] + "_list")
    assert legacy.hints() == {lists[kind].key: 1}
    assert legacy.gauge("mcp_sidecar_upstream_notifications_total", method=method) == 1


@pytest.mark.parametrize(
    "message",
    [
        {"method": UPDATED, "params": {"uri": 7}},
        {"method": UPDATED, "params": {}},
        {"method": UPDATED, "params": [DOC]},
        {"method": UPDATED},
        {"method": "notifications/message", "params": {"uri": DOC}},
        {"params": {"uri": DOC}},
    ],
    ids=["uri-not-a-string", "no-uri", "params-not-an-object", "no-params", "another-method", "no-method"],
)
async def test_a_notification_that_names_no_change_hints_nothing(legacy: Bench, message: JsonObject) -> None:
    doc = legacy.watch("resource", DOC, ALICE)
    await settle()
    doc.hints = 0
    legacy.upstream.opened[0].queue.put_nowait(message)
    legacy.upstream.opened[0].push(UPDATED, {"uri": OTHER})  # an update of a key nobody here watches
    await settle()
    assert doc.hints == 0
    assert legacy.upstream.open, "the stream goes on"
    counted = legacy.gauge("mcp_sidecar_upstream_notifications_total", method=UPDATED)
    assert counted == 1, "only the well-formed update is counted"


# -- a stream that breaks ---------------------------------------------------------------------------------------


async def test_a_broken_stream_uncovers_its_keys_and_reopens_after_half_a_second(
    legacy: Bench, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sidecar.watch.native")
    doc = legacy.watch("resource", DOC, ALICE)
    await settle()
    legacy.upstream.opened[0].fail(UpstreamUnavailable(URL, "connection reset"))
    await settle()
    assert not doc.native, "uncovered: polled at its usual pace until the stream is back"
    assert legacy.gauge("mcp_sidecar_native_watches") == 0
    assert legacy.gauge("mcp_sidecar_native_streams") == 0
    await legacy.clock.advance(0.49)
    assert len(legacy.upstream.opened) == 1
    doc.hints = 0
    await legacy.clock.advance(0.01)
    assert len(legacy.upstream.opened) == 2 and doc.native and legacy.gauge("mcp_sidecar_native_streams") == 1
    assert doc.hints == 1, "covered again: polled once for what changed while it was not"
    assert [record.getMessage() for record in caplog.records] == ["upstream notification stream failed"]


async def test_a_stream_the_upstream_ends_is_opened_again(legacy: Bench, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="sidecar.watch.native")
    doc = legacy.watch("resource", DOC, ALICE)
    await settle()
    legacy.upstream.opened[0].end()
    await settle()
    assert [(r.getMessage(), getattr(r, "reason", None)) for r in caplog.records] == [
        ("upstream notification stream failed", "the notification stream ended")
    ]
    assert not doc.native and legacy.upstream.open == []
    await legacy.clock.advance(0.5)
    assert len(legacy.upstream.open) == 1 and doc.native


async def test_repeated_failures_back_off_doubling_to_half_a_minute_and_log_once_a_streak(
    legacy: Bench, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sidecar.watch.native")
    refusal = UpstreamUnavailable(URL, "connection refused")
    legacy.upstream.refusals = [refusal] * 10
    legacy.watch("resource", DOC, ALICE)
    await settle()
    waits = []
    for _ in range(9):
        before = legacy.clock.now()
        left = len(legacy.upstream.refusals)
        while len(legacy.upstream.refusals) == left:
            legacy.clock.fire_next()
            await settle()
        waits.append(legacy.clock.now() - before)
    assert waits == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert [record.getMessage() for record in caplog.records] == ["upstream notification stream failed"]
    await legacy.clock.advance(30.0)
    assert len(legacy.upstream.open) == 1
    legacy.upstream.open[0].fail(refusal)  # at once: an upstream that accepts the stream, then drops it
    await settle()
    await legacy.clock.advance(29.99)
    assert legacy.upstream.open == [], "a stream up a moment goes on with its streak's backoff"
    await legacy.clock.advance(0.01)
    assert len(legacy.upstream.open) == 1
    await legacy.clock.advance(30.0)
    legacy.upstream.open[0].fail(refusal)  # after half a minute up
    await settle()
    await legacy.clock.advance(0.5)
    assert len(legacy.upstream.open) == 1, "a stream that stayed up starts a new streak"
    assert [record.getMessage() for record in caplog.records] == ["upstream notification stream failed"] * 2


@pytest.mark.parametrize(("jitter", "first_wait"), [(0.0, 0.25), (0.999, 0.7495)])
async def test_the_backoff_is_jittered_between_half_and_one_and_a_half_times(
    legacy: Bench, monkeypatch: pytest.MonkeyPatch, jitter: float, first_wait: float
) -> None:
    monkeypatch.setattr(native_stream, "RETRY", replace(native_stream.RETRY, rand=FixedJitter(jitter).random))
    legacy.upstream.refusals = [UpstreamUnavailable(URL, "connection refused")]
    legacy.watch("resource", DOC, ALICE)
    await settle()
    assert legacy.upstream.opened == []
    legacy.clock.fire_next()
    await settle()
    assert legacy.clock.now() == pytest.approx(first_wait)
    assert len(legacy.upstream.opened) == 1


async def test_a_crash_in_the_stream_is_logged_and_polling_goes_on(
    legacy: Bench, caplog: pytest.LogCaptureFixture
) -> None:
    doc = legacy.watch("resource", DOC, ALICE)
    await settle()
    legacy.upstream.opened[0].fail(RuntimeError("a bug"))
    await settle()
    records = [record for record in caplog.records if record.levelno >= logging.WARNING]
    assert [record.getMessage() for record in records] == ["upstream notification stream crashed"]
    assert records[0].exc_info is not None
    assert not doc.native
    await legacy.clock.advance(0.5)
    assert doc.native, "tried again like any failure"
    caplog.clear()


async def test_crashes_back_off_like_failures_and_a_stream_that_stayed_up_starts_a_new_streak(
    legacy: Bench, caplog: pytest.LogCaptureFixture
) -> None:
    legacy.upstream.refusals = [RuntimeError("a bug"), RuntimeError("a bug")]
    doc = legacy.watch("resource", DOC, ALICE)
    await settle()
    await legacy.clock.advance(0.5)
    assert legacy.upstream.opened == [], "the second crash"
    await legacy.clock.advance(0.99)
    assert legacy.upstream.opened == [], "waits twice as long after the second"
    await legacy.clock.advance(0.01)
    assert doc.native
    await legacy.clock.advance(30.0)
    legacy.upstream.opened[0].fail(RuntimeError("a bug"))
    await settle()
    await legacy.clock.advance(0.5)
    assert doc.native, "back after half a second: the stream had stayed up"
    assert [r.getMessage() for r in caplog.records] == ["upstream notification stream crashed"] * 3
    caplog.clear()


@pytest.mark.parametrize(
    "refusal",
    [
        UpstreamHTTPError(URL, 405, "Method Not Allowed"),
        UpstreamHTTPError(URL, 404, "Not Found"),
        UpstreamRpcError(URL, {"code": -32601, "message": "Method not found"}),
    ],
    ids=["no-get-stream-405", "no-listen-404", "no-listen-method"],
)
async def test_an_upstream_that_serves_no_stream_is_asked_once_and_then_only_polled(
    legacy: Bench, refusal: UpstreamError, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sidecar.watch.native")
    legacy.upstream.refusals = [refusal]
    doc = legacy.watch("resource", DOC, ALICE)
    await settle()
    assert not doc.native and legacy.native.unsupported
    assert [(r.getMessage(), getattr(r, "reason", None)) for r in caplog.records][-1] == (
        "the upstream serves no notification stream; polling only",
        refusal.reason,
    )
    legacy.watch("resource", OTHER, BOB)
    legacy.watch("tools_list", None, ALICE)
    await legacy.clock.advance(60.0)
    assert legacy.upstream.opened == [], "never asked again"
    assert legacy.covered() == set()


@pytest.mark.parametrize(
    "refusal",
    [
        UpstreamHTTPError(URL, 500, "Internal Server Error"),
        UpstreamHTTPError(URL, 403, "Forbidden"),
        UpstreamRpcError(URL, {"code": -32603, "message": "Internal error"}),
    ],
    ids=["500", "403", "internal-error"],
)
async def test_other_refusals_are_tried_again(legacy: Bench, refusal: UpstreamError) -> None:
    legacy.upstream.refusals = [refusal]
    doc = legacy.watch("resource", DOC, ALICE)
    await settle()
    assert not legacy.native.unsupported
    await legacy.clock.advance(0.5)
    assert doc.native


# -- streams and their limit --------------------------------------------------------------------------------------


async def test_each_context_has_its_own_stream_up_to_the_limit(legacy: Bench) -> None:
    carol = Identity("carol", (("authorization", "Bearer c"),), client="carol-laptop")
    legacy.watch("resource", DOC, ALICE)
    legacy.watch("resource", DOC, BOB)
    over = legacy.watch("resource", DOC, carol)
    await settle()
    assert [opened.identity.context for opened in legacy.upstream.opened] == ["alice", "bob"]
    assert not over.native, "over max_native_streams: polled only"
    assert legacy.gauge("mcp_sidecar_limit_rejections_total", limit="native_streams") == 1
    legacy.native.drop("carol", "resource", DOC)  # what was never held is not dropped
    legacy.native.drop("bob", "resource", DOC)
    await settle()
    again = legacy.watch("resource", OTHER, carol)
    await settle()
    assert [opened.identity.context for opened in legacy.upstream.open] == ["alice", "carol"]
    assert again.native


async def test_a_stream_lasts_while_any_stream_of_its_context_holds_a_key(legacy: Bench) -> None:
    legacy.watch("resource", DOC, ALICE)
    legacy.watch("resource", DOC, ALICE)  # a second client stream of the same context, same URI
    legacy.watch("tools_list", None, ALICE)
    legacy.watch("tools_list", None, ALICE)
    await settle()
    legacy.native.drop("alice", "resource", DOC)
    legacy.native.drop("alice", "tools_list", None)
    await legacy.clock.advance(DEBOUNCE_S)
    assert legacy.covered() == {WatchKey("resource", DOC, "alice"), WatchKey("tools_list", None, "alice")}
    assert [call[0] for call in legacy.upstream.calls] == ["resources/subscribe"]
    legacy.native.drop("alice", "resource", DOC)
    await legacy.clock.advance(DEBOUNCE_S)
    assert legacy.upstream.open, "the tool list still held"
    legacy.native.drop("alice", "resource", OTHER)  # never held
    legacy.native.drop("bob", "tools_list", None)  # no stream
    legacy.native.drop("alice", "tools_list", None)
    await settle()
    assert legacy.upstream.open == [], "the credential leaves memory with the context's last hold"
    assert legacy.gauge("mcp_sidecar_native_streams") == 0
    legacy.watch("resource", DOC, ALICE)
    await settle()
    assert len(legacy.upstream.open) == 1, "a context back later gets a new stream"


async def test_a_context_watching_again_while_its_last_stream_closes_gets_a_stream_of_its_own(
    modern: Bench,
) -> None:
    doc = modern.watch("resource", DOC, ALICE)
    await settle()
    modern.native.drop("alice", "resource", DOC)
    modern.native.hold(ALICE, "resource", DOC)  # before the closing stream's task has run
    await settle()
    assert [opened.closed.is_set() for opened in modern.upstream.opened] == [True, False]
    assert doc.native and modern.gauge("mcp_sidecar_native_streams") == 1
    modern.upstream.open[0].push(UPDATED, {"uri": DOC})
    doc.hints = 0
    await settle()
    assert doc.hints == 1


async def test_a_public_key_is_covered_by_any_contexts_stream(legacy: Bench) -> None:
    public = legacy.watch("resource", DOC, ALICE, public=True)
    await settle()
    assert public.native
    assert legacy.native.covers("resource", DOC, PUBLIC)
    assert not legacy.native.covers("resource", OTHER, PUBLIC)
    assert not legacy.native.covers("resource", DOC, "bob"), "a private key only by its own context's stream"
    anonymous = legacy.watch("tools_list", None, ANONYMOUS_IDENTITY, public=True)
    await settle()
    assert anonymous.native and legacy.native.covers("tools_list", None, PUBLIC)


async def test_nothing_is_held_when_native_notifications_are_off() -> None:
    bench = _bench("legacy", config=PollingConfig(native_notifications=False))
    doc = bench.watch("resource", DOC, ALICE)
    await settle()
    assert bench.upstream.opened == [] and not doc.native
    await bench.native.aclose()


async def test_nothing_is_held_before_the_upstream_is_known() -> None:
    bench = _bench("legacy")
    bench.upstream.info = None
    doc = bench.watch("resource", DOC, ALICE)
    await settle()
    assert bench.upstream.opened == [] and not doc.native
    await bench.native.aclose()


async def test_a_watch_that_ends_leaves_the_count_of_native_watches(legacy: Bench) -> None:
    doc = legacy.watch("resource", DOC, ALICE)
    other = legacy.watch("resource", OTHER, ALICE)
    legacy.native.drop("alice", "resource", OTHER)
    await settle()
    assert legacy.gauge("mcp_sidecar_native_watches") == 1
    legacy.native.forget(cast(Watch, other))
    assert legacy.gauge("mcp_sidecar_native_watches") == 1, "an uncovered watch was not counted"
    legacy.native.forget(cast(Watch, doc))
    assert legacy.gauge("mcp_sidecar_native_watches") == 0


async def test_shutdown_closes_every_stream() -> None:
    bench = _bench("modern")
    bench.watch("resource", DOC, ALICE)
    bench.watch("resource", DOC, BOB)
    await settle()
    assert len(bench.upstream.open) == 2
    await bench.native.aclose()
    assert bench.upstream.open == []
    assert bench.gauge("mcp_sidecar_native_streams") == 0
    bench.native.drop("alice", "resource", DOC)  # a release after shutdown is harmless


async def _streams_in_memory(bench: Bench) -> int:
    """The bench's notification streams still in memory, each keeping its context's credential."""
    for _ in range(3):  # the loop's last callbacks of an ended task let go of it
        await asyncio.sleep(0)
    gc.collect()
    return sum(isinstance(thing, NativeStream) and thing.owner is bench.native for thing in gc.get_objects())


async def test_no_credential_stays_in_memory_after_a_contexts_last_drop(legacy: Bench) -> None:
    legacy.watch("resource", DOC, ALICE)
    legacy.watch("tools_list", None, BOB)
    await settle()
    assert await _streams_in_memory(legacy) == 2
    legacy.native.drop("alice", "resource", DOC)
    await settle()
    assert await _streams_in_memory(legacy) == 1
    legacy.native.drop("bob", "tools_list", None)
    await settle()
    assert await _streams_in_memory(legacy) == 0


async def test_no_credential_stays_in_memory_once_the_upstream_refused_its_stream(legacy: Bench) -> None:
    legacy.upstream.refusals = [UpstreamHTTPError(URL, 405, "Method Not Allowed")] * 2
    legacy.watch("resource", DOC, ALICE)
    legacy.watch("resource", DOC, BOB)
    await settle()
    assert legacy.native.unsupported
    assert await _streams_in_memory(legacy) == 0


async def test_a_listen_acknowledged_then_ended_again_and_again_backs_off(modern: Bench) -> None:
    doc = modern.watch("resource", DOC, ALICE)
    await settle()
    waits = []
    for _ in range(4):
        modern.upstream.open[0].end()
        await settle()
        before = modern.clock.now()
        while not modern.upstream.open:
            modern.clock.fire_next()
            await settle()
        waits.append(modern.clock.now() - before)
    assert waits == [0.5, 1.0, 2.0, 4.0], "not a reconnect every half second"
    assert doc.native


async def test_shutdown_waits_for_a_dropped_stream_still_closing() -> None:
    bench = _bench("modern")
    bench.watch("resource", DOC, ALICE)
    await settle()
    bench.upstream.closing_gate = asyncio.Event()
    bench.native.drop("alice", "resource", DOC)
    await settle()  # its task is closing the stream, slowly
    await bench.native.aclose()
    streams = [task for task in asyncio.all_tasks() if "NativeNotifications._run" in repr(task.get_coro())]
    assert [task for task in streams if not task.done()] == [], "no stream's task outlives shutdown"
    assert bench.upstream.open == []
    bench.upstream.closing_gate.set()


async def test_shutdown_while_the_old_listen_closes_closes_the_new_one_too() -> None:
    bench = _bench("modern")
    bench.watch("resource", DOC, ALICE)
    await settle()
    bench.upstream.closing_gate = asyncio.Event()
    bench.watch("resource", OTHER, ALICE)
    await bench.clock.advance(DEBOUNCE_S)
    assert len(bench.upstream.opened) == 2, "the new listen is acknowledged; the old one is closing"
    closing = asyncio.create_task(bench.native.aclose())
    await settle()
    bench.upstream.closing_gate.set()
    await closing
    assert bench.upstream.open == [], "neither listen (nor its credential) is left open"
