"""The account page, `/account`: signed in with the API key (bounded as the admin's logins are,
CSRF on every POST), it shows the account's kudos, its last 30 days, its ledger and its
workers, sends kudos, toggles maintenance, resets the key and signs out."""

import re
import uuid
from datetime import timedelta
from decimal import Decimal

import httpx
import pytest
from django.test import Client
from django.utils import timezone
from django_redis import get_redis_connection

from jobs.models import Generation
from kudos import ledger
from kudos.models import Hold, TextModel
from tests.conftest import give_kudos
from workers import services
from workers.models import Worker

BRIDGE = {"bridge_agent": "AI Horde Worker:1:https://example.org"}


def signed_in(caller, address: str = "203.0.113.7") -> Client:
    client = Client(REMOTE_ADDR=address)
    answer = client.post("/account", {"apikey": caller.api_key})
    assert answer.status_code == 302 and answer["location"] == "/account", answer.content[:500]
    return client


def page(client: Client, path: str = "/account") -> str:
    answer = client.get(path)
    assert answer.status_code == 200
    return answer.content.decode()


def award(caller, amount: str, reason: str = "") -> None:
    give_kudos(caller, amount, reason=reason)


def test_the_page_asks_for_the_key_in_a_field_named_apikey_and_signs_in_with_it(requester):
    client = Client()
    form = page(client)
    assert 'name="apikey"' in form and "csrfmiddlewaretoken" in form
    client = signed_in(requester)
    shown = page(client)
    assert f"requester#{requester.account.pk}" in shown
    assert requester.api_key not in shown  # the key is never written back
    assert set(client.session.keys()) >= {"account_id", "account_key_hash"}
    assert requester.api_key not in client.session.values()


def test_a_wrong_key_gets_the_forms_error_and_no_session(requester):
    client = Client()
    answer = client.post("/account", {"apikey": "not-a-key-of-anyone"})
    assert answer.status_code == 200
    assert "No account has this key." in answer.content.decode()
    assert 'name="apikey"' in page(client)  # still the sign-in form


def test_keys_guessed_50_times_from_one_address_are_refused_429_with_why(requester):
    client = Client(REMOTE_ADDR="198.51.100.9")
    statuses = [client.post("/account", {"apikey": f"guess-{n:04d}"}).status_code for n in range(50)]
    assert statuses[0] == 200 and statuses[-1] == 429
    assert 429 in statuses[:21]  # the admin's bound of failures per address (20)
    refused = client.post("/account", {"apikey": requester.api_key})  # even the right one, from there
    assert refused.status_code == 429
    text = refused.content.decode()
    assert "Too many wrong keys from this address" in text and 'name="apikey"' in text
    signed_in(requester, address="203.0.113.50")  # from another address, the owner gets in


def test_one_key_guessed_again_and_again_is_refused_from_that_address(requester, settings):
    settings.ADMIN_LOGIN_FAILURES_PER_USER = 3
    client = Client(REMOTE_ADDR="198.51.100.10")
    statuses = [client.post("/account", {"apikey": "the-same-guess"}).status_code for _ in range(4)]
    assert statuses == [200, 200, 200, 429]
    assert (
        "for this user from this address"
        in client.post("/account", {"apikey": "the-same-guess"}).content.decode()
    )


@pytest.mark.parametrize("path", ["/account", "/account/sign-out", "/account/reset", "/account/transfer"])
def test_a_post_without_its_csrf_token_is_refused(requester, path):
    client = Client(enforce_csrf_checks=True)
    answer = client.post(path, {"apikey": requester.api_key, "username": "x#1", "amount": 1})
    assert answer.status_code == 403
    assert "account_id" not in client.session


def test_a_reset_without_its_csrf_token_leaves_the_key_as_it_was(requester):
    client = Client(enforce_csrf_checks=True, REMOTE_ADDR="203.0.113.7")
    form = client.get("/account").content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form).group(1)
    assert (
        client.post("/account", {"apikey": requester.api_key, "csrfmiddlewaretoken": token}).status_code
        == 302
    )
    assert client.post("/account/reset").status_code == 403
    requester.account.refresh_from_db()
    assert services.key_account(api_key=requester.api_key).pk == requester.account.pk


