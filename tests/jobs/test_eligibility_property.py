"""The pop and the eligibility count agree, and both follow the speed gate
(docs/reference/worker_protocol.md).

A worker is counted as eligible for a request by the status side exactly when the pop would
offer it that request: it passes the request's plain filters and no online worker of a better
tier passes them too. The property is checked over generated fleets and one queued request:

- the pop's own SQL (`jobs.sql.pop`), probed once per worker without its check-in
  and rolled back, gives the set of workers it would offer the request to, with their tiers;
- `eligible_workers` must count the online ones of that set, their threads and their tier 1s;
- a pure-Python oracle of the rule as the speed gate states it must give the same set and tiers, so
  a rule that is consistent between pop and status but wrong is caught too.
"""

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.conf import settings
from django.db import transaction
from hypothesis import HealthCheck, Phase, event, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from jobs import sql
from jobs.models import TextRequest
from jobs.services.pop import pop_params
from jobs.status import eligible_workers, request_status
from workers.models import Account, Worker, hash_api_key

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
POOL = ["a", "b", "c"]


# --- The oracle: the speed gate's rule as written --------------------------------


@dataclass(frozen=True)
class WorkerSpec:
    account: int
    chat: bool
    models: tuple[str, ...]
    speed: float | None
    max_length: int
    max_context_length: int
    maintenance: bool
    threads: int
    idle_seconds: float  # seconds since its last pop
    bridge_agent: str = "unknown:0:unknown"

    @property
    def last_pop_at(self) -> datetime:
        return NOW - timedelta(seconds=self.idle_seconds)


@dataclass(frozen=True)
class RequestSpec:
    account: int
    kind: str
    models: tuple[str, ...]
    max_length: int
    max_context_length: int
    trusted_workers: bool
    allowed: tuple[int, ...]  # indices into the fleet
    blacklist: bool = False  # `allowed` blocks instead (worker_blacklist)
    slow_workers: bool = True
    validated_backends: bool = False


# A validated bridge, an unknown one, and a validated name that is no full `name:version:url`.
BRIDGES = ("KoboldCppEmbedWorker:1:https://github.com/LostRuins/koboldcpp", "unknown:0:unknown", "TabbyAPI")
VALIDATED_BRIDGES = BRIDGES[:1]


def online(w: WorkerSpec) -> bool:
    return w.last_pop_at >= NOW - timedelta(seconds=settings.WORKER_ONLINE_SECONDS)


def passes_filters(r: RequestSpec, i: int, w: WorkerSpec, trusted: list[bool]) -> bool:
    """Could worker `i` serve the request at all: models, lengths, trust, names (allowed or
    blocked), a validated bridge, slow workers, maintenance, chat."""
    speed = settings.UNMEASURED_TEXT_WORKER_TOKENS_PER_SECOND if w.speed is None else w.speed
    return (
        r.max_length <= w.max_length
        and r.max_context_length <= w.max_context_length
        and (not r.models or bool(set(r.models) & set(w.models)))
        and (not r.allowed or (i in r.allowed) != r.blacklist)
        and (r.slow_workers or speed >= 2)
        and (not r.trusted_workers or trusted[w.account])
        and (not r.validated_backends or w.bridge_agent in VALIDATED_BRIDGES)
        and (not w.maintenance or w.account == r.account)
        and (r.kind == "text" or w.chat)
    )


def tier(r: RequestSpec, w: WorkerSpec, trusted: list[bool]) -> int:
    """1: capacity covers max_length in the base lease; 2: only within its own cap; 3: not even."""
    if r.kind == "text":
        return 1  # the gate does not apply to a legacy text job
    speed = settings.UNMEASURED_TEXT_WORKER_TOKENS_PER_SECOND if w.speed is None else w.speed
    preparation = settings.TEXT_JOB_PREPARATION_SECONDS
    if speed * (settings.TEXT_JOB_LEASE_SECONDS - preparation) >= r.max_length:
        return 1
    cap = (
        settings.TRUSTED_TEXT_JOB_LEASE_CAP_SECONDS
        if trusted[w.account]
        else settings.UNTRUSTED_TEXT_JOB_LEASE_CAP_SECONDS
    )
    if speed * (cap - preparation) >= r.max_length:
        return 2
    return 3


