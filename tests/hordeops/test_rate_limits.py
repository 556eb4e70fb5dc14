"""Every route but the worker routes is rate-limited per API key and per client address, and the
worker routes' bad keys per address (hordeops.ratelimit)."""

import ipaddress
import threading
import time

import pytest
from django.db import connections
from django_redis import get_redis_connection
from rest_framework.test import APIClient

from hordeops import ratelimit

ASYNC = "/api/v2/generate/text/async"


@pytest.fixture(autouse=True)
def _limits(settings):
    settings.KEY_RATE_PER_SECOND = 1
    settings.KEY_RATE_BURST = 3
    settings.ADDRESS_RATE_PER_SECOND = 1
    settings.ADDRESS_RATE_BURST = 5
    settings.TRUSTED_PROXIES = ()
    settings.ACCOUNT_MAX_WAITING_REQUESTS = 100
    client = get_redis_connection("default")
    for key in client.scan_iter("hordeops:rate:*"):
        client.delete(key)


@pytest.fixture
def served(owner):
    owner.pop("text-worker", models=["m1"])


def _ask(caller, address: str = "198.51.100.7", **headers):
    return caller.post(ASYNC, {"prompt": "hi", "models": ["m1"]}, REMOTE_ADDR=address, **headers)


def test_a_key_past_its_burst_is_429_in_the_horde_shape_with_retry_after(requester, served):
    codes = [_ask(requester, f"198.51.100.{i}").status_code for i in range(4)]
    assert codes == [202, 202, 202, 429]
    refused = _ask(requester, "198.51.100.99")
    assert refused.status_code == 429
    assert refused.json()["rc"] == "RateLimited"
    assert refused["retry-after"] == "1"


def test_the_bucket_refills_at_its_rate(requester, served, time_machine):
    time_machine.move_to("2026-06-01 08:00:00+00:00", tick=False)
    assert [_ask(requester, f"198.51.100.{i}").status_code for i in range(4)] == [202, 202, 202, 429]
    time_machine.shift(1.01)
    assert _ask(requester, "198.51.100.50").status_code == 202
    assert _ask(requester, "198.51.100.51").status_code == 429


def test_an_address_past_its_burst_is_limited_whatever_key_it_uses(make_caller, served):
    callers = [make_caller(f"neighbour-{i}") for i in range(6)]
    codes = [_ask(caller, "203.0.113.5").status_code for caller in callers]
    assert codes == [202] * 5 + [429]
    assert _ask(callers[5], "203.0.113.6").status_code == 202  # another address


def test_the_anonymous_key_is_limited_by_address_only(anonymous, served, settings):
    settings.ANONYMOUS_MAX_WAITING_REQUESTS = 100
    codes = [_ask(anonymous, f"192.0.2.{i}").status_code for i in range(8)]
    assert codes == [202] * 8  # more than a key's burst of 3, from 8 addresses


def test_a_refused_request_costs_the_other_bucket_nothing(requester, make_caller, served):
    for i in range(3):
        _ask(requester, f"198.51.100.{i}")
    assert _ask(requester, "203.0.113.9").status_code == 429  # the key's bucket is empty
    others = [make_caller(f"other-{i}") for i in range(5)]
    assert [_ask(other, "203.0.113.9").status_code for other in others] == [202] * 5


def test_chat_routes_are_limited_in_their_protocols_shape(requester, served):
    for i in range(3):
        _ask(requester, f"198.51.100.{i}")
    body = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}
    openai = requester.client.post(
        "/v1/chat/completions", body, format="json", HTTP_AUTHORIZATION=f"Bearer {requester.api_key}"
    )
    assert openai.status_code == 429 and openai["retry-after"] == "1"
    assert openai.json()["error"]["type"] == "rate_limit_error"
    assert openai.json()["error"]["code"] == "rate_limited"
    anthropic = requester.client.post(
        "/v1/messages", {**body, "max_tokens": 5}, format="json", HTTP_X_API_KEY=requester.api_key
    )
    assert anthropic.status_code == 429
    assert anthropic.json()["error"]["type"] == "rate_limit_error"


def test_status_reads_are_limited_and_worker_routes_are_not(requester, owner, served):
    request_id = _ask(requester).json()["id"]
    status = f"/api/v2/generate/text/status/{request_id}"
    statuses = [
        requester.client.get(status, HTTP_APIKEY=requester.api_key, REMOTE_ADDR="10.9.9.9").status_code
        for _ in range(3)
    ]
    assert statuses == [200, 200, 429]
    assert all(owner.pop("text-worker", models=["m1"]).status_code == 200 for _ in range(10))


