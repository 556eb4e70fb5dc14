"""Sign-up, `/register` (`front/signup.py`, `workers.services.sign_up`): a name and a solved
proof of work make a pseudonymous account whose key works; every abuse the issue names is
refused in the page's shape (a form error or a refusal page), never a 500, and makes nothing."""

import base64
import json
import re
from datetime import timedelta
from decimal import Decimal

import altcha
import pytest
from django.test import Client

from front import proof_of_work
from front.signup import TIMED_OUT
from hordeops import clock, errors
from kudos import holds, ledger
from kudos.models import Event, Wallet
from tests.conftest import race
from workers import services
from workers.models import Account, HordeModes, Registration

pytestmark = pytest.mark.django_db

ADDRESS = "203.0.113.9"
SINK = Wallet.System.SINK


@pytest.fixture(autouse=True)
def _quick_puzzles(settings):
    # The browser's puzzle takes about a second; the tests solve theirs in Python, a smaller one.
    settings.SIGNUP_CHALLENGE_MAX_NUMBER = 2000
    settings.REGISTRATIONS_PER_ADDRESS = 3


@pytest.fixture
def browser() -> Client:
    return Client(enforce_csrf_checks=True, REMOTE_ADDR=ADDRESS)


def _challenge(page) -> dict:
    found = re.search(rb'<script id="altcha-challenge" type="application/json">(.*?)</script>', page.content)
    return json.loads(found.group(1))


def _solution(puzzle: dict, **changed) -> str:
    challenge = puzzle
    solved = altcha.solve_challenge_v1(
        challenge["challenge"], challenge["salt"], challenge["algorithm"], challenge["maxNumber"]
    )
    fields = {
        "algorithm": challenge["algorithm"],
        "challenge": challenge["challenge"],
        "number": solved.number,
        "salt": challenge["salt"],
        "signature": challenge["signature"],
        **changed,
    }
    return base64.b64encode(json.dumps(fields).encode()).decode()


def _form(client: Client, username: str, solution: str) -> dict[str, str]:
    return {
        "csrfmiddlewaretoken": client.cookies["csrftoken"].value,
        "username": username,
        "altcha": solution,
    }


def _sign_up(client: Client, username: str = "alice"):
    """Open the page as a browser does, then submit it with the puzzle solved."""
    page = client.get("/register")
    assert page.status_code == 200, page.content
    return client.post("/register", _form(client, username, _solution(_challenge(page))))


def _signed_up():
    return Account.objects.filter(pseudonymous=True)


def _key(answer) -> str:
    found = re.search(rb'data-testid="api-key">([^<]+)<', answer.content)
    assert found, answer.content
    return found.group(1).decode()


def test_a_person_signs_up_and_the_key_shown_once_finds_their_account(browser, client):
    answer = _sign_up(browser, "alice")
    assert answer.status_code == 200
    assert "no-store" in answer["cache-control"]  # the key is in no cache
    assert b'href="/account"' in answer.content
    key = _key(answer)
    account = _signed_up().get()
    found = client.get("/api/v2/find_user", HTTP_APIKEY=key).json()
    assert found["username"] == f"alice#{account.pk}" and found["pseudonymous"] is True
    assert account.pseudonymous and key not in account.api_key_hash
    assert f"alice#{account.pk}".encode() in answer.content


def test_two_people_may_both_be_alice_told_apart_by_their_ids(browser):
    first, second = _key(_sign_up(browser, "alice")), _key(_sign_up(browser, "alice"))
    assert first != second
    assert Account.objects.filter(name="alice").count() == 2


def test_a_replayed_proof_of_work_is_refused_and_makes_nothing(browser):
    page = browser.get("/register")
    form = _form(browser, "alice", _solution(_challenge(page)))
    assert browser.post("/register", form).status_code == 200
    replayed = browser.post("/register", {**form, "username": "mallory"})
    assert replayed.status_code == 400
    assert b"used already" in replayed.content
    assert list(_signed_up().values_list("name", flat=True)) == ["alice"]


def _forged(challenge: dict) -> dict[str, str]:
    wrong_number = json.loads(base64.b64decode(_solution(challenge)))["number"] + 1
    return {
        "a wrong number": _solution(challenge, number=wrong_number),
        "a signature of its own": _solution(challenge, signature="0" * 64),
        "a challenge of its own": _solution(challenge, **{"challenge": "0" * 64}),
        "a number as text": _solution(challenge, number=str(wrong_number)),
        "another algorithm": _solution(challenge, algorithm="SHA-1"),
        "no solution": "",
        "not base64": "%%%not base64%%%",
        "base64 of no JSON": base64.b64encode(b"\xff\xfe").decode(),
        "JSON of no object": base64.b64encode(b"[1, 2]").decode(),
        "a number of JSON": base64.b64encode(b"5").decode(),
        "ten thousand characters": "A" * 10_000,
    }


def test_a_forged_or_missing_proof_of_work_is_a_form_error_and_makes_nothing(browser):
    page = browser.get("/register")
    for what, forged in _forged(_challenge(page)).items():
        answer = browser.post("/register", _form(browser, "mallory", forged))
        assert answer.status_code == 400, what
        assert b"proof of work" in answer.content, what
    assert not _signed_up().exists()


def test_an_expired_proof_of_work_is_refused(browser):
    browser.get("/register")
    old = proof_of_work.challenge(now=clock.now() - proof_of_work.LIFETIME - timedelta(seconds=5))
    answer = browser.post("/register", _form(browser, "late", _solution(old)))
    assert answer.status_code == 400 and b"expired" in answer.content
    assert not _signed_up().exists()