def oracle_offers(r: RequestSpec, fleet: list[WorkerSpec], trusted: list[bool]) -> dict[int, int]:
    """Worker index -> tier, for every worker (online or not) the request would be offered to."""
    passing = {i: tier(r, w, trusted) for i, w in enumerate(fleet) if passes_filters(r, i, w, trusted)}
    online_tiers = [t for i, t in passing.items() if online(fleet[i])]
    return {i: t for i, t in passing.items() if t == 1 or not any(v < t for v in online_tiers)}


# --- The system under test ---------------------------------------------------------------------


def pop_offers(request_id, worker_ids: list) -> list[int | None]:
    """The tier at which the real pop query would hand each worker the request, or None.

    The check-in is left out, so nothing changes between probes, and the savepoint is rolled
    back so that the row lock taken by FOR UPDATE is not kept either (a lock the transaction
    holds itself does not make SKIP LOCKED skip the row for the next probe).
    """
    tiers: list[int | None] = []
    fleet = Worker.objects.select_related("account").in_bulk(worker_ids)
    with transaction.atomic():
        for worker_id in worker_ids:
            worker = fleet[worker_id]
            rows = list(
                TextRequest.objects.raw(
                    sql.pop(), pop_params(worker, trusted=worker.account.trusted, now=NOW)
                )
            )
            assert len(rows) <= 1
            assert not rows or rows[0].pk == request_id
            tiers.append(rows[0].fallback_tier if rows else None)
        transaction.set_rollback(True)
    return tiers


def queue_blockers(account: Account) -> None:
    """Ahead of the request, more requests than the pop reads one by one (`NEAR_ROWS`) under
    each model and under none, that no worker may take (longer than any worker's max_length):
    every pop then reaches the request by its shape (`jobs.sql.pop`'s far walk)."""
    TextRequest.objects.bulk_create(
        TextRequest(
            account=account,
            kind="chat",
            prompt="Once upon a time",
            messages=[{"role": "user", "content": "Hi"}],
            max_length=16385,
            max_context_length=16385,
            requested_models=models,
            n=1,
            queued=1,
            created_at=NOW - timedelta(seconds=60),
            expires_at=NOW + timedelta(seconds=settings.TEXT_REQUEST_LIFETIME_SECONDS),
        )
        for models in [[model] for model in POOL] + [[]]
        for _ in range(sql.NEAR_ROWS + 1)
    )


def build(accounts: list[bool], fleet: list[WorkerSpec], spec: RequestSpec, *, behind: bool = False):
    owners = Account.objects.bulk_create(
        Account(name=f"acct-{i}", trusted=t, api_key_hash=hash_api_key(f"key-{i}"))
        for i, t in enumerate(accounts)
    )
    workers = Worker.objects.bulk_create(
        Worker(
            name=f"worker-{i}",
            account=owners[w.account],
            chat=w.chat,
            served_models=list(w.models),
            speed=w.speed,
            max_length=w.max_length,
            max_context_length=w.max_context_length,
            maintenance=w.maintenance,
            threads=w.threads,
            bridge_agent=w.bridge_agent,
            created_at=NOW - timedelta(days=1),
            last_pop_at=w.last_pop_at,
        )
        for i, w in enumerate(fleet)
    )
    request = TextRequest.objects.create(
        account=owners[spec.account],
        kind=spec.kind,
        prompt="Once upon a time",
        messages=[{"role": "user", "content": "Hi"}] if spec.kind == "chat" else None,
        max_length=spec.max_length,
        max_context_length=spec.max_context_length,
        requested_models=list(spec.models),
        allowed_workers=[workers[i].pk for i in spec.allowed],
        worker_blacklist=spec.blacklist and bool(spec.allowed),
        slow_workers=spec.slow_workers,
        validated_backends=spec.validated_backends,
        trusted_workers=spec.trusted_workers,
        n=1,
        queued=1,
        created_at=NOW - timedelta(seconds=5),
        expires_at=NOW + timedelta(seconds=settings.TEXT_REQUEST_LIFETIME_SECONDS),
    )
    if behind:
        queue_blockers(owners[0])
    return workers, request


