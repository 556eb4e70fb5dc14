"""Failed admin logins are bounded per client address and per user name from an address, logged,
and can be unlocked: a moderator's password cannot be tried without end, and nobody can lock a
moderator out of the admin from elsewhere."""

import logging
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client

LOGIN = "/admin/login/?next=/admin/"
PASSWORD = "the right horde passphrase"


@pytest.fixture
def moderator_user(db, settings):
    settings.ADMIN_LOGIN_FAILURES_PER_USER = 3
    settings.ADMIN_LOGIN_FAILURES_PER_ADDRESS = 5
    return User.objects.create_user("mia", password=PASSWORD, is_staff=True)


def _login(username: str, password: str, address: str = "203.0.113.7"):
    client = Client(REMOTE_ADDR=address)
    return client, client.post(LOGIN, {"username": username, "password": password})


def _logged_in(client) -> bool:
    return client.get("/admin/").status_code == 200


def test_past_the_bound_for_a_user_from_an_address_even_the_right_password_is_refused_from_it(
    moderator_user,
):
    for _ in range(3):
        _, answer = _login("mia", "wrong")
        assert answer.status_code == 200  # the form again, with Django's error
    client, answer = _login("mia", PASSWORD)
    assert answer.status_code == 429
    assert "Too many failed logins for this user from this address" in answer.content.decode()
    assert not _logged_in(client)
    out = StringIO()
    call_command("unlock_logins", "--user", "mia", stdout=out)
    assert "Cleared 2" in out.getvalue()  # from that address, and from anywhere
    client, answer = _login("mia", PASSWORD)
    assert answer.status_code == 302 and _logged_in(client)


def test_nobody_can_lock_a_moderator_out_from_another_address(moderator_user):
    # Every window, an attacker fails the moderator's name from addresses of its own.
    for attacker in range(1, 8):
        for _ in range(3):
            _login("mia", "wrong", address=f"198.51.100.{attacker}")
    client, answer = _login("mia", PASSWORD, address="203.0.113.50")  # the owner, who has not failed
    assert answer.status_code == 302 and _logged_in(client)


def test_a_name_under_attack_leaves_each_address_two_tries_at_it(moderator_user, settings):
    settings.ADMIN_LOGIN_FAILURES_PER_USER_TOTAL = 6
    for attacker in range(1, 4):
        for _ in range(2):
            _login("mia", "wrong", address=f"198.51.100.{attacker}")  # 6 in all: under attack
    assert _login("mia", PASSWORD, address="198.51.100.1")[1].status_code == 429
    _login("mia", "typo", address="203.0.113.60")  # the owner's one typo is forgiven
    assert _login("mia", PASSWORD, address="203.0.113.60")[1].status_code == 302


def test_an_ipv6_address_counts_as_its_slash_64(moderator_user):
    for i in range(1, 6):
        _login(f"name-{i}", "wrong", address=f"2001:db8:0:7::{i}")
    _, answer = _login("mia", PASSWORD, address="2001:db8:0:7::99")
    assert answer.status_code == 429 and "from this address" in answer.content.decode()


def test_past_the_bound_for_an_address_every_name_is_refused_from_it(moderator_user):
    for name in ("a", "b", "c", "d", "e"):
        _login(name, "wrong")
    client, answer = _login("mia", PASSWORD)
    assert answer.status_code == 429 and "from this address" in answer.content.decode()
    assert not _logged_in(client)
    client, answer = _login("mia", PASSWORD, address="198.51.100.9")  # elsewhere: served
    assert answer.status_code == 302 and _logged_in(client)
    call_command("unlock_logins", "--address", "203.0.113.7", stdout=StringIO())
    assert _login("mia", PASSWORD)[1].status_code == 302


def test_a_successful_login_clears_its_names_count(moderator_user):
    for _ in range(2):
        _login("mia", "wrong")
    assert _login("mia", PASSWORD)[1].status_code == 302
    for _ in range(2):
        _login("mia", "wrong")
    assert _login("mia", PASSWORD)[1].status_code == 302  # 2 + 2 failures, never 3 in a row


def test_the_lockout_lasts_the_window_from_the_first_failure(moderator_user, settings):
    from django_redis import get_redis_connection

    from hordeops import logins

    settings.ADMIN_LOGIN_WINDOW_SECONDS = 600
    _login("mia", "wrong")
    keys = logins._keys("203.0.113.7", "mia")
    redis = get_redis_connection("default")
    assert all(590 <= redis.ttl(key) <= 600 for key in keys.values())
    redis.expire(keys["pair"], 100)
    _login("mia", "wrong")  # a later failure does not extend the window
    assert redis.ttl(keys["pair"]) <= 100


def test_failures_are_logged_with_the_name_and_address_never_the_password(moderator_user, caplog):
    caplog.set_level(logging.INFO)
    _login("mia", "my-secret-guess")
    failed = [r.getMessage() for r in caplog.records if r.name == "hordeops.logins"]
    assert failed == ["admin login failed for user 'mia' from 203.0.113.7"]
    assert not any("my-secret-guess" in r.getMessage() for r in caplog.records)


def test_a_login_whose_next_is_refused_lands_on_the_admin(moderator_user):
    for unsafe in ("https://attacker.example/", "//attacker.example/admin/", "javascript:alert(1)"):
        client = Client(REMOTE_ADDR="203.0.113.8")
        answer = client.post("/admin/login/", {"username": "mia", "password": PASSWORD, "next": unsafe})
        assert (answer.status_code, answer["Location"]) == (302, "/admin/"), unsafe
        assert client.get(answer["Location"]).status_code == 200