def test_the_page_shows_the_balance_what_may_be_spent_and_the_kudos_details(requester):
    award(requester, "1000")
    Hold.objects.create(request_id=uuid.uuid4(), account=requester.account, amount=Decimal("100"))
    shown = page(signed_in(requester))
    assert re.search(r'data-testid="balance">1,?000\.00<', shown), shown
    # 1,000 less the floor (25) less the hold (100).
    assert re.search(r'data-testid="available">875\.00<', shown)
    assert "kudos_details" in shown
    for key in ("accumulated", "gifted", "awarded", "received"):
        assert f">{key}</th>" in shown


def test_the_chart_draws_the_last_30_days_of_kudos_and_tokens(requester, trusted_owner):
    TextModel.objects.create(name="m1", parameters=13_000_000_000)
    award(requester, "1000")
    trusted_owner.pop("earner", models=["m1"], **BRIDGE)
    requester.request_text(models=["m1"], params={"max_length": 40})
    job = trusted_owner.pop("earner", models=["m1"], **BRIDGE).json()
    assert trusted_owner.submit(job["id"], "y" * 400).status_code == 200
    tokens = Generation.objects.get(pk=job["id"]).tokens
    generated = Generation.objects.get(pk=job["id"]).finished_at.date().isoformat()

    shown = page(signed_in(requester))
    assert shown.count('<svg class="chart"') == 2
    assert f"<title>{generated}: earned 1,000</title>" in shown
    assert re.search(rf"<title>{generated}: spent [0-9.]+</title>", shown)
    assert f"<title>{generated}: requested {tokens}</title>" in shown
    assert f"<title>{generated}: served 0</title>" in shown
    assert len(re.findall(r'<rect class="earned"', shown)) == 30  # a bar a day, empty ones too

    served = page(signed_in(trusted_owner, address="203.0.113.8"))
    assert f"<title>{generated}: served {tokens}</title>" in served
    assert re.search(rf"<title>{generated}: earned [1-9][0-9.]*</title>", served)


def test_the_chart_leaves_out_what_is_older_than_30_days(requester, time_machine):
    time_machine.move_to("2026-05-01 12:00:00+00:00", tick=False)
    award(requester, "700")
    time_machine.move_to("2026-06-15 12:00:00+00:00", tick=False)
    award(requester, "30")
    shown = page(signed_in(requester))
    assert "<title>2026-06-15: earned 30</title>" in shown
    assert "2026-05-01" not in shown.split('<section aria-labelledby="ledger">')[0]
    assert "2026-05-17: earned 0" in shown and "2026-05-16" not in shown.split("ledger")[0]


def test_the_ledger_is_shown_newest_first_a_page_at_a_time(requester):
    for n in range(30):
        award(requester, str(n + 1), reason=f"award number {n + 1}")
    client = signed_in(requester)
    first = page(client)
    assert first.count("award number") == 25
    assert first.index("award number 30") < first.index("award number 29")
    assert "award number 5<" not in first and "Page 1 of 2" in first
    second = page(client, "/account?page=2")
    assert second.count("award number") == 5 and "award number 1<" in second
    assert page(client, "/account?page=zzz").count("award number") == 25  # the first page


def test_the_page_lists_the_accounts_workers_with_their_state(owner):
    online = Worker.objects.create(
        name="fast-one", account=owner.account, speed=12.5, completed_jobs=42, last_pop_at=timezone.now()
    )
    Worker.objects.create(
        name="held-one",
        account=owner.account,
        last_pop_at=timezone.now() - timedelta(days=1),
        maintenance=True,
        maintenance_by_moderator=True,
        maintenance_reason="stop dropping jobs",
    )
    shown = page(signed_in(owner))
    row = shown.split('data-worker="fast-one"')[1].split("</tr>")[0]
    assert "online" in row and online.performance in row and ">42<" in row and "Start maintenance" in row
    held = shown.split('data-worker="held-one"')[1].split("</tr>")[0]
    assert "offline" in held and "set by a moderator: stop dropping jobs" in held
    assert "only a moderator can lift it" in held and "End maintenance" not in held


