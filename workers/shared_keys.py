"""Shared keys (`workers.models.SharedKey`), as the AI Horde's `/v2/sharedkeys` rules them: an
account makes a few, each spending its kudos within a budget, until an expiry, within a token
cap per request; and the account a requester route's key spends for.

A shared key is told from an account's key by its form alone: it is a UUID, which an account's
key never is (`new_api_key`: 22 characters), so each key is looked up once, in one table.
Spending the budget is the queueing's (`jobs.services.requests`, with `workers.sql.spend_shared_key`).

The services that make, change and delete keys take the owner `Account`, whoever found it: the
routes from the `apikey` header (`caller`), the account page from its session. An `Account` is
never a shared key, so a shared key cannot make or change keys by either way.
"""

from datetime import datetime, timedelta
from decimal import Decimal
from email.utils import formatdate
from typing import Any
from uuid import UUID

from django.db import transaction

from hordeops import clock, errors, ratelimit
from workers.details import unique_alias
from workers.models import ANONYMOUS_API_KEY_HASH, Account, SharedKey
from workers.services import authenticate, key_account, refuse_suspended

# How many shared keys an account may have (the AI Horde's `max_sharedkeys`).
MAX_KEYS = 3
MAX_KEYS_TRUSTED = 10
# A key's settings are bounded as the AI Horde's `SharedKeyInput` bounds them, on every way in:
# a budget of at most MAX_KUDOS, an expiry at most MAX_EXPIRY_DAYS (about 100 years) away, a cap
# of at most MAX_TEXT_TOKENS; each may be -1 (unlimited, never, no cap).
MAX_KUDOS = 50_000_000
MAX_EXPIRY_DAYS = 36_500
MAX_TEXT_TOKENS = 1_048_576
BOUNDS = {"kudos": MAX_KUDOS, "expiry": MAX_EXPIRY_DAYS, "max_text_tokens": MAX_TEXT_TOKENS}
# A name, when it has one.
NAME_LENGTH = (3, 255)
# The AI Horde's limit on making shared keys: 5 a minute (per account here).
CREATIONS = (5 / 60, 5)


def shared_key_id(api_key: str | None) -> UUID | None:
    """The shared key a key names, if it has a UUID's form (36 characters), else None."""
    if not api_key or len(api_key) != 36:
        return None
    try:
        return UUID(api_key)
    except ValueError:
        return None


def find(api_key: str | None) -> SharedKey | None:
    """The shared key `api_key` names, with its owner; None if it names none."""
    key_id = shared_key_id(api_key)
    if key_id is None:
        return None
    return SharedKey.objects.select_related("account").filter(pk=key_id).first()


def key_holder(*, api_key: str | None) -> tuple[Account, SharedKey | None]:
    """The account a requester route's key spends for, and the shared key it spends through
    (None for an account's own key). One statement: a shared key's form is looked up as one
    (unknown: 401 `InvalidAPIKey`, "No user matching sent Shared Key."), any other key as an
    account's (`key_account`). A suspended owner is returned: the admission refuses it."""
    if shared_key_id(api_key) is None:
        return key_account(api_key=api_key), None
    key = find(api_key)
    if key is None:
        raise errors.SharedKeyNotFound()
    return key.account, key


def refusal(key: SharedKey, *, now: datetime) -> errors.DomainError | None:
    """Why the key may spend nothing now (the AI Horde's `is_valid`): its budget is spent, or
    it has expired; None if it may."""
    if key.kudos == 0:
        return errors.SharedKeyEmpty()
    if key.is_expired(now):
        return errors.SharedKeyExpired()
    return None


