"""Service accounts and their proxy passkeys (the AI Horde's `service` role and `proxy_passkey`).

A service account (`Account.service`, set by a moderator) is a front end that sends requests
for its own users. It names the user in each request's `proxied_account`, which the request
keeps; any other account that sends one is refused (400 `OnlyServiceAccountProxy`).

It may also hold a proxy passkey, made by a moderator in the admin and shown once (only its
hash is kept). A request that carries a known passkey in `Proxy-Authorization` is taken to come
from the address in its `Proxied-For` header (`Proxy-For` too): its user's, not the front end's,
so that timeouts, rate limits and the workers-per-address limit hold each user apart, as the AI
Horde's `get_remoteaddr` does. Known: the passkey of a service account that is neither
suspended nor flagged (the AI Horde leaves flagged users' passkeys out).

Each process keeps the hashes of the known passkeys, read at most every SNAPSHOT_SECONDS (the
AI Horde's cache refreshes every 5 s) and only when a request carries a passkey: a passkey made
or dropped here is seen at once, in other processes within that.
"""

import threading
import time

from django.db import connection, transaction

from hordeops import errors
from workers.models import Account, hash_api_key, new_api_key

SNAPSHOT_SECONDS = 5

_lock = threading.Lock()
_snapshot: tuple[float, frozenset[str]] | None = None


def _known_hashes() -> frozenset[str]:
    global _snapshot
    snapshot = _snapshot
    if snapshot is not None and time.monotonic() - snapshot[0] < SNAPSHOT_SECONDS:
        return snapshot[1]
    hashes = frozenset(
        Account.objects.filter(
            service=True, proxy_passkey_hash__isnull=False, suspended_at=None, flagged_at=None
        ).values_list("proxy_passkey_hash", flat=True)
    )
    if not connection.in_atomic_block:
        # Read in whatever thread the request's middleware runs on, which may then wait on a
        # stream for minutes: the connection goes back now, not when the response ends.
        connection.close()
    with _lock:
        _snapshot = (time.monotonic(), hashes)
    return hashes


def is_known_passkey(passkey: str) -> bool:
    """Whether `passkey` is a service account's proxy passkey (registered with
    `hordeops.ratelimit.register_proxy_passkeys`, which reads `Proxied-For` only then)."""
    return bool(passkey) and hash_api_key(passkey) in _known_hashes()


def make_passkey(*, account: Account) -> str:
    """A new proxy passkey for a service account, replacing any it had; returned once."""
    if not account.service:
        raise errors.NonServiceForbidden()
    passkey = new_api_key()
    with transaction.atomic():
        Account.objects.filter(pk=account.pk).update(proxy_passkey_hash=hash_api_key(passkey))
    account.proxy_passkey_hash = hash_api_key(passkey)
    forget()
    return passkey


def forget(**kwargs) -> None:
    """Drop this process's snapshot (on an account's save, and between tests)."""
    global _snapshot
    with _lock:
        _snapshot = None
