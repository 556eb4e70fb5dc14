"""`manage.py create_moderator`: a staff user in the Moderators group, without a shell session."""

from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command

from workers.models import Account
from workers.moderation import MODERATORS

PASSWORD = "a long horde passphrase"


def _create(name: str) -> str:
    out = StringIO()
    call_command("create_moderator", name, stdout=out)
    return out.getvalue()


def test_a_moderator_is_staff_in_the_moderators_group_and_runs_the_admin(db, client, monkeypatch):
    monkeypatch.setenv("MODERATOR_PASSWORD", PASSWORD)
    assert "Created moderator mia" in _create("mia")
    user = User.objects.get(username="mia")
    assert (user.is_staff, user.is_superuser) == (True, False)
    assert list(user.groups.values_list("name", flat=True)) == [MODERATORS]
    assert client.login(username="mia", password=PASSWORD)
    account = Account.objects.create(name="someone", api_key_hash="x" * 64)
    assert client.get("/admin/workers/account/").status_code == 200
    assert client.get(f"/admin/workers/account/{account.pk}/change/").status_code == 200


def test_without_a_password_or_a_terminal_it_refuses_and_creates_nothing(db, monkeypatch):
    monkeypatch.delenv("MODERATOR_PASSWORD", raising=False)
    monkeypatch.setattr("sys.stdin.isatty", lambda: False)
    with pytest.raises(CommandError, match="MODERATOR_PASSWORD"):
        _create("mia")
    assert not User.objects.exists()


def test_in_a_terminal_the_password_is_asked_for_twice(db, monkeypatch):
    monkeypatch.delenv("MODERATOR_PASSWORD", raising=False)
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    answers = iter([PASSWORD, PASSWORD + " typo"])
    monkeypatch.setattr("getpass.getpass", lambda prompt: next(answers))
    with pytest.raises(CommandError, match="differ"):
        _create("mia")
    answers = iter([PASSWORD, PASSWORD])
    _create("mia")
    assert User.objects.get(username="mia").check_password(PASSWORD)


@pytest.mark.parametrize("password", ["short", "password1234", "123456789012", "mia-mia-mia-mia"])
def test_a_weak_password_is_refused(db, monkeypatch, password):
    monkeypatch.setenv("MODERATOR_PASSWORD", password)
    with pytest.raises(CommandError, match="refused"):
        _create("mia-mia-mia")
    assert not User.objects.exists()


def test_a_taken_name_is_refused(db, monkeypatch):
    monkeypatch.setenv("MODERATOR_PASSWORD", PASSWORD)
    _create("mia")
    with pytest.raises(CommandError, match="already exists"):
        _create("mia")
    assert User.objects.count() == 1