def spender(
    account: Account, key: SharedKey | None, *, now: datetime, allow_downgrade: bool
) -> tuple[Account, SharedKey | None]:
    """The account a request spends for and the key it spends through, once the key's state is
    checked: a spent key with `allow_downgrade` falls back to the anonymous account, as the AI
    Horde's does; a spent or expired key is otherwise refused (403)."""
    if key is None:
        return account, None
    refused = refusal(key, now=now)
    if refused is None:
        return account, key
    if isinstance(refused, errors.SharedKeyEmpty) and allow_downgrade:
        anonymous = Account.objects.filter(api_key_hash=ANONYMOUS_API_KEY_HASH).first()
        if anonymous is not None:  # a horde without the anonymous account has nothing to fall to
            return anonymous, None
    raise refused


def within_cap(key: SharedKey | None, *, tokens: int) -> None:
    """Refuse a request for more tokens than the key's cap (400, the AI Horde's words)."""
    if key is not None and key.max_text_tokens != SharedKey.UNLIMITED and tokens > key.max_text_tokens:
        raise errors.BadRequest(
            f"This shared key is limited to {key.max_text_tokens} tokens per job. "
            f"You requested {tokens} tokens."
        )


def covers(key: SharedKey | None, *, cost: Decimal) -> None:
    """Refuse a request that costs more than what is left of the key's budget, as it was read
    (the queueing checks it again, under the owner's lock, as it spends it)."""
    if key is not None and key.kudos != SharedKey.UNLIMITED and key.kudos < cost:
        raise errors.SharedKeyInsufficientKudos(remaining=whole(key.kudos), required=cost)


def whole(amount: Decimal) -> int:
    """A budget or what was used, as the AI Horde answers it: an integer."""
    return int(amount)


def details(key: SharedKey) -> dict[str, Any]:
    """The AI Horde's `SharedKeyDetails`. The image limits bind nothing on a text horde: -1.
    `expiry` is left out when there is none, as the AI Horde leaves out a null; written as its
    RFC 822 date."""
    answer: dict[str, Any] = {
        "id": str(key.pk),
        "username": unique_alias(key.account),
        "name": key.name,
        "kudos": whole(key.kudos),
        "utilized": whole(key.utilized),
        "max_image_pixels": SharedKey.UNLIMITED,
        "max_image_steps": SharedKey.UNLIMITED,
        "max_text_tokens": key.max_text_tokens,
    }
    if key.expiry is not None:
        answer["expiry"] = formatdate(key.expiry.timestamp())
    return answer


def username(key: SharedKey) -> str:
    """The AI Horde's `find_user` name for a shared key: `owner#id (Shared Key: name)`."""
    named = f": {key.name}" if key.name else ""
    return f"{unique_alias(key.account)} (Shared Key{named})"


def _expiry(days: int, now: datetime) -> datetime | None:
    return None if days == SharedKey.UNLIMITED else now + timedelta(days=days)


def _within_bounds(settings: dict[str, Any]) -> None:
    """Refuse a setting out of bounds (400): the route's body and the page's form check them
    first, field by field; this holds for any other caller."""
    for field, most in BOUNDS.items():
        value = settings.get(field)
        if value is not None and not SharedKey.UNLIMITED <= value <= most:
            raise errors.BadRequest(f"{field} must be from -1 to {most}.")
    name = settings.get("name")
    shortest, longest = NAME_LENGTH
    if name and not shortest <= len(name) <= longest:
        raise errors.BadRequest(f"A shared key's name is {shortest} to {longest} characters long.")


def allowed(account: Account) -> int:
    """How many shared keys the account may have."""
    return MAX_KEYS_TRUSTED if account.trusted else MAX_KEYS


def caller(*, api_key: str | None, key_id: str | None = None) -> Account:
    """The account whose key a shared-key route was sent with (a shared key is no account's
    key: 401). With `key_id`, the route about one key tells an unknown key first, as the AI
    Horde's does (401 "No user matching sent Shared Key."), then a bad caller's key."""
    if key_id is not None and find(key_id) is None:
        raise errors.SharedKeyNotFound()
    return authenticate(api_key=api_key)


