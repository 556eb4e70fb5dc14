"""Address and network timeouts: set by moderators (the admin, `/api/v2/operations/ipaddr`),
refused with 403 TimeoutIP on every API route, checked from Redis."""

import ipaddress
import json
from datetime import datetime, timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.core.cache import cache
from rest_framework.test import APIClient

from hordeops import metrics, timeouts
from workers.models import Account, AddressTimeout
from workers.tasks import publish_address_timeouts_task

T0 = "2026-06-01 12:00:00+00:00"
OPERATIONS = "/api/v2/operations/ipaddr"


@pytest.fixture
def mod_key(make_caller):
    caller = make_caller("a-moderator")
    Account.objects.filter(pk=caller.account.pk).update(moderator=True)
    return caller


def _from(caller, address: str):
    caller.client = APIClient(REMOTE_ADDR=address)
    return caller


def _time_out(mod_key, ipaddr: str, hours: int = 1):
    return mod_key.client.post(
        OPERATIONS, {"ipaddr": ipaddr, "hours": hours}, format="json", HTTP_APIKEY=mod_key.api_key
    )


def test_a_timed_out_address_is_refused_on_requester_and_worker_routes_until_its_timeout_ends(
    clock, mod_key, make_caller
):
    # Counters live in Redis for the whole run: other tests' refusals are counted before this one.
    refusals_before = metrics.value(metrics.TIMED_OUT_REFUSALS)
    assert _time_out(mod_key, "203.0.113.7").json() == {"message": "OK"}
    caller = _from(make_caller(), "203.0.113.7")
    refused = caller.request_text()
    assert (refused.status_code, refused.json()["rc"]) == (403, "TimeoutIP")
    assert "3600 more seconds" in refused.json()["message"]
    assert refused["retry-after"] == "3600"
    assert caller.pop("w").json()["rc"] == "TimeoutIP"
    assert caller.client.get("/api/v2/workers").status_code == 403
    # The routes that queue check the key first, then the timeout (their admission).
    chat = caller.post(
        "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        HTTP_X_API_KEY=caller.api_key,
    )
    assert (chat.status_code, json.loads(chat.content)["error"]["code"]) == (403, "timeout_ip")
    anthropic = caller.post(
        "/v1/messages",
        {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]},
        HTTP_X_API_KEY=caller.api_key,
    )
    assert (anthropic.status_code, json.loads(anthropic.content)["type"]) == (403, "error")
    # The operator's probe still answers; another address is not held.
    assert caller.client.get("/api/v2/status/heartbeat").status_code == 200
    assert _from(make_caller(), "203.0.113.8").request_text().status_code == 202
    assert metrics.value(metrics.TIMED_OUT_REFUSALS) - refusals_before == 5

    clock.shift(3599)
    assert caller.request_text().json()["message"].count("for 1 more seconds") == 1
    clock.shift(1)
    assert caller.request_text().status_code == 202


def test_networks_are_timed_out_by_their_cidr_ipv4_and_ipv6(clock, mod_key, make_caller):
    assert _time_out(mod_key, "198.51.100.0/24", hours=2).status_code == 200
    assert _time_out(mod_key, "2001:db8::/32", hours=3).status_code == 200
    assert _from(make_caller(), "198.51.100.200").pop("w").json()["rc"] == "TimeoutIP"
    assert _from(make_caller(), "2001:db8:5::1").request_text().json()["rc"] == "TimeoutIP"
    assert _from(make_caller(), "::ffff:198.51.100.9").request_text().json()["rc"] == "TimeoutIP"
    assert _from(make_caller(), "198.51.101.1").request_text().status_code == 202
    assert _from(make_caller(), "2001:db9::1").request_text().status_code == 202

    listed = mod_key.client.get(OPERATIONS, HTTP_APIKEY=mod_key.api_key).json()
    assert sorted((t["ipaddr"], t["seconds"]) for t in listed) == [
        ("198.51.100.0/24", 7200),
        ("2001:db8::/32", 10800),
    ]
    holding = mod_key.client.get(f"{OPERATIONS}/198.51.100.77", HTTP_APIKEY=mod_key.api_key).json()
    assert holding == [{"ipaddr": "198.51.100.0/24", "seconds": 7200}]
    assert mod_key.client.get(f"{OPERATIONS}/2001:db8:1::/48", HTTP_APIKEY=mod_key.api_key).json()[0][
        "ipaddr"
    ] == ("2001:db8::/32")

    lifted = mod_key.client.delete(
        OPERATIONS, {"ipaddr": "198.51.100.0/24"}, format="json", HTTP_APIKEY=mod_key.api_key
    )
    assert lifted.json() == {"message": "OK"}
    assert _from(make_caller(), "198.51.100.200").request_text().status_code == 202
    assert _from(make_caller(), "2001:db8:5::1").request_text().json()["rc"] == "TimeoutIP"


