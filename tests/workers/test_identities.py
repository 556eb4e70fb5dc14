"""The account a provider's identity signs in to (`workers.identities.account_for_identity`)."""

import pytest
from django.contrib.auth.models import User

from tests.conftest import race
from workers.identities import account_for_identity
from workers.models import Account, hash_api_key


@pytest.mark.django_db(transaction=True)
def test_two_sign_ins_of_one_identity_at_once_make_one_account():
    user = User.objects.create_user("ada-1815")
    signed = race(*[lambda: account_for_identity(user_id=user.pk, name="ada", reregister=False)] * 2)
    assert Account.objects.filter(user=user).count() == 1
    assert sorted(sign_in.made for sign_in in signed) == [False, True]
    made = next(sign_in for sign_in in signed if sign_in.made)
    assert Account.objects.get(user=user).api_key_hash == hash_api_key(made.api_key)


@pytest.mark.django_db
def test_a_re_registration_changes_the_key_and_nothing_else():
    user = User.objects.create_user("ada-1815")
    first = account_for_identity(user_id=user.pk, name="ada", reregister=False)
    again = account_for_identity(user_id=user.pk, name="someone else", reregister=True)
    assert again.account.pk == first.account.pk and not again.made
    stored = Account.objects.get(pk=first.account.pk)
    assert stored.name == "ada" and stored.api_key_hash == hash_api_key(again.api_key)
