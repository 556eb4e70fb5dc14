"""`manage.py create_account` and API keys."""

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from workers.models import Account, hash_api_key
from workers.services import authenticate


def _create(*args: str) -> str:
    out = StringIO()
    call_command("create_account", *args, stdout=out)
    return out.getvalue()


def test_it_prints_the_new_key_alone_on_the_last_line(db):
    output = _create("alice")
    api_key = output.strip().splitlines()[-1]
    assert len(api_key) == 22
    assert authenticate(api_key=api_key).name == "alice"


def test_the_key_is_stored_only_as_a_hash(db):
    api_key = _create("bob").strip().splitlines()[-1]
    account = Account.objects.get(name="bob")
    assert account.api_key_hash == hash_api_key(api_key)
    assert api_key not in account.api_key_hash
    assert account.trusted is False


def test_trusted_creates_a_trusted_account(db):
    _create("carol", "--trusted")
    assert Account.objects.get(name="carol").trusted is True


def test_a_taken_name_is_a_command_error(db):
    _create("dave")
    with pytest.raises(CommandError, match="already exists"):
        _create("dave")


def test_the_anonymous_key_belongs_to_the_anonymous_account(db):
    assert authenticate(api_key="0000000000").is_anonymous is True


def test_no_key_starts_with_a_dash_that_a_command_line_would_read_as_an_option():
    from workers.models import new_api_key

    keys = [new_api_key() for _ in range(3000)]  # about 47 would start with "-" unchecked
    assert not [key for key in keys if key.startswith("-")]
    assert len(set(keys)) == len(keys) and all(len(key) == 22 for key in keys)