def take_rate(*, account_id: int) -> None:
    """Spend one of the account's key creations (`CREATIONS`), on the route and the account
    page alike, or refuse (429) with the wait."""
    rate, burst = CREATIONS
    if wait := ratelimit.take([ratelimit.Bucket(f"hordeops:rate:sharedkeys:{account_id}", rate, burst)]):
        raise errors.RateLimited(wait_seconds=wait, refusal="rate_limit")


def create_shared_key(
    *,
    owner: Account,
    kudos: int = 5000,
    expiry: int = -1,
    name: str = "",
    max_text_tokens: int = -1,
    now: datetime,
) -> SharedKey:
    """PUT /api/v2/sharedkeys: a new key of `owner`'s (not the anonymous account: 403), at
    most `allowed` each, counted under the account's row lock so that two at once cannot pass.
    `expiry` is in days from now, -1 for never. The creation rate is `take_rate`'s."""
    if owner.is_anonymous:
        raise errors.AnonForbidden()
    _within_bounds({"kudos": kudos, "expiry": expiry, "name": name, "max_text_tokens": max_text_tokens})
    most = allowed(owner)
    with transaction.atomic():
        Account.objects.select_for_update(no_key=True).filter(pk=owner.pk).exists()
        if SharedKey.objects.filter(account=owner).count() >= most:
            raise errors.Forbidden(f"You cannot have more than {most} shared keys.")
        key = SharedKey.objects.create(
            account=owner,
            kudos=kudos,
            expiry=_expiry(expiry, now),
            name=name,
            max_text_tokens=max_text_tokens,
            created_at=now,
        )
    return key


def _owned(owner: Account, key_id: str) -> SharedKey:
    """The key `key_id` names, if `owner`'s (unknown: 401; another account's: 403 `Forbidden`)."""
    key = find(key_id)
    if key is None:
        raise errors.SharedKeyNotFound()
    if key.account_id != owner.pk:
        raise errors.Forbidden(
            f"Shared Key {key.pk} belongs to {unique_alias(key.account)} and not to {unique_alias(owner)}."
        )
    return key


def modify_shared_key(
    *,
    owner: Account,
    key_id: str,
    now: datetime,
    kudos: int | None = None,
    expiry: int | None = None,
    name: str | None = None,
    max_text_tokens: int | None = None,
) -> SharedKey:
    """PATCH /api/v2/sharedkeys/{id}: set what is given (not None) of `kudos`, `expiry` (days
    from now, -1 never), `name`, `max_text_tokens` on `owner`'s key; none: 400
    NoSharedKeyModSelected."""
    key = _owned(owner, key_id)
    changes = {"kudos": kudos, "expiry": expiry, "name": name, "max_text_tokens": max_text_tokens}
    given = {field: value for field, value in changes.items() if value is not None}
    if not given:
        raise errors.NoSharedKeyModSelected()
    _within_bounds(given)
    if "expiry" in given:
        given["expiry"] = _expiry(given["expiry"], now)
    SharedKey.objects.filter(pk=key.pk).update(**given)
    key.refresh_from_db()
    return key


def delete_shared_key(*, owner: Account, key_id: str) -> None:
    """DELETE /api/v2/sharedkeys/{id}: `owner`'s key, refused from then on (401 "No user
    matching sent Shared Key."); what it queued before stays queued, paid for."""
    delete_shared_keys(key_ids=[_owned(owner, key_id).pk])


def delete_shared_keys(*, key_ids: list[UUID]) -> int:
    """Delete these keys, whoever owns them (a moderator's, in the admin): each is refused on
    every route from then on, as its owner's deletion makes it. Returns how many were."""
    deleted, _ = SharedKey.objects.filter(pk__in=key_ids).delete()
    return deleted


def for_requester(*, api_key: str | None) -> Account:
    """The account a key stands for on the routes that read for a requester (`/v1/models`,
    `count_tokens`): its own, or a shared key's owner while the key may spend."""
    account, key = key_holder(api_key=api_key)
    refuse_suspended(account)
    if key is not None and (refused := refusal(key, now=clock.now())) is not None:
        raise refused
    return account