def test_the_owner_toggles_maintenance_but_cannot_lift_a_moderators(owner, make_caller):
    mine = Worker.objects.create(name="mine", account=owner.account)
    held = Worker.objects.create(
        name="held", account=owner.account, maintenance=True, maintenance_by_moderator=True
    )
    others = Worker.objects.create(name="theirs", account=make_caller("stranger").account)
    client = signed_in(owner)

    answer = client.post(f"/account/workers/{mine.pk}/maintenance", {"maintenance": "on"})
    assert answer.status_code == 302
    mine.refresh_from_db()
    assert mine.maintenance and not mine.maintenance_by_moderator
    assert "set by you" in page(client).split('data-worker="mine"')[1].split("</tr>")[0]
    client.post(f"/account/workers/{mine.pk}/maintenance", {})
    mine.refresh_from_db()
    assert not mine.maintenance

    client.post(f"/account/workers/{held.pk}/maintenance", {})
    held.refresh_from_db()
    assert held.maintenance and held.maintenance_by_moderator
    assert "only a moderator can change it" in page(client)

    client.post(f"/account/workers/{others.pk}/maintenance", {"maintenance": "on"})
    others.refresh_from_db()
    assert not others.maintenance
    assert "No worker of yours has this id." in page(client)


@pytest.mark.parametrize(
    ("to", "amount", "error"),
    [
        ("self", "10", "Cannot send kudos to yourself"),
        ("nobody#999999999", "10", "Invalid target username."),
        ("other", "5000", "Not enough kudos."),
        ("other", "0", "Ensure this value is greater than or equal to 1."),
        ("other", "ten", "Enter a whole number."),
    ],
)
def test_a_transfer_the_service_refuses_shows_its_reason_on_the_form(
    requester, make_caller, to, amount, error
):
    other = make_caller("other")
    award(requester, "1000")
    client = signed_in(requester)
    target = {"self": f"requester#{requester.account.pk}", "other": f"other#{other.account.pk}"}.get(to, to)
    answer = client.post("/account/transfer", {"username": target, "amount": amount})
    assert answer.status_code == 200
    assert error in answer.content.decode()
    assert ledger.balance(other.account.pk) == 0


def test_a_transfer_moves_kudos_once_even_sent_twice(requester, make_caller):
    other = make_caller("other")
    award(requester, "1000")
    award(other, "100")
    client = signed_in(requester)
    form = {"username": f"other#{other.account.pk}", "amount": "300", "idempotency_key": uuid.uuid4().hex}
    answer = client.post("/account/transfer", form)
    assert answer.status_code == 302
    assert f"Sent 300 kudos to other#{other.account.pk}." in page(client)
    assert ledger.balance(other.account.pk) == 400 and ledger.balance(requester.account.pk) == 700
    redis = get_redis_connection("default")
    redis.delete(*redis.keys("hordeops:rate:transfer:*"))  # a reload a while later
    assert client.post("/account/transfer", form).status_code == 302
    assert ledger.balance(other.account.pk) == 400


def test_the_transfer_form_spends_the_routes_rate(requester, make_caller, settings):
    other = make_caller("other")
    award(requester, "1000")
    give_kudos(other, "10")
    before = ledger.balance(other.account.pk)
    client = signed_in(requester)
    form = {"username": f"other#{other.account.pk}", "amount": "1"}
    assert client.post("/account/transfer", form).status_code == 302
    answer = client.post("/account/transfer", form)  # the route's one a second
    assert answer.status_code == 200 and "Too many requests" in answer.content.decode()
    assert ledger.balance(other.account.pk) == before + 1