def test_a_sign_up_without_its_csrf_token_is_refused(browser):
    page = browser.get("/register")
    answer = browser.post("/register", {"username": "alice", "altcha": _solution(_challenge(page))})
    assert answer.status_code == 403
    assert not _signed_up().exists()


@pytest.mark.parametrize(
    "name, why",
    [
        ("", "This field is required."),
        ("   ", "This field is required."),
        ("a" * 31, "at most 30 characters"),
        ("a" * 10_000, "at most 30 characters"),
        ("ali\x00ce", "Null characters are not allowed."),
        ("ali\x07ce", "control characters"),
        ("alice\u202egnp.exe", "control characters"),  # a right-to-left override
    ],
    ids=["empty", "blank", "31 characters", "10,000 characters", "a NUL", "a bell", "an override"],
)
def test_a_name_empty_too_long_or_with_control_characters_is_a_form_error(browser, name, why):
    answer = _sign_up(browser, name)
    assert answer.status_code == 400
    assert why.encode() in answer.content
    assert not _signed_up().exists()


def test_a_name_of_thirty_characters_with_any_script_is_taken(browser):
    name = "Zoë_名前-" + "x" * 23
    assert len(name) == 30
    assert _sign_up(browser, name).status_code == 200
    assert _signed_up().get().name == name


def test_an_address_makes_at_most_its_accounts_a_day_then_is_refused(browser, time_machine):
    time_machine.move_to("2026-03-01T12:00:00+00:00", tick=False)
    for n in range(3):
        assert _sign_up(browser, f"flood-{n}").status_code == 200
    refused = _sign_up(browser, "flood-3")
    assert refused.status_code == 429
    assert b"at most 3 accounts may be made from one address" in refused.content
    # The same /64 is the same address; another address has its own places.
    assert _sign_up(Client(enforce_csrf_checks=True, REMOTE_ADDR="2001:db8::1"), "v6").status_code == 200
    assert _sign_up(Client(enforce_csrf_checks=True, REMOTE_ADDR="198.51.100.4"), "other").status_code == 200
    assert _signed_up().count() == 5
    # A day later the address has its places again, and the day-old rows are gone.
    time_machine.shift(timedelta(days=1, seconds=1))
    assert _sign_up(browser, "next-day").status_code == 200
    assert list(Registration.objects.values_list("address", flat=True)) == [ADDRESS]


def test_an_ipv6_address_counts_with_its_whole_64(settings):
    settings.REGISTRATIONS_PER_ADDRESS = 1
    services.sign_up(name="first", address="2001:db8::1", now=clock.now())
    with pytest.raises(errors.TooManyRegistrations):
        services.sign_up(name="second", address="2001:db8::ffff", now=clock.now())


def test_loopback_is_not_limited_and_zero_turns_the_limit_off(settings):
    for n in range(4):
        services.sign_up(name=f"local-{n}", address="127.0.0.1", now=clock.now())
    settings.REGISTRATIONS_PER_ADDRESS = 0
    for n in range(4):
        services.sign_up(name=f"open-{n}", address=ADDRESS, now=clock.now())
    assert _signed_up().count() == 8


@pytest.mark.django_db(transaction=True)
def test_two_sign_ups_at_once_for_the_last_place_make_one_account(settings):
    settings.REGISTRATIONS_PER_ADDRESS = 3
    for n in range(2):
        services.sign_up(name=f"early-{n}", address=ADDRESS, now=clock.now())
    racers = [
        lambda n=n: services.sign_up(name=f"racer-{n}", address=ADDRESS, now=clock.now()) for n in range(2)
    ]
    results = race(*racers, return_exceptions=True)
    assert sorted(type(result).__name__ for result in results) == ["TooManyRegistrations", "tuple"]
    assert _signed_up().count() == 3
    assert Registration.objects.count() == 3


def test_a_timed_out_address_is_refused_with_the_ai_hordes_page(browser):
    page = browser.get("/register")
    now = clock.now()
    services.time_out_address(network=ADDRESS, until=now + timedelta(hours=1), by="mod", now=now)
    form = _form(browser, "alice", _solution(_challenge(page)))
    for answer in (browser.get("/register"), browser.post("/register", form)):
        assert answer.status_code == 403
        assert TIMED_OUT.encode() in answer.content
        assert answer["retry-after"] == "3600"
    assert not _signed_up().exists()
    # Another address signs up still.
    assert _sign_up(Client(enforce_csrf_checks=True, REMOTE_ADDR="198.51.100.4")).status_code == 200


def test_raid_mode_closes_sign_up_with_the_ai_hordes_words(browser):
    page = browser.get("/register")
    HordeModes.objects.update_or_create(pk=1, defaults={"raid": True})
    form = _form(browser, "alice", _solution(_challenge(page)))
    for answer in (browser.get("/register"), browser.post("/register", form)):
        assert answer.status_code == 403
        assert b"We cannot allow anonymous registrations at the moment" in answer.content
    assert not _signed_up().exists()


def test_a_signed_up_accounts_kudos_floor_is_the_ai_hordes_fourteen(browser):
    account = Account.objects.get(pk=services.sign_up(name="pseudo", address=ADDRESS, now=clock.now())[0].pk)
    ledger.post(
        kind=Event.Kind.SPEND,
        key="spend:pseudo",
        entries=[ledger.to_account(account.pk, Decimal(-5)), ledger.to_system(SINK, Decimal(5))],
    )
    wallet = Wallet.objects.get(account=account, escrow=False)
    assert (wallet.floor, wallet.balance) == (Decimal(14), Decimal(14))
    assert holds.available(account_id=account.pk, pseudonymous=True) == 0
    operators, _ = services.create_account(name="made-by-hand")
    assert not operators.pseudonymous  # an operator's account keeps the registered floor, 25
