import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pytest
from django.core.cache import cache
from django.db import connections
from rest_framework.test import APIClient

from tests.identity_provider import oidc_provider  # noqa: F401
from tests.live import (  # noqa: F401
    live_stack,
    patroni_cluster,
    pgbouncer,
    private_postgres,
    private_redis,
    sentinel_redis,
    streaming_replica,
)
from workers.models import ANONYMOUS_API_KEY, ANONYMOUS_NAME, Account, hash_api_key
from workers.services import create_account


@pytest.fixture(scope="session", autouse=True)
def _empty_test_redis() -> None:
    # bin/test points REDIS_URL at a database of its own; start each run from empty, but
    # never empty database 0, where a running stack keeps its broker and cache.
    client = cache.client.get_client(write=True)
    if client.connection_pool.connection_kwargs.get("db", 0) != 0:
        client.flushdb()


@pytest.fixture(autouse=True)
def _no_cached_discovery() -> None:
    # The discovery routes, the queue position and the worker list cache for seconds
    # (jobs/discovery.py, jobs/status.py, workers/details.py): each test starts without another's.
    from jobs import discovery, status
    from workers import details

    cache.delete_many([*discovery.CACHE_KEYS, status.POSITION_MARKERS_KEY, details.ONLINE_LIST_KEY])


@pytest.fixture(autouse=True)
def _no_model_sizes_of_another_test() -> None:
    # Each process keeps a snapshot of the model table (kudos/sizes.py), of the horde's modes
    # (workers/modes.py) and of the proxy passkeys (workers/proxies.py); a rolled-back test's
    # rows would outlive it there.
    from kudos import sizes
    from workers import messages, modes, proxies

    sizes.forget()
    modes.forget()
    messages.forget()
    proxies.forget()


@pytest.fixture(autouse=True)
def _no_address_timeouts() -> None:
    # The routes check timeouts from Redis, through a per-process snapshot (hordeops/timeouts.py):
    # a rolled-back test's timeouts would outlive it in both.
    from hordeops import timeouts

    cache.client.get_client(write=True).delete(timeouts.KEY)
    timeouts.forget()


@pytest.fixture(autouse=True)
def _no_login_failures() -> None:
    # Failed admin logins count in Redis for 15 minutes (hordeops/logins.py): each test starts
    # with none of another's.
    from hordeops import logins

    client = cache.client.get_client(write=True)
    for key in client.scan_iter(match=logins.KEY_PREFIX + "*"):
        client.delete(key)


@pytest.fixture(autouse=True)
def _no_remembered_keys() -> None:
    # Each web process remembers bad keys on the worker routes (hordeops/ratelimit.py
    # KeyMemory); the test process is one, and each test starts with nothing remembered.
    from hordeops import ratelimit

    ratelimit.key_memory.clear()


@pytest.fixture(autouse=True)
def _no_rate_limits(settings) -> None:
    # Tests send far more requests from 127.0.0.1 than one client may; the rate limits' own
    # tests (tests/hordeops/test_rate_limits.py) turn them back on.
    settings.KEY_RATE_PER_SECOND = 0
    settings.ADDRESS_RATE_PER_SECOND = 0


@pytest.fixture(autouse=True)
def _skipped_counted_at_every_pop(settings) -> None:
    # Tests change the queue between two pops a second apart and read `skipped` again; the
    # reuse of an empty pop's counts has tests of its own (tests/jobs/test_pop_generation.py).
    settings.POP_SKIPPED_CACHE_SECONDS = 0


@pytest.fixture
def clock(request, time_machine):
    """The test clock, stopped at its module's `T0` (the lease tests move it by hand)."""
    time_machine.move_to(request.module.T0, tick=False)
    return time_machine


@dataclass
class Caller:
    """An account with its API key, and a client that speaks the horde routes as it."""

    account: Account
    api_key: str
    client: APIClient

    def post(self, path: str, body: Any, **headers: str):
        return self.client.post(path, body, format="json", HTTP_APIKEY=self.api_key, **headers)

    def request_text(self, prompt: str = "Once upon a time", **body: Any):
        return self.post("/api/v2/generate/text/async", {"prompt": prompt, **body})

    def pop(self, name: str = "worker-1", models: list[str] | None = None, **body: Any):
        return self.post("/api/v2/generate/text/pop", {"name": name, "models": models or ["m1"], **body})

    def submit(self, generation_id: str, generation: str = "The end.", **body: Any):
        return self.post(
            "/api/v2/generate/text/submit", {"id": str(generation_id), "generation": generation, **body}
        )

    def status(self, request_id: str):
        return self.client.get(f"/api/v2/generate/text/status/{request_id}")


@pytest.fixture
def make_caller(db) -> Callable[..., Caller]:
    def make(name: str | None = None, *, trusted: bool = False) -> Caller:
        account, api_key = create_account(name=name or f"acct-{uuid.uuid4().hex[:8]}", trusted=trusted)
        return Caller(account=account, api_key=api_key, client=APIClient())

    return make


