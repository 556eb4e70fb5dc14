"""The account a provider's identity signs in to (OAuth, `front/oauth.py`), as the AI Horde keeps
one user per OAuth id: made at its first sign-in, with a key shown once; the same account at
every later one; and a new key when the person signs up again, the AI Horde's "re-register".
"""

from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.db import transaction

from workers.models import Account
from workers.services import create_account, refuse_suspended, reset_api_key


@dataclass(frozen=True)
class SignIn:
    account: Account
    api_key: str  # to show once: the new account's, a re-registered one's; "" when the key stands
    made: bool  # the account was made by this sign-in


def account_for_identity(*, user_id: int, name: str, reregister: bool) -> SignIn:
    """The account of the Django user `user_id` (allauth's, holding the identity), and its key
    when this sign-in made or re-registered it. A suspended account is refused (403
    `AccountSuspended`) and keeps its key."""
    with transaction.atomic():
        # Two sign-ins of one identity at once (two tabs) make one account, not two.
        get_user_model().objects.select_for_update().filter(pk=user_id).get()
        account = Account.objects.filter(user_id=user_id).first()
        if account is None:
            account, api_key = create_account(name=name)
            Account.objects.filter(pk=account.pk).update(user_id=user_id)
            account.user_id = user_id
            return SignIn(account, api_key, made=True)
        refuse_suspended(account)
        if not reregister:
            return SignIn(account, "", made=False)
        api_key = reset_api_key(account=account)
        account.refresh_from_db(fields=["api_key_hash"])
        return SignIn(account, api_key, made=False)
