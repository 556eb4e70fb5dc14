"""Service accounts: front ends that send requests for their own users. A moderator makes an
account one in the admin and gives it a proxy passkey, shown once; with it in
`Proxy-Authorization`, the front end's `Proxied-For` is taken as the client's address, so that
a timed-out user of the front end is refused and the others are not."""

import time

from django.contrib.admin.models import LogEntry

from hordeops import ratelimit, timeouts
from tests.conftest import ACCOUNT_PAGE_INLINES
from workers import proxies
from workers.models import Account, hash_api_key

ACCOUNTS = "/admin/workers/account/"
USER_ADDRESS = "203.0.113.50"


def _service(caller) -> str:
    """Make `caller`'s account a service account with a proxy passkey; return the passkey."""
    Account.objects.filter(pk=caller.account.pk).update(service=True)
    caller.account.refresh_from_db()
    return proxies.make_passkey(account=caller.account)


def _time_out(address: str) -> None:
    timeouts.publish({address: time.time() + 3600})


def _ask(caller, **headers: str):
    return caller.post("/api/v2/generate/text/async", {"prompt": "Once upon a time"}, **headers)


def test_a_service_accounts_passkey_makes_its_proxied_for_header_the_client_address(make_caller):
    front_end = make_caller("front-end")
    passkey = _service(front_end)
    _time_out(USER_ADDRESS)

    refused = _ask(front_end, HTTP_PROXY_AUTHORIZATION=passkey, HTTP_PROXIED_FOR=USER_ADDRESS)
    assert (refused.status_code, refused.json()["rc"]) == (403, "TimeoutIP")
    # The contract's name for the header is read too.
    refused = _ask(front_end, HTTP_PROXY_AUTHORIZATION=passkey, HTTP_PROXY_FOR=USER_ADDRESS)
    assert refused.status_code == 403
    # Its other users are not held by that one's timeout, nor is the front end itself.
    assert (
        _ask(front_end, HTTP_PROXY_AUTHORIZATION=passkey, HTTP_PROXIED_FOR="203.0.113.51").status_code == 202
    )
    assert _ask(front_end).status_code == 202


def test_without_a_known_passkey_a_caller_cannot_choose_its_address(make_caller):
    front_end = make_caller("front-end")
    _service(front_end)
    _time_out("127.0.0.1")  # the test client's own address
    assert _ask(front_end, HTTP_PROXIED_FOR=USER_ADDRESS).json()["rc"] == "TimeoutIP"
    guessed = _ask(front_end, HTTP_PROXY_AUTHORIZATION="not-a-passkey", HTTP_PROXIED_FOR=USER_ADDRESS)
    assert guessed.json()["rc"] == "TimeoutIP"


def test_a_suspended_service_accounts_passkey_is_no_longer_known(make_caller):
    front_end = make_caller("front-end")
    passkey = _service(front_end)
    assert proxies.is_known_passkey(passkey)
    Account.objects.filter(pk=front_end.account.pk).update(suspended_at="2026-06-01T12:00:00Z")
    proxies.forget()  # as every process does within SNAPSHOT_SECONDS
    assert not proxies.is_known_passkey(passkey)
    assert not proxies.is_known_passkey("")


def test_a_proxied_for_header_is_read_on_the_api_routes_only(make_caller, rf):
    passkey = _service(make_caller("front-end"))
    headers = {"HTTP_PROXY_AUTHORIZATION": passkey, "HTTP_PROXIED_FOR": USER_ADDRESS}
    assert ratelimit.request_address(rf.post("/v1/chat/completions", **headers)) == USER_ADDRESS
    # The admin's login and the sign-up count failures and accounts per address: not spread.
    assert ratelimit.request_address(rf.post("/admin/login/", **headers)) == "127.0.0.1"
    assert ratelimit.request_address(rf.post("/register", **headers)) == "127.0.0.1"


def test_an_address_a_proxied_for_header_names_must_be_an_ip_address(make_caller):
    front_end = make_caller("front-end")
    passkey = _service(front_end)
    refused = _ask(front_end, HTTP_PROXY_AUTHORIZATION=passkey, HTTP_PROXIED_FOR="somewhere")
    assert (refused.status_code, set(refused.json())) == (400, {"message", "rc"})


def test_a_moderator_makes_an_account_a_service_account_and_its_passkey_shown_once(
    moderator, make_caller, requester
):
    front_end = make_caller("front-end")
    page = f"{ACCOUNTS}{front_end.account.pk}/change/"
    body = {
        **ACCOUNT_PAGE_INLINES,
        "deadline_limit_ms": "",
        "max_waiting_requests": "",
        "suspension_reason": "",
    }
    moderator.post(page, {**body, "service": "on"})
    assert Account.objects.get(pk=front_end.account.pk).service
    shown = front_end.client.get("/api/v2/find_user", HTTP_APIKEY=front_end.api_key).json()
    assert shown["service"] is True
    assert requester.client.get("/api/v2/find_user", HTTP_APIKEY=requester.api_key).json()["service"] is False

    answer = moderator.post(
        ACCOUNTS,
        {
            "action": "make_proxy_passkey",
            "reason": "Runs the reader's front end.",
            "_selected_action": [front_end.account.pk, requester.account.pk],
        },
        follow=True,
    )
    shown = [str(m) for m in answer.context["messages"] if "proxy passkey" in str(m)]
    assert len(shown) == 1 and "front-end" in shown[0]
    passkey = shown[0].rsplit(" ", 1)[-1]
    assert Account.objects.get(pk=front_end.account.pk).proxy_passkey_hash == hash_api_key(passkey)
    assert Account.objects.get(pk=requester.account.pk).proxy_passkey_hash is None  # no service account
    assert LogEntry.objects.filter(
        object_id=str(front_end.account.pk), change_message__contains="Proxy passkey made"
    ).exists()
    assert proxies.is_known_passkey(passkey)

    # No longer a service account: its passkey goes with it.
    moderator.post(page, body)
    account = Account.objects.get(pk=front_end.account.pk)
    assert (account.service, account.proxy_passkey_hash) == (False, None)
    assert not proxies.is_known_passkey(passkey)
    assert front_end.request_text(proxied_account="reader#1").json()["rc"] == "OnlyServiceAccountProxy"