@pytest.mark.parametrize(
    "path",
    [
        "/api/v2/users/1",
        "/api/v2/find_user",
        "/api/v2/workers",
        "/api/v2/workers/name/nobody",
        "/api/v2/status/models?type=text",
        "/api/v2/status/performance",
        "/api/v2/stats/text/totals",
        "/api/schema/",
        "/admin/login/",
        "/api/v2/no-such-route",
    ],
)
def test_keyless_reads_the_admin_and_unknown_paths_are_limited_by_address(db, client, path, time_machine):
    # The clock stands still: at one token a second, a slow page (the schema takes a second or
    # more on a loaded machine) would refill the bucket between calls.
    time_machine.move_to(time.time(), tick=False)
    codes = [client.get(path, REMOTE_ADDR="203.0.113.77").status_code for _ in range(6)]
    assert 429 not in codes[:5] and codes[5] == 429, codes
    assert client.get(path, REMOTE_ADDR="203.0.113.78").status_code != 429  # another address


def test_the_heartbeat_and_metrics_are_not_limited(db, client):
    for path in ("/api/v2/status/heartbeat", "/metrics"):
        assert all(client.get(path, REMOTE_ADDR="203.0.113.79").status_code == 200 for _ in range(10))


def test_an_ipv6_client_is_limited_by_its_slash_64(make_caller, served):
    callers = [make_caller(f"v6-{i}") for i in range(7)]
    # Five addresses of one /64 (a subscriber's), and the same network written another way.
    same = [f"2001:db8:0:1::{i:x}" for i in range(1, 6)] + ["2001:0db8:0000:0001:ffff:ffff:ffff:ffff"]
    codes = [_ask(caller, address).status_code for caller, address in zip(callers, same, strict=False)]
    assert codes == [202] * 5 + [429]
    assert _ask(callers[6], "2001:db8:0:2::1").status_code == 202  # the next /64 is another client


def test_an_ipv4_address_mapped_into_ipv6_is_the_ipv4_address(make_caller, served):
    callers = [make_caller(f"mapped-{i}") for i in range(6)]
    codes = [_ask(caller, "203.0.113.40").status_code for caller in callers[:5]]
    assert codes == [202] * 5
    assert _ask(callers[5], "::ffff:203.0.113.40").status_code == 429


def _pop(api_key: str, address: str = "198.51.100.200"):
    return APIClient().post(
        "/api/v2/generate/text/pop",
        {"name": "w", "models": ["m1"]},
        format="json",
        HTTP_APIKEY=api_key,
        REMOTE_ADDR=address,
    )


def test_worker_calls_with_bad_keys_spend_their_addresss_bucket(db):
    codes = [_pop(f"bogus-key-{i:013d}").status_code for i in range(7)]
    assert codes == [401] * 5 + [429] * 2
    refused = _pop("bogus-key-again-000000")
    assert (refused.status_code, refused.json()["rc"]) == (429, "RateLimited")
    assert _pop("bogus-key-elsewhere-00", address="198.51.100.201").status_code == 401


def test_a_good_key_is_served_from_an_address_refused_for_bad_ones(owner):
    assert _pop(owner.api_key).status_code == 200  # seen good by this process
    for i in range(6):
        _pop(f"bogus-key-{i:013d}")
    assert _pop("bogus-key-new-0000000").status_code == 429
    assert _pop(owner.api_key).status_code == 200


def test_a_bad_key_seen_once_costs_no_database_statement_again(db, settings, django_assert_num_queries):
    settings.ADDRESS_RATE_PER_SECOND = 0  # the memory alone, whatever the buckets
    with django_assert_num_queries(1):
        assert _pop("bogus-key-0000000000").status_code == 401
    for path in ("pop", "progress", "submit"):
        with django_assert_num_queries(0):
            refused = APIClient().post(
                f"/api/v2/generate/text/{path}",
                {"id": "00000000-0000-0000-0000-000000000000", "name": "w", "seq": 1, "delta": "x"},
                format="json",
                HTTP_APIKEY="bogus-key-0000000000",
            )
        assert (refused.status_code, refused.json()["rc"]) == (401, "InvalidAPIKey")