def check_agreement(
    accounts: list[bool], fleet: list[WorkerSpec], spec: RequestSpec, *, behind: bool = False
) -> None:
    workers, request = build(accounts, fleet, spec, behind=behind)
    popped = dict(enumerate(pop_offers(request.pk, [w.pk for w in workers])))
    offered = {i: t for i, t in popped.items() if t is not None}

    # The rule as stated, for every worker (a stale one would be offered it on its next pop).
    assert offered == oracle_offers(spec, fleet, accounts)

    # The status side counts exactly the online workers the pop offers the request to.
    counted = [i for i in offered if online(fleet[i])]
    eligible = eligible_workers(request, now=NOW)
    assert eligible["workers"] == len(counted)
    assert eligible["threads"] == sum(fleet[i].threads for i in counted)
    assert eligible["capable"] == sum(1 for i in counted if offered[i] == 1)
    speeds = [fleet[i].speed for i in counted if fleet[i].speed is not None]
    if speeds:
        assert eligible["speed"] == pytest.approx(sum(speeds) / len(speeds))
    else:
        assert eligible["speed"] is None

    status = request_status(request, now=NOW)
    assert status["is_possible"] == bool(counted)
    assert status["might_stall"] == (bool(counted) and not any(offered[i] == 1 for i in counted))


# --- Generated fleets --------------------------------------------------------------------------
# Biased so that most workers pass most filters: the tier ordering only shows between workers
# that all pass them, and the boundaries only show when max_length sits on a worker's edge.


def mostly(value: Any, other: st.SearchStrategy) -> st.SearchStrategy:
    """`value` about four times in five, else a draw from `other`; shrinks towards `value`.

    (`st.one_of` of repeated `st.just(value)` would not weight: equal branches are merged.)
    """
    return st.tuples(st.sampled_from([True] * 4 + [False]), other).map(lambda t: value if t[0] else t[1])


SPEEDS = st.one_of(
    st.none(),
    st.sampled_from([0.5, 1.0, 1.999, 2.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 100.0]),
    st.floats(min_value=0.5, max_value=100, allow_nan=False, allow_infinity=False),
)
LENGTHS = st.one_of(st.sampled_from([80, 512, 1024, 1200, 2048, 4096, 8192, 16384]), st.integers(1, 16384))
CONTEXTS = st.sampled_from([1024, 2048, 4096, 8192, 16384, 32768])
# Online up to WORKER_ONLINE_SECONDS (300) since the last pop, its boundary included.
IDLE = st.one_of(
    st.floats(0, 300),
    st.floats(0, 300),
    st.sampled_from([0, 299, 300, 300.000001, 301]),
    st.floats(300, 3600),
)
MODEL_SETS = st.lists(st.sampled_from(POOL), unique=True, max_size=3).map(tuple)


def windows() -> list[int]:
    """Seconds of generation in the base lease, within the untrusted cap and the trusted cap."""
    preparation = settings.TEXT_JOB_PREPARATION_SECONDS
    return [
        settings.TEXT_JOB_LEASE_SECONDS - preparation,
        settings.UNTRUSTED_TEXT_JOB_LEASE_CAP_SECONDS - preparation,
        settings.TRUSTED_TEXT_JOB_LEASE_CAP_SECONDS - preparation,
    ]


def edge_speeds(max_length: int) -> list[float]:
    """Speeds (0.5 to 100) that put a worker exactly on, or just under, a tier edge."""
    speeds = set()
    for window in windows():
        exact = max_length / window
        speeds.update({exact, exact * 0.999, exact * 1.001})
    return sorted(v for v in speeds if 0.5 <= v <= 100)


def edge_lengths() -> list[int]:
    """max_length values on an unmeasured worker's tier edges, and next to them."""
    unmeasured = settings.UNMEASURED_TEXT_WORKER_TOKENS_PER_SECOND
    return sorted({unmeasured * window + d for window in windows() for d in (-1, 0, 1)})


def worker_specs(n_accounts: int, max_length: int) -> st.SearchStrategy[WorkerSpec]:
    """Workers around a request of `max_length`: speeds aimed at its tier edges, lengths at it."""
    edges = edge_speeds(max_length)
    speeds = st.one_of(SPEEDS, st.sampled_from(edges), st.sampled_from(edges)) if edges else SPEEDS
    return st.builds(
        WorkerSpec,
        account=st.integers(0, n_accounts - 1),
        chat=mostly(True, st.just(False)),
        models=mostly(("a",), MODEL_SETS),
        speed=speeds,
        max_length=mostly(16384, st.one_of(LENGTHS, st.sampled_from([max_length - 1, max_length]))),
        max_context_length=mostly(32768, CONTEXTS),
        maintenance=mostly(False, st.booleans()),
        threads=st.integers(1, 4),
        idle_seconds=IDLE,
        bridge_agent=mostly(BRIDGES[0], st.sampled_from(BRIDGES)),
    )