def test_only_a_moderator_sets_timeouts_and_a_bad_address_or_duration_is_a_400(mod_key, requester):
    refused = _time_out(requester, "203.0.113.7")
    assert (refused.status_code, refused.json()["rc"]) == (403, "NotModerator")
    assert requester.client.get(OPERATIONS, HTTP_APIKEY=requester.api_key).status_code == 403
    assert requester.client.get(OPERATIONS).status_code == 401
    for ipaddr, hours in (
        ("not-an-address", 1),
        ("203.0.113.7", 0),
        ("203.0.113.7", 721),
        ("10.0.0.0/33", 1),
    ):
        answer = _time_out(mod_key, ipaddr, hours)
        assert answer.status_code == 400, (ipaddr, hours)
        assert "rc" in answer.json()
    assert mod_key.client.get(f"{OPERATIONS}/nonsense", HTTP_APIKEY=mod_key.api_key).status_code == 400
    assert not AddressTimeout.objects.exists()


def test_a_timeout_set_again_is_replaced_and_one_redis_lost_is_back_with_the_beat_pass(
    clock, mod_key, make_caller
):
    _time_out(mod_key, "203.0.113.7", hours=1)
    _time_out(mod_key, "203.0.113.7", hours=5)
    assert AddressTimeout.objects.get().until == datetime.fromisoformat(T0) + timedelta(hours=5)
    assert mod_key.client.get(OPERATIONS, HTTP_APIKEY=mod_key.api_key).json() == [
        {"ipaddr": "203.0.113.7", "seconds": 18000}
    ]
    caller = _from(make_caller(), "203.0.113.7")
    cache.client.get_client(write=True).delete(timeouts.KEY)  # Redis restarted, kept nothing
    timeouts.forget()
    assert caller.request_text().status_code == 202
    assert publish_address_timeouts_task() == 1
    assert caller.request_text().json()["rc"] == "TimeoutIP"


def test_the_pops_statement_count_is_unchanged_with_timeouts_in_force(
    clock, mod_key, requester, owner, django_assert_num_queries
):
    _time_out(mod_key, "203.0.113.0/24")
    owner.pop("w")
    requester.request_text()
    clock.shift(1)  # a later pop than the one that made the worker
    with django_assert_num_queries(2):
        assert owner.pop("w").json()["id"] is not None


def test_a_moderator_sets_and_lifts_a_timeout_in_the_admin_and_both_are_logged(clock, moderator, make_caller):
    added = moderator.post(
        "/admin/workers/addresstimeout/add/", {"network": "203.0.113.0/24", "hours": "6", "reason": "raid"}
    )
    assert added.status_code == 302, added.content
    row = AddressTimeout.objects.get()
    assert (row.network, row.reason, row.created_by) == ("203.0.113.0/24", "raid", "mod")
    assert _from(make_caller(), "203.0.113.50").request_text().json()["rc"] == "TimeoutIP"
    found = moderator.get("/admin/workers/addresstimeout/", {"q": "203.0.113.50"})
    assert b"203.0.113.0/24" in found.content
    bad = moderator.post("/admin/workers/addresstimeout/add/", {"network": "nope", "hours": "6"})
    assert b"Not an IP address or a CIDR network." in bad.content

    deleted = moderator.post(f"/admin/workers/addresstimeout/{row.pk}/delete/", {"post": "yes"})
    assert deleted.status_code == 302
    assert not AddressTimeout.objects.exists()
    assert _from(make_caller(), "203.0.113.50").request_text().status_code == 202
    assert LogEntry.objects.filter(object_repr="203.0.113.0/24").count() == 2