def test_a_remembered_bad_key_is_asked_again_once_its_time_is_up(settings):
    settings.ADDRESS_RATE_PER_SECOND = 0
    settings.INVALID_KEY_CACHE_SECONDS = 10
    ratelimit.key_memory.bad("bogus-key-0000000000", time.monotonic())
    assert ratelimit.key_memory.is_bad("bogus-key-0000000000", time.monotonic())
    assert not ratelimit.key_memory.is_bad("bogus-key-0000000000", time.monotonic() + 10.01)
    assert not ratelimit.key_memory.is_bad("0000000000", time.monotonic())


def test_an_address_refused_for_bad_keys_is_served_again_once_its_bucket_has_refilled():
    memory, now = ratelimit.key_memory, time.monotonic()
    memory.block("198.51.100.9", now + 1)
    assert memory.blocking(now) and memory.is_blocked("198.51.100.9", "bogus-key-0000000000", now)
    assert not memory.is_blocked("198.51.100.10", "bogus-key-0000000000", now)  # another address
    later = now + 1.01
    assert not memory.blocking(later) and not memory.is_blocked("198.51.100.9", "bogus-key-0000000000", later)


def test_x_forwarded_for_is_ignored_unless_the_peer_is_a_trusted_proxy(make_caller, served, settings):
    callers = [make_caller(f"spoofer-{i}") for i in range(6)]
    # From an untrusted peer, each request claims another address: all count as the peer's.
    codes = [
        _ask(caller, "203.0.113.5", HTTP_X_FORWARDED_FOR=f"192.0.2.{i}").status_code
        for i, caller in enumerate(callers)
    ]
    assert codes == [202] * 5 + [429]

    settings.TRUSTED_PROXIES = (ipaddress.ip_network("10.0.0.0/8"),)
    proxied = [
        _ask(caller, "10.0.0.2", HTTP_X_FORWARDED_FOR=f"192.0.2.{i}, 10.0.0.9").status_code
        for i, caller in enumerate(callers)
    ]
    assert proxied == [202] * 6  # six clients behind our proxies


def test_the_client_address_is_the_nearest_hop_that_is_not_a_trusted_proxy(settings):
    settings.TRUSTED_PROXIES = (ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("::1/128"))
    assert ratelimit.client_address("10.0.0.2", "6.6.6.6, 192.0.2.1, 10.0.0.7") == "192.0.2.1"
    assert ratelimit.client_address("192.0.2.8", "6.6.6.6") == "192.0.2.8"  # not our proxy
    assert ratelimit.client_address("10.0.0.2", "") == "10.0.0.2"
    assert ratelimit.client_address("10.0.0.2", "10.1.1.1") == "10.0.0.2"  # only our own hops
    assert ratelimit.client_address("::1", "not-an-ip, 192.0.2.3") == "192.0.2.3"
    assert ratelimit.client_address("::1", "192.0.2.3, not-an-ip") == "not-an-ip"


def test_a_zero_rate_turns_a_limit_off(requester, served, settings):
    settings.KEY_RATE_PER_SECOND = 0
    settings.ADDRESS_RATE_PER_SECOND = 0
    assert all(_ask(requester).status_code == 202 for _ in range(10))


@pytest.mark.django_db(transaction=True)
def test_requests_at_once_take_no_more_tokens_than_the_burst(make_caller, settings):
    requester, owner = make_caller("racer"), make_caller("racing-owner")
    owner.pop("text-worker", models=["m1"])
    start = threading.Barrier(12)
    codes: list[int] = []

    def send(i: int) -> None:
        try:
            start.wait()
            codes.append(_ask(requester, f"198.51.100.{i}").status_code)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=send, args=(i,)) for i in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(codes) == [202] * 3 + [429] * 9


def test_a_chat_request_counts_against_the_key_it_authenticates_with_whatever_else_it_sends(
    requester, served
):
    for i in range(3):
        _ask(requester, f"198.51.100.{i}")  # the key's burst, spent
    # A model no worker serves: past the limits, the route would answer 404 at once.
    body = {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}
    refused = requester.client.post(
        "/v1/chat/completions",
        body,
        format="json",
        HTTP_AUTHORIZATION=f"Bearer {requester.api_key}",
        HTTP_APIKEY="decoy",  # not what /v1 authenticates with: no bucket of its own
        REMOTE_ADDR="198.51.100.50",
    )
    assert refused.status_code == 429, refused.content