@st.composite
def scenarios(draw) -> tuple[list[bool], list[WorkerSpec], RequestSpec, bool]:
    accounts = draw(st.lists(st.booleans(), min_size=1, max_size=3))
    max_length = draw(st.one_of(LENGTHS, st.sampled_from(edge_lengths())))
    size = draw(st.integers(1, 8))
    fleet = draw(st.lists(worker_specs(len(accounts), max_length), min_size=size, max_size=size))
    context = max_length + draw(mostly(0, st.one_of(st.integers(0, 4000), CONTEXTS)))
    allowed = draw(mostly((), st.lists(st.integers(0, size - 1), unique=True).map(tuple)))
    spec = RequestSpec(
        account=draw(st.integers(0, len(accounts) - 1)),
        kind=draw(mostly("chat", st.just("text"))),
        models=draw(mostly(("a",), MODEL_SETS)),
        max_length=max_length,
        max_context_length=context,
        trusted_workers=draw(mostly(False, st.booleans())),
        allowed=allowed,
        blacklist=draw(mostly(False, st.just(True))),
        slow_workers=draw(mostly(True, st.just(False))),
        validated_backends=draw(mostly(False, st.just(True))),
    )
    # Half the time behind requests nobody may take: the pop reaches it by its shape.
    return accounts, fleet, spec, draw(st.booleans())


def note_situation(accounts: list[bool], fleet: list[WorkerSpec], spec: RequestSpec) -> None:
    """Hypothesis statistics: how often the cases the rule distinguishes were generated."""
    passing = {
        i: tier(spec, w, accounts) for i, w in enumerate(fleet) if passes_filters(spec, i, w, accounts)
    }
    offered = oracle_offers(spec, fleet, accounts)
    event(f"{spec.kind}: tiers passing the filters {sorted(set(passing.values()))}")
    if set(passing) - set(offered):
        event("a filter-passing worker is held back for a better tier")
    if any(not online(fleet[i]) and t < max(passing.values()) for i, t in passing.items()):
        event("a better-tier worker is offline")
    if any(t == 3 and 2 in passing.values() for t in passing.values()):
        event("tier 3 and tier 2 both pass the filters")
    if any(
        spec.kind == "chat" and passing.get(i) and (w.speed or 10) * 120 == spec.max_length
        for i, w in enumerate(fleet)
    ):
        event("capacity exactly max_length")


