"""A moderator's act through the horde API, logged in the admin's history (`LogEntry`) as the same
act in the admin is: on the same object, with the admin's words and the account that acted."""

from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth import get_user_model
from django.db.models import Model

from workers.details import unique_alias
from workers.models import Account

# The admin's history needs a Django user: an API moderator's own (signed in through a provider)
# or, for a key's account without one, this inactive one, the account named in the entry.
API_USER = "horde-api"


def _user_id(account: Account) -> int:
    if account.user_id is not None:
        return account.user_id
    user, made = get_user_model().objects.get_or_create(username=API_USER, defaults={"is_active": False})
    if made:  # no one signs in as it
        user.set_unusable_password()
        user.save(update_fields=["password"])
    return user.pk


def log_api_act(account: Account, row: Model, words: str, *, flag: int = CHANGE) -> None:
    """Log `words` (the admin's for the act) on `row`, done through the API by `account`."""
    LogEntry.objects.log_actions(
        user_id=_user_id(account),
        queryset=[row],
        action_flag=flag,
        change_message=f"{words} through the API by {unique_alias(account)}",
        single_object=True,
    )