def test_the_schema_describes_the_body_of_a_timeouts_delete(client, db):
    schema = client.get("/api/schema/", {"format": "json"}).json()
    body = schema["paths"]["/api/v2/operations/ipaddr"]["delete"]["requestBody"]
    assert body["content"]["application/json"]["schema"]["required"] == ["ipaddr"]


def test_a_timeout_set_while_redis_is_unreachable_is_kept_and_published_once_it_is_back(
    clock, settings, make_caller
):
    from workers.services import time_out_address

    reachable = settings.CACHES
    # A Redis nothing listens on: the connection is refused, as when Redis is down.
    settings.CACHES = {"default": {**reachable["default"], "LOCATION": "redis://127.0.0.1:1/0"}}
    now = datetime.fromisoformat(T0)
    time_out_address(network="203.0.113.7", until=now + timedelta(hours=1), by="mod", now=now)
    assert AddressTimeout.objects.get().network == "203.0.113.7"
    settings.CACHES = reachable
    timeouts.forget()
    caller = _from(make_caller(), "203.0.113.7")
    assert caller.request_text().status_code == 202  # not yet in Redis
    assert publish_address_timeouts_task() == 1
    assert caller.request_text().json()["rc"] == "TimeoutIP"


def test_a_single_ipv6_addresss_timeout_holds_its_whole_64_as_the_limits_count_it(
    clock, mod_key, make_caller
):
    assert _time_out(mod_key, "2001:db8:1:2::5").status_code == 200
    assert _from(make_caller(), "2001:db8:1:2::5").request_text().json()["rc"] == "TimeoutIP"
    # The next address of the /64 is the same subscriber: held too; the next /64 is not.
    assert _from(make_caller(), "2001:db8:1:2:ffff::9").request_text().json()["rc"] == "TimeoutIP"
    assert _from(make_caller(), "2001:db8:1:3::5").request_text().status_code == 202
    listed = mod_key.client.get(OPERATIONS, HTTP_APIKEY=mod_key.api_key).json()
    assert [t["ipaddr"] for t in listed] == ["2001:db8:1:2::/64"]
    # Any address of the /64 names it, to look it up or to lift it.
    holding = mod_key.client.get(f"{OPERATIONS}/2001:db8:1:2::77", HTTP_APIKEY=mod_key.api_key).json()
    assert [t["ipaddr"] for t in holding] == ["2001:db8:1:2::/64"]
    mod_key.client.delete(
        OPERATIONS, {"ipaddr": "2001:db8:1:2::9"}, format="json", HTTP_APIKEY=mod_key.api_key
    )
    assert not AddressTimeout.objects.exists()


def test_a_timeout_row_named_by_a_single_ipv6_address_holds_its_64_and_any_address_of_it_lifts_it(
    clock, mod_key, make_caller
):
    # As a row made before single IPv6 addresses were held as their /64 is named.
    AddressTimeout.objects.create(
        network="2001:db8:7::1", until=datetime.fromisoformat(T0) + timedelta(hours=1)
    )
    publish_address_timeouts_task()
    assert _from(make_caller(), "2001:db8:7::2").request_text().json()["rc"] == "TimeoutIP"
    mod_key.client.delete(OPERATIONS, {"ipaddr": "2001:db8:7::3"}, format="json", HTTP_APIKEY=mod_key.api_key)
    assert not AddressTimeout.objects.exists()


def _behind_proxy(caller, forwarded_for: str):
    caller.client = APIClient(REMOTE_ADDR="10.9.9.9", HTTP_X_FORWARDED_FOR=forwarded_for)
    return caller