@hypothesis_settings(
    max_examples=400,
    deadline=None,
    database=None,
    # No explain phase: it reruns a failing example a hundred times, each with the database.
    phases=[Phase.explicit, Phase.generate, Phase.shrink],
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(scenario=scenarios())
def test_a_worker_is_counted_exactly_when_the_pop_would_offer_it_the_request(db, scenario):
    accounts, fleet, spec, behind = scenario
    note_situation(accounts, fleet, spec)
    event(f"behind the head of the queue: {behind}")
    # Each example builds its own rows and rolls them back, inside the test's transaction.
    with transaction.atomic():
        check_agreement(accounts, fleet, spec, behind=behind)
        transaction.set_rollback(True)


# --- One example per tier situation ------------------------------------------------------------


def chat_worker(account: int = 0, **fields: Any) -> WorkerSpec:
    defaults: dict[str, Any] = {
        "account": account,
        "chat": True,
        "models": ("a",),
        "speed": None,
        "max_length": 16384,
        "max_context_length": 32768,
        "maintenance": False,
        "threads": 1,
        "idle_seconds": 10,
    }
    return WorkerSpec(**{**defaults, **fields})


def chat_request(max_length: int, **fields: Any) -> RequestSpec:
    defaults: dict[str, Any] = {
        "account": 0,
        "kind": "chat",
        "models": ("a",),
        "max_length": max_length,
        "max_context_length": max_length + 100,
        "trusted_workers": False,
        "allowed": (),
    }
    return RequestSpec(**{**defaults, **fields})


def offers(accounts: list[bool], fleet: list[WorkerSpec], spec: RequestSpec) -> dict[str, Any]:
    """Check the agreement, then return the pop's offers by worker index and the counts."""
    workers, request = build(accounts, fleet, spec)
    popped = dict(enumerate(pop_offers(request.pk, [w.pk for w in workers])))
    eligible = eligible_workers(request, now=NOW)
    transaction.set_rollback(True)
    assert {i: t for i, t in popped.items() if t} == oracle_offers(spec, fleet, accounts)
    return {"offered": {i: t for i, t in popped.items() if t}, **eligible}


@pytest.mark.django_db
def test_a_capable_worker_online_keeps_the_job_from_slower_ones():
    # 20 t/s x 120 s = 2400 covers 2000; 15 t/s reaches it only within the 600 s cap; 1 t/s never.
    fleet = [chat_worker(speed=20.0), chat_worker(speed=15.0), chat_worker(speed=1.0)]
    with transaction.atomic():
        seen = offers([True], fleet, chat_request(2000))
    assert seen["offered"] == {0: 1}
    assert (seen["workers"], seen["capable"]) == (1, 1)


@pytest.mark.django_db
def test_without_a_capable_worker_the_job_falls_back_to_tier_2_only():
    fleet = [chat_worker(speed=15.0), chat_worker(speed=1.0)]
    with transaction.atomic():
        seen = offers([True], fleet, chat_request(2000))
    assert seen["offered"] == {0: 2}
    assert (seen["workers"], seen["capable"]) == (1, 0)


@pytest.mark.django_db
def test_with_only_tier_3_workers_online_they_are_offered_the_job():
    fleet = [chat_worker(speed=1.0), chat_worker(speed=2.0, threads=3)]
    with transaction.atomic():
        seen = offers([False], fleet, chat_request(2000))
    assert seen["offered"] == {0: 3, 1: 3}
    assert (seen["workers"], seen["threads"], seen["capable"]) == (2, 4, 0)


@pytest.mark.django_db
def test_the_owners_trust_decides_between_tier_2_and_3():
    # 5 t/s: 600 in the base lease, 850 within the untrusted cap, 2850 within the trusted one.
    fleet = [chat_worker(0, speed=5.0), chat_worker(1, speed=5.0)]
    with transaction.atomic():
        seen = offers([True, False], fleet, chat_request(1000))
    assert seen["offered"] == {0: 2}


@pytest.mark.django_db
def test_a_stale_or_filtered_out_capable_worker_does_not_block_the_fallback():
    fleet = [
        chat_worker(speed=50.0, idle_seconds=301),  # capable but offline
        chat_worker(speed=50.0, models=("b",)),  # capable but serves another model
        chat_worker(speed=50.0, maintenance=True, account=1),  # capable but in maintenance
        chat_worker(speed=1.0),
    ]
    with transaction.atomic():
        seen = offers([False, False], fleet, chat_request(2000))
    # The stale one would still be offered it when it pops again, at tier 1.
    assert seen["offered"] == {0: 1, 3: 3}
    assert (seen["workers"], seen["capable"]) == (1, 0)


@pytest.mark.django_db
def test_a_faster_worker_of_an_unvalidated_bridge_does_not_hold_back_a_validated_one():
    fleet = [
        chat_worker(speed=50.0, bridge_agent="unknown:0:unknown"),
        chat_worker(speed=1.0, bridge_agent=BRIDGES[0]),
    ]
    with transaction.atomic():
        seen = offers([False], fleet, chat_request(2000, validated_backends=True))
    assert seen["offered"] == {1: 3}
    assert (seen["workers"], seen["capable"]) == (1, 0)


@pytest.mark.django_db
def test_an_owner_may_still_be_offered_its_own_request_in_maintenance():
    fleet = [chat_worker(speed=50.0, maintenance=True), chat_worker(speed=1.0, account=1)]
    with transaction.atomic():
        seen = offers([False, False], fleet, chat_request(2000))
    assert seen["offered"] == {0: 1}


@pytest.mark.django_db
def test_a_legacy_text_job_ignores_speed():
    fleet = [chat_worker(speed=50.0, chat=False), chat_worker(speed=0.5, chat=False)]
    with transaction.atomic():
        seen = offers([False], fleet, chat_request(2000, kind="text"))
    assert seen["offered"] == {0: 1, 1: 1}
    assert (seen["workers"], seen["capable"]) == (2, 2)


@pytest.mark.django_db
def test_capacity_exactly_at_max_length_is_capable():
    # An unmeasured worker counts 10 t/s: exactly 1200 tokens in the base lease.
    fleet = [chat_worker(speed=None), chat_worker(speed=9.99)]
    with transaction.atomic():
        seen = offers([False], fleet, chat_request(1200))
    assert seen["offered"] == {0: 1}