@pytest.fixture
def anonymous(db) -> Caller:
    # A transactional test empties every table, the migration-made Anonymous account too.
    account, _ = Account.objects.get_or_create(
        name=ANONYMOUS_NAME, defaults={"api_key_hash": hash_api_key(ANONYMOUS_API_KEY)}
    )
    return Caller(account=account, api_key=ANONYMOUS_API_KEY, client=APIClient())


@pytest.fixture
def requester(make_caller) -> Caller:
    return make_caller("requester")


@pytest.fixture
def owner(make_caller) -> Caller:
    """An untrusted account that runs workers."""
    return make_caller("owner")


@pytest.fixture
def trusted_owner(make_caller) -> Caller:
    return make_caller("trusted-owner", trusted=True)


def give_kudos(caller: Caller, amount: str = "100000", *, reason: str = "") -> None:
    """Award `caller`'s account kudos, minted: enough to queue requests that need them upfront."""
    from kudos import ledger
    from kudos.models import Event, Wallet

    ledger.post(
        kind=Event.Kind.AWARD,
        key=f"award:{caller.account.pk}:{uuid.uuid4()}",
        entries=[
            ledger.to_system(Wallet.System.TREASURY, -Decimal(amount)),
            ledger.to_account(caller.account.pk, Decimal(amount)),
        ],
        reason=reason,
    )


def queue_chat(requester: Caller, max_length: int, content: str = "hi", model: str = "chat-model"):
    """Queue a chat request of `requester` for `model`, as the chat routes would; the request."""
    from jobs.services import create_reply_request

    return create_reply_request(
        account=requester.account,
        address="",
        model=model,
        messages=[{"role": "user", "content": content}],
        max_length=max_length,
        params={},
    )


@pytest.fixture
def chat_job(requester):
    """Queue a chat request and pop it as a chat worker of `owner`; return the pop answer."""

    def make(owner: Caller, worker: str = "chat-worker", *, max_length: int = 1024) -> dict:
        owner.pop(worker, models=["chat-model"], chat=True, max_length=16384, max_context_length=32768)
        queue_chat(requester, max_length, "Tell me a long story.")
        job = owner.pop(worker, models=["chat-model"], chat=True, max_length=16384, max_context_length=32768)
        assert job.status_code == 200 and job.json()["id"], job.content
        return job.json()

    return make


def progress(caller: Caller, generation_id: str, seq: int, delta: str = "more words ", **body: Any):
    return caller.post(
        "/api/v2/generate/text/progress", {"id": str(generation_id), "seq": seq, "delta": delta, **body}
    )


@pytest.fixture
def moderator(db, client):
    """A Django test client logged in as a staff user in the Moderators group."""
    from django.contrib.auth.models import Group, Permission, User

    from workers.moderation import grant_moderators

    user = User.objects.create_user("mod", password="pw", is_staff=True)
    # A transactional test empties auth_group too; the migration made it, this remakes it.
    user.groups.add(grant_moderators(Group, Permission))
    client.force_login(user)
    return client


# What the account's admin page posts for its read-only suspicions (an inline: a formset).
ACCOUNT_PAGE_INLINES = {"suspicions-TOTAL_FORMS": "0", "suspicions-INITIAL_FORMS": "0"}


@pytest.fixture
def plain_staff(db, client):
    """A Django test client logged in as staff outside the Moderators group."""
    from django.contrib.auth.models import User

    user = User.objects.create_user("staff", password="pw", is_staff=True)
    client.force_login(user)
    return client


def multiply_rows(model, times: int, **columns: str) -> None:
    """Copy every row of `model`'s table `times` times, with new ids, then ANALYZE it: a table
    the size the planner would see in service. `columns` gives the SQL of any column that must
    differ between copies (a unique name, say), over the copy's number `i`."""
    from django.db import connection

    table = model._meta.db_table
    copied = [f.column for f in model._meta.concrete_fields if f.column != "id" and f.column not in columns]
    names = ", ".join([*copied, *columns])
    values = ", ".join([*copied, *columns.values()])
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (id, {names}) "
            f"SELECT gen_random_uuid(), {values} FROM {table}, generate_series(1, {int(times)}) AS i"
        )
        cursor.execute(f"ANALYZE {table}")


def race(*calls: Callable[[], Any], timeout: float = 60, return_exceptions: bool = False) -> list[Any]:
    """Run the calls at once, each on its own thread and database connection, and return what
    each returned, in order; fail with what any raised, or, with `return_exceptions`, return
    what it raised in its place for the test to inspect."""
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)
    failures: list[BaseException] = []

    def run(index: int, call: Callable[[], Any]) -> None:
        try:
            barrier.wait()
            results[index] = call()
        except Exception as exc:
            if not return_exceptions:
                failures.append(exc)  # handed to the test thread
            results[index] = exc
        except BaseException as exc:  # handed to the test thread
            failures.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i, call)) for i, call in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    assert not failures, failures
    assert not any(thread.is_alive() for thread in threads), "a racing call did not finish"
    return results