def test_a_forwarded_address_with_a_port_or_brackets_is_held_by_its_timeout_and_an_unreadable_one_is_a_400(
    clock, settings, mod_key, make_caller
):
    settings.TRUSTED_PROXIES = (ipaddress.ip_network("10.9.9.0/24"),)
    _time_out(mod_key, "203.0.113.7")
    _time_out(mod_key, "2001:db8:9::1")
    for forwarded in (
        "203.0.113.7:5678",
        "[2001:db8:9::1]:443",
        "[2001:db8:9::2]",
        "198.51.100.1, 203.0.113.7:1",
    ):
        answer = _behind_proxy(make_caller(), forwarded).request_text()
        assert (answer.status_code, answer.json()["rc"]) == (403, "TimeoutIP"), forwarded
    assert _behind_proxy(make_caller(), "198.51.100.1:80").request_text().status_code == 202

    for forwarded in ("unknown", "203.0.113.7:http", "[203.0.113.7]:1", "2001:db8:9::1:443:1x", "_hidden"):
        caller = _behind_proxy(make_caller(), forwarded)
        refused = caller.request_text()
        assert (refused.status_code, refused.json()["rc"]) == (400, "BadRequest"), forwarded
        assert "client address could not be read" in refused.json()["message"]
    assert caller.pop("w").status_code == 400
    # The routes that queue check the key first, then the timeout (their admission).
    chat = caller.post(
        "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        HTTP_X_API_KEY=caller.api_key,
    )
    assert chat.status_code == 400 and "error" in json.loads(chat.content)
    assert caller.client.get("/api/v2/status/heartbeat").status_code == 200


REFUSED_NETWORKS = (
    ("0.0.0.0/0", "at most a /8"),
    ("128.0.0.0/1", "at most a /8"),
    ("10.0.0.0/7", "at most a /8"),
    ("2000::/3", "at most a /32"),
    ("2001:db8::/31", "at most a /32"),
    ("127.0.0.1", "loopback"),
    ("126.0.0.0/8", None),  # allowed: the bound itself, and no loopback in it
    ("127.0.0.0/8", "loopback"),
    ("0:0:0:0::1", "loopback"),  # ::1, long enough for the route (7 characters at least)
    ("::ffff:127.0.0.1", "loopback"),
    ("10.9.0.0/16", "TRUSTED_PROXIES"),
    ("10.9.9.9", "TRUSTED_PROXIES"),
    ("2001:db8:f::/48", "TRUSTED_PROXIES"),
)


@pytest.mark.parametrize("ipaddr, why", REFUSED_NETWORKS)
def test_the_route_refuses_a_timeout_of_too_wide_a_network_loopback_or_the_hordes_proxies(
    clock, settings, mod_key, ipaddr, why
):
    settings.TRUSTED_PROXIES = (
        ipaddress.ip_network("10.9.9.0/24"),
        ipaddress.ip_network("2001:db8:f:1::/64"),
    )
    answer = _time_out(mod_key, ipaddr)
    if why is None:
        assert answer.status_code == 200
        return
    assert (answer.status_code, answer.json()["rc"]) == (400, "BadRequest"), ipaddr
    assert why in answer.json()["message"]
    assert not AddressTimeout.objects.exists()


@pytest.mark.parametrize("network, why", REFUSED_NETWORKS)
def test_the_admin_refuses_a_timeout_of_too_wide_a_network_loopback_or_the_hordes_proxies(
    clock, settings, moderator, network, why
):
    settings.TRUSTED_PROXIES = (
        ipaddress.ip_network("10.9.9.0/24"),
        ipaddress.ip_network("2001:db8:f:1::/64"),
    )
    added = moderator.post("/admin/workers/addresstimeout/add/", {"network": network, "hours": "6"})
    if why is None:
        assert added.status_code == 302
        return
    assert added.status_code == 200
    assert why in added.content.decode()
    assert not AddressTimeout.objects.exists()


def test_a_timeout_set_before_the_bounds_may_still_be_lifted(clock, mod_key):
    AddressTimeout.objects.create(network="0.0.0.0/0", until=datetime.fromisoformat(T0) + timedelta(hours=1))
    lifted = mod_key.client.delete(
        OPERATIONS, {"ipaddr": "0.0.0.0/0"}, format="json", HTTP_APIKEY=mod_key.api_key
    )
    assert lifted.json() == {"message": "OK"}
    assert not AddressTimeout.objects.exists()
