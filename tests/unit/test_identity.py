"""Authorization contexts and fair-share clients as `IdentityRule` derives them from a request's headers
(invariants 18 and 20), on their own: headers in, an identity out."""

from __future__ import annotations

import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from sidecar.identity import ANONYMOUS, ANONYMOUS_IDENTITY, Identity, IdentityRule
from sidecar.protocol.errors import InvalidRequest

KEY = b"k" * 32


def _rule(non_identity: tuple[str, ...] = ("X-Trace",)) -> IdentityRule:
    rule = IdentityRule(["Authorization", "X-Tenant", "X-Trace", "authorization"], non_identity)
    rule.use_key(KEY)
    return rule


def _multi(*pairs: tuple[str, str]) -> CIMultiDictProxy[str]:
    return CIMultiDictProxy(CIMultiDict(pairs))


def test_forwarded_names_are_lower_case_once_each_and_identity_names_sorted_without_the_non_identifying() -> None:
    rule = _rule()
    assert rule.forward_headers == ("authorization", "x-tenant", "x-trace")
    assert rule.identity_headers == ("authorization", "x-tenant")
    assert IdentityRule(["A"], ["a"]).identity_headers == (), "non-identifying names compare case-insensitively"


@pytest.mark.invariant(18)
def test_a_context_is_a_keyed_hash_of_every_identity_header_the_same_in_every_release() -> None:
    identity = _rule().of({"Authorization": "Bearer a", "x-tenant": "t1", "X-Trace": "1"})
    # Replicas of different releases share the key from Redis: the same credential must name the same context.
    assert identity.context == "ctx-c18c098bf132ddd9162b"
    assert identity.headers == (("authorization", "Bearer a"), ("x-tenant", "t1"))
    assert identity.client == identity.context and identity.lane == ""
    assert identity.as_headers() == {"authorization": "Bearer a", "x-tenant": "t1"}
    assert not identity.is_anonymous


@pytest.mark.invariant(18)
def test_contexts_differ_by_any_identity_header_and_not_by_a_non_identifying_one() -> None:
    rule = _rule()
    base = rule.of({"Authorization": "Bearer a", "X-Tenant": "t1", "X-Trace": "1"})
    assert rule.of({"Authorization": "Bearer a", "X-Tenant": "t1", "X-Trace": "2"}) == base
    assert rule.of({"Authorization": "Bearer a", "X-Tenant": "t2"}) != base
    assert rule.of({"Authorization": "Bearer b", "X-Tenant": "t1"}) != base
    assert rule.of({"Authorization": "Bearer a"}) != base
    # Names are hashed with values: the same value under another identity header is another context.
    assert rule.of({"X-Tenant": "Bearer a"}).context != rule.of({"Authorization": "Bearer a"}).context
    # Each header is delimited: moving a character across the boundary of name and value is another context.
    assert rule.identity((("ab", "c"),)).context != rule.identity((("a", "bc"),)).context


def test_a_header_value_that_is_not_valid_utf8_still_names_a_context() -> None:
    rule = _rule()
    # aiohttp hands over undecodable header bytes as surrogate escapes: they name a context like any other bytes.
    assert rule.of({"Authorization": "Bearer \udcff"}).context == "ctx-d1d13b75beb5d2291d7b"


def test_the_key_names_the_context_so_a_shared_key_gives_one_context_cluster_wide() -> None:
    one, two, unshared = _rule(), _rule(), IdentityRule(["Authorization"], [])
    headers = {"Authorization": "Bearer a"}
    assert one.of(headers) == two.of(headers)
    assert unshared.of(headers) != one.of(headers)
    assert unshared.of(headers).context.startswith("ctx-") and len(unshared.of(headers).context) == 24
    assert IdentityRule(["Authorization"], []).of(headers) != unshared.of(headers), "each replica's own key"


@pytest.mark.invariant(18)
def test_an_identity_header_given_twice_is_refused_naming_it() -> None:
    rule = _rule()
    for headers in (
        _multi(("Authorization", "Bearer a"), ("authorization", "Bearer b")),
        _multi(("X-Tenant", "t1"), ("X-Tenant", "t1")),
    ):
        with pytest.raises(InvalidRequest) as refused:
            rule.of(headers)
        assert refused.value.status == 400
    assert str(refused.value) == "the x-tenant header appears more than once"
    twice_trace = _multi(("Authorization", "Bearer a"), ("X-Trace", "1"), ("X-Trace", "2"))
    assert rule.of(twice_trace) == rule.of({"Authorization": "Bearer a"}), "a non-identifying header may repeat"


def test_multidict_and_plain_headers_name_the_same_context() -> None:
    rule = _rule()
    assert rule.of(_multi(("AUTHORIZATION", "Bearer a"))) == rule.of({"authorization": "Bearer a"})
    assert rule.of(CIMultiDict([("Authorization", "Bearer a")])) == rule.of({"Authorization": "Bearer a"})


@pytest.mark.invariant(20)
def test_an_anonymous_request_counts_against_its_address_and_one_with_a_credential_against_its_context() -> None:
    rule = _rule()
    anonymous = rule.of({"X-Trace": "1"}, address="10.0.0.1")
    assert (anonymous.context, anonymous.client, anonymous.headers) == (ANONYMOUS, "addr-10.0.0.1", ())
    assert anonymous.is_anonymous and anonymous == ANONYMOUS_IDENTITY, "one context for every anonymous client"
    assert rule.of({}) is ANONYMOUS_IDENTITY and ANONYMOUS_IDENTITY.client == ANONYMOUS
    credential = rule.of({"Authorization": "Bearer a"}, address="10.0.0.1")
    assert credential.client == credential.context != "addr-10.0.0.1"
    assert rule.identity(()) is ANONYMOUS_IDENTITY


def test_forwarded_headers_are_the_allowlisted_ones_first_value_each_and_nothing_else() -> None:
    rule = _rule()
    headers = _multi(("Authorization", "Bearer a"), ("X-Trace", "1"), ("x-trace", "2"), ("Host", "h"), ("Cookie", "c"))
    assert rule.forwarded(headers) == {"authorization": "Bearer a", "x-trace": "1"}
    assert rule.forwarded({"X-TENANT": "t", "Cookie": "c"}) == {"x-tenant": "t"}
    assert rule.forwarded({}) == {}


def test_a_credential_never_reaches_a_log_through_a_repr() -> None:
    identity = _rule().of({"Authorization": "Bearer secret"})
    assert repr(identity) == f"Identity({identity.context!r})"
    assert "secret" not in repr(identity) and "secret" not in str(identity)
    assert Identity("c", (("a", "b"),), client="x", lane="y") == Identity("c", (("a", "b"),)), "client, lane apart"