def test_reset_shows_the_new_key_once_and_the_old_one_is_refused_at_once(requester):
    client = signed_in(requester)
    answer = client.post("/account/reset")
    assert answer.status_code == 200
    shown = answer.content.decode()
    new_key = re.search(r'data-testid="api-key">([^<]+)<', shown).group(1)
    assert new_key != requester.api_key
    assert requester.client.get("/api/v2/find_user", HTTP_APIKEY=requester.api_key).status_code == 401
    found = requester.client.get("/api/v2/find_user", HTTP_APIKEY=new_key)
    assert found.status_code == 200 and found.json()["id"] == requester.account.pk
    assert 'data-testid="api-key"' not in page(client)  # shown once; still signed in
    assert Client().post("/account", {"apikey": requester.api_key}).status_code == 200  # the old: refused


def test_a_key_reset_elsewhere_or_a_suspension_ends_the_session_at_once(requester, make_caller):
    client = signed_in(requester)
    services.reset_api_key(account=requester.account)  # by a moderator, in the admin
    shown = page(client)
    assert "Your API key was reset" in shown and 'name="apikey"' in shown

    other = make_caller("other")
    client = signed_in(other)
    services.mark_suspended(
        accounts=type(other.account).objects.filter(pk=other.account.pk),
        reason="spam",
        now=other.account.created_at,
    )
    shown = page(client)
    assert "This account is suspended: spam." in shown and 'name="apikey"' in shown
    assert client.post("/account/reset").status_code == 403


def test_a_suspended_account_cannot_sign_in_and_is_told_why(requester):
    services.mark_suspended(
        accounts=type(requester.account).objects.filter(pk=requester.account.pk),
        reason="abusive prompts",
        now=requester.account.created_at,
    )
    answer = Client().post("/account", {"apikey": requester.api_key})
    assert answer.status_code == 403
    assert "This account is suspended: abusive prompts." in answer.content.decode()


def test_signing_out_is_a_post_that_ends_the_session(requester):
    client = signed_in(requester)
    assert client.get("/account/sign-out").status_code == 405
    assert f"requester#{requester.account.pk}" in page(client)
    assert client.post("/account/sign-out").status_code == 302
    assert 'name="apikey"' in page(client)
    assert client.post("/account/reset").status_code == 403


def _csrf(client: httpx.Client, url: str) -> str:
    form = client.get(f"{url}/account").text
    return re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form).group(1)


@pytest.mark.parametrize("live_stack", [2], indirect=True)
def test_a_key_reset_on_one_web_process_is_refused_by_every_other_at_once(live_stack, make_caller):
    caller = make_caller("two-processes")
    first, second = live_stack.urls
    for url in live_stack.urls:
        # Each process has seen the old key good on the API and a worker route.
        assert httpx.get(f"{url}/api/v2/find_user", headers={"apikey": caller.api_key}).status_code == 200
        pop = httpx.post(
            f"{url}/api/v2/generate/text/pop",
            headers={"apikey": caller.api_key},
            json={"name": "w", "models": ["m"]},
        )
        assert pop.status_code == 200, pop.text
    with httpx.Client(base_url=first) as browser:
        token = _csrf(browser, first)
        assert (
            browser.post(
                "/account", data={"apikey": caller.api_key, "csrfmiddlewaretoken": token}
            ).status_code
            == 302
        )
        answer = browser.post("/account/reset", data={"csrfmiddlewaretoken": browser.cookies["csrftoken"]})
        assert answer.status_code == 200, answer.text[:500]
        new_key = re.search(r'data-testid="api-key">([^<]+)<', answer.text).group(1)
    for url in live_stack.urls:
        old = {"apikey": caller.api_key}
        assert httpx.get(f"{url}/api/v2/find_user", headers=old).status_code == 401
        refused = httpx.post(
            f"{url}/api/v2/generate/text/pop", headers=old, json={"name": "w", "models": ["m"]}
        )
        assert refused.status_code == 401, refused.text
        new = {"apikey": new_key}
        assert httpx.get(f"{url}/api/v2/find_user", headers=new).status_code == 200
        assert (
            httpx.post(
                f"{url}/api/v2/generate/text/pop", headers=new, json={"name": "w", "models": ["m"]}
            ).status_code
            == 200
        )
    assert second != first
