"""Does the pop stay fast as the queue and the fleet grow? Small versus large, in-process.

Run:  .venv/bin/python bench/studies/pop_scale.py [--pops 200] [--block 25] [--seed 7] [--keep]

(about a minute and a half; the JSON goes to stdout, the path of the plans file to stderr.)

It uses databases of its own, one per scenario (hordeops_bench_scale and
hordeops_bench_scale_large, created and migrated if missing), and Redis database 12.
For each scenario it empties the tables, bulk-creates accounts (some trusted),
online chat workers (1-3 of 20 models each, a fifth unmeasured, the rest 2..80 tokens/s,
declaring max_length 512..16384) and queued chat requests (one model each, max_length
64..16384, max_context_length = prompt + max_length), then times --pops calls of the real
`jobs.services.pop_generation` by workers drawn at random, each with its own declared
fields. Every pop commits as in production; between pops, outside the timing, the request
it took is re-queued and its generation deleted (and the tables vacuumed every 25 pops, as
autovacuum would), so the queue keeps its size and order throughout. The scenarios are timed
in alternating blocks of --block pops, so that a change in the machine's load (other
processes) weighs on both alike.

    small:  10 queued chat requests, 10 online workers
    large:  10,000 queued chat requests across 20 models, 1,000 online workers

The target (the issue): a large pop costs no more than three times a small one.

Printed, as one JSON object: the machine (cores, the 1-minute load average between blocks:
the machine may be shared, so read the figures against it); per scenario the pop's wall time
(median, p90, mean), the part of it spent in the pop's claiming statement (`jobs.sql.claim`:
the pop query `jobs.sql.pop`, run with `pop_params`, the popping worker's values as
constants, and the take and the insert of its generations), the share of pops that got
a job and by fallback tier, and the SQL statements per pop; the large/small ratios and
`target_met`. For the large fleet also: EXPLAIN (ANALYZE, BUFFERS) of the pop query for a
slow and a fast worker (the full plans go to a text file under /tmp whose path is printed),
and two extra cases of the pop query alone, each in a transaction rolled back: `miss`, pops
that find nothing (the worker serves only a model nobody asked for, so the whole queue is
ruled out), and `fallback`, only slow workers left for long requests (the tiered fallback and
its NOT EXISTS decide). The pop query runs with the server's own settings (JIT included), as
`pop_generation` runs it.
"""

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from bench.common import bench_env, percentile, prepare_database  # noqa: E402

# One database per scenario, so that the two can be timed in alternating blocks: a drift in
# the machine's load then weighs on both alike.
DATABASES = {"small": "hordeops_bench_scale", "large": "hordeops_bench_scale_large"}
os.environ.update(bench_env(DATABASES["small"], 12))

MODELS = [f"scale-model-{i:02d}" for i in range(20)]
UNSERVED_MODEL = "scale-model-nobody-asks"
WORKER_MAX_LENGTHS = [512, 1024, 2048, 4096, 8192, 16384]
REQUEST_MAX_LENGTHS = [64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
# Requesters ask for short replies more often than long ones.
REQUEST_LENGTH_WEIGHTS = [10, 14, 16, 16, 14, 12, 9, 6, 3]
SCENARIOS = {
    "small": {"queued": 10, "workers": 10},
    "large": {"queued": 10_000, "workers": 1_000},
}
VACUUM_EVERY = 25
# The large fleet's extra cases of the pop query alone (see `_case`).
MISS_SAMPLES, FALLBACK_SAMPLES = 20, 40


def _use(name: str) -> None:
    """Point the default connection at another database (reconnects on the next query)."""
    from django.db import connection

    connection.close()
    connection.close_pool()  # a pool keeps its connections to the database it was made for
    connection.settings_dict["NAME"] = name


def _stats(seconds: list[float]) -> dict[str, float]:
    ms = [s * 1000 for s in seconds]
    return {
        "median_ms": round(statistics.median(ms), 3),
        "p90_ms": round(percentile(ms, 0.90), 3),
        "mean_ms": round(statistics.fmean(ms), 3),
    }


def _tables() -> list[str]:
    from jobs.models import Generation, TextRequest
    from workers.models import Account, Worker

    return [m._meta.db_table for m in (Generation, TextRequest, Worker, Account)]


def _vacuum() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE " + ", ".join(_tables()))


def _wipe() -> None:
    """Empty the tables (truncated, so that no dead rows of a bigger run linger), then vacuum."""
    from django.db import connection

    from jobs.models import Generation, TextRequest
    from workers.models import Account, Worker

    with connection.cursor() as cursor:
        tables = [m._meta.db_table for m in (Generation, TextRequest, Worker)]
        cursor.execute(f"TRUNCATE {', '.join(tables)} CASCADE")
    Account.objects.exclude(name="Anonymous").delete()
    _vacuum()


def _seed(name: str, queued: int, workers: int, rng: random.Random, now) -> list:
    """Bulk-create the fleet and the queue; return the workers (with their accounts)."""
    from django.conf import settings

    from jobs.models import TextRequest
    from jobs.services import estimate_tokens, render_chat_prompt
    from workers.models import Account, Worker, hash_api_key

    accounts = Account.objects.bulk_create(
        Account(
            name=f"{name}-owner-{i}",
            api_key_hash=hash_api_key(f"{name}-owner-{i}"),
            trusted=rng.random() < 0.3,
        )
        for i in range(max(1, workers // 3))
    )
    requester = Account.objects.create(name=f"{name}-requester", api_key_hash=hash_api_key(f"{name}-req"))
    fleet = []
    for i in range(workers):
        max_length = rng.choice(WORKER_MAX_LENGTHS)
        fleet.append(
            Worker(
                name=f"{name}-worker-{i}",
                account=rng.choice(accounts),
                served_models=rng.sample(MODELS, rng.randint(1, 3)),
                max_length=max_length,
                max_context_length=max(8192, max_length * 2),
                threads=1,
                chat=True,
                bridge_agent="bench:1:pop_scale",
                created_at=now - timedelta(days=1),
                # Online: popped within the last two minutes (the online window is longer).
                last_pop_at=now - timedelta(seconds=rng.uniform(0, 120)),
                speed=None if rng.random() < 0.2 else round(rng.uniform(2, 80), 2),
            )
        )
    fleet = Worker.objects.bulk_create(fleet)
    # As create_chat_request insists, every requested model is served by some worker.
    served = sorted({m for w in fleet for m in w.served_models})
    lifetime = timedelta(seconds=settings.TEXT_REQUEST_LIFETIME_SECONDS)
    requests = []
    for i in range(queued):
        max_length = rng.choices(REQUEST_MAX_LENGTHS, REQUEST_LENGTH_WEIGHTS)[0]
        messages = [{"role": "user", "content": f"bench question {i}"}]
        prompt = render_chat_prompt(messages)
        created = now - timedelta(seconds=rng.uniform(0, 240))
        requests.append(
            TextRequest(
                account=requester,
                kind=TextRequest.Kind.CHAT,
                prompt=prompt,
                messages=messages,
                params={},
                max_length=max_length,
                max_context_length=estimate_tokens(prompt, 1 << 30) + max_length,
                requested_models=[rng.choice(served)],
                n=1,
                queued=1,
                created_at=created,
                expires_at=created + lifetime,
            )
        )
    TextRequest.objects.bulk_create(requests, batch_size=2000)
    _vacuum()
    return list(Worker.objects.select_related("account").filter(name__startswith=f"{name}-worker-"))


def _requeue(job) -> None:
    """Undo a pop's claim, outside the timing: the queue keeps its size and order."""
    from django.db.models import F

    from jobs.models import Generation, TextRequest

    Generation.objects.filter(pk__in=[g.pk for g in job.generations]).delete()
    TextRequest.objects.filter(pk=job.request.pk).update(queued=F("queued") + len(job.generations))


class _Statements:
    """An execute wrapper: counts the statements of a pop and times the pop query apart."""

    def __init__(self) -> None:
        from jobs.sql import claim

        self.pop_sql = claim()  # the pop's one statement: the pop query, its take and its insert
        self.count = 0
        self.sql_seconds = 0.0
        self.pop_query_seconds = 0.0
        self.pop_queries = 0

    def __call__(self, execute, sql, params, many, context):
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            elapsed = time.perf_counter() - started
            self.count += 1
            self.sql_seconds += elapsed
            if sql == self.pop_sql:
                self.pop_queries += 1
                self.pop_query_seconds += elapsed


def _pop(worker):
    """The measured call: the real service, with the worker's own declared fields."""
    from jobs.services import pop_generation

    return pop_generation(
        api_key=worker.account.name,  # _seed keys each owner by its name
        name=worker.name,
        models=worker.served_models,
        max_length=worker.max_length,
        max_context_length=worker.max_context_length,
        threads=worker.threads,
        nsfw=worker.nsfw,
        chat=worker.chat,
        bridge_agent=worker.bridge_agent,
        amount=1,
    )


SPEED_BANDS = ("unmeasured", "2-10 tok/s", "10-40 tok/s", "40-80 tok/s")


def _speed_band(speed: float | None) -> str:
    if speed is None:
        return SPEED_BANDS[0]
    return SPEED_BANDS[1] if speed < 10 else SPEED_BANDS[2] if speed < 40 else SPEED_BANDS[3]


class _Pops:
    """The samples of one scenario's timed pops, gathered over several blocks."""

    def __init__(self) -> None:
        self.walls, self.queries, self.other_sql, self.outside_sql = [], [], [], []
        self.tiers, self.statements = Counter(), Counter()
        self.got = 0
        self.query_by_speed: dict[str, list[float]] = {}

    def run(self, fleet: list, pops: int, rng: random.Random) -> None:
        from django.db import connection

        from jobs.services import PoppedJob

        for n in range(pops):
            worker = rng.choice(fleet)
            statements = _Statements()
            with connection.execute_wrapper(statements):
                started = time.perf_counter()
                job = _pop(worker)
                wall = time.perf_counter() - started
            if statements.pop_queries != 1:
                raise RuntimeError(f"a pop ran the pop query {statements.pop_queries} times, not once")
            self.walls.append(wall)
            self.queries.append(statements.pop_query_seconds)
            self.query_by_speed.setdefault(_speed_band(worker.speed), []).append(statements.pop_query_seconds)
            self.other_sql.append(statements.sql_seconds - statements.pop_query_seconds)
            self.outside_sql.append(wall - statements.sql_seconds)
            self.statements[statements.count] += 1
            if isinstance(job, PoppedJob):
                self.got += 1
                self.tiers[job.request.fallback_tier] += 1
                _requeue(job)
            if (n + 1) % VACUUM_EVERY == 0:
                _vacuum()

    def summary(self) -> dict:
        count = len(self.walls)
        return {
            "pops": count,
            **_stats(self.walls),
            "max_ms": round(max(self.walls) * 1000, 3),
            "got_job_share": round(self.got / count, 3),
            "tier_share": {str(t): round(self.tiers[t] / count, 3) for t in (1, 2, 3)},
            "sql_statements_per_pop": {str(k): v for k, v in sorted(self.statements.items())},
            "breakdown": {
                "pop_query": _stats(self.queries),
                "other_sql": _stats(self.other_sql),
                "outside_sql (commits, ORM, Redis)": _stats(self.outside_sql),
            },
            "pop_query_median_ms_by_worker_speed": {
                band: {
                    "pops": len(self.query_by_speed[band]),
                    "median_ms": _stats(self.query_by_speed[band])["median_ms"],
                }
                for band in SPEED_BANDS
                if band in self.query_by_speed
            },
        }


# --- The pop query alone: EXPLAIN, and the miss and fallback cases -----------------------------


def _params(worker, now) -> dict:
    """What `pop_generation` passes to `pop_sql`: the worker as it checked in, constants."""
    from jobs.services import pop_params

    return pop_params(worker, trusted=worker.account.trusted, now=now)


def _run_once(sql: str, params: dict, setup: tuple[str, ...] = ()) -> tuple[float, object]:
    """Time one statement (execute and fetch) in a transaction that is rolled back."""
    from django.db import connection, transaction

    with transaction.atomic():
        with connection.cursor() as cursor:
            for statement in setup:
                cursor.execute(statement)
            started = time.perf_counter()
            cursor.execute(sql, params)
            row = cursor.fetchone()
            elapsed = time.perf_counter() - started
        transaction.set_rollback(True)
    return elapsed, None if row is None else (row[0], row[-1])


def _plan(sql: str, params: dict, setup: tuple[str, ...] = ()) -> dict:
    """The planner's choice (EXPLAIN, not run), rolled back: its top nodes and whether JIT is on."""
    from django.db import connection, transaction

    with transaction.atomic():
        with connection.cursor() as cursor:
            for statement in setup:
                cursor.execute(statement)
            cursor.execute("EXPLAIN " + sql, params)
            plan = [row[0] for row in cursor.fetchall()]
        transaction.set_rollback(True)
    return {
        "top_nodes": [line.strip().split("  (")[0].lstrip("-> ") for line in plan[:6] if "(cost=" in line],
        "jit": any(line.strip().startswith("JIT:") for line in plan),
    }


def _case(fleet: list, samples: int, rng: random.Random, case: str) -> dict:
    """The pop query alone, for sampled workers of the large fleet, in one of two cases.

    "miss": each worker serves only a model nobody asked for, a pop that finds nothing (the
    whole queue must be ruled out). "fallback": every worker of one model is made slow (2 or
    5 tokens/s or unmeasured) and only the model's requests longer than any of them can
    finish in the base lease stay queued, so that the tiered fallback and its NOT EXISTS
    decide; the sampled workers are of that model and serve only it. The changes are made in
    a transaction that is rolled back (the popping worker's row too, as its check-in would
    have written it) and in the worker's constants.
    """
    from django.utils import timezone

    from jobs.models import TextRequest
    from jobs.sql import pop as pop_sql
    from workers.capacity import capacity
    from workers.models import Worker

    table = Worker._meta.db_table
    setup: tuple[str, ...] = ()
    pool, speeds, figures = fleet, {}, {}
    if case == "fallback":
        model = rng.choice(MODELS)
        pool = [w for w in fleet if model in w.served_models]
        slow = [2.0, 5.0, None]
        speeds = {w.pk: rng.choice(slow) for w in pool}
        values = ", ".join(
            f"('{pk}'::uuid, {'NULL' if v is None else v}::float8)" for pk, v in speeds.items()
        )
        longest = max(capacity(speed) for speed in slow)  # the most any of them can finish
        setup += (
            f"UPDATE {table} AS w SET speed = v.speed"
            f" FROM (VALUES {values}) AS v(id, speed) WHERE w.id = v.id",
            # Only the model's requests that none of them can finish in the base lease stay.
            f"UPDATE {TextRequest._meta.db_table} SET queued = 0"
            f" WHERE requested_models && '{{{model}}}' AND max_length <= {longest}",
        )
        figures = {
            "model_workers": len(pool),
            "model_requests_left_queued": TextRequest.objects.filter(
                requested_models__overlap=[model], queued__gt=0, max_length__gt=longest
            ).count(),
        }
    times, tiers, plan = [], Counter(), None
    for _ in range(samples):
        worker = Worker.objects.select_related("account").get(pk=rng.choice(pool).pk)
        now = timezone.now()
        served = [UNSERVED_MODEL] if case == "miss" else [model]
        worker.served_models = served
        if case == "fallback":
            worker.speed = speeds[worker.pk]
        extra = (f"UPDATE {table} SET served_models = '{{{served[0]}}}' WHERE id = '{worker.pk}'",)
        params = _params(worker, now)
        if plan is None:
            plan = _plan(pop_sql(), params, setup + extra)
        elapsed, chosen = _run_once(pop_sql(), params, setup + extra)
        times.append(elapsed)
        tiers["none" if chosen is None else str(chosen[1])] += 1
    return {
        "samples": samples,
        **figures,
        "pop_query": _stats(times),
        "tier_chosen": dict(sorted(tiers.items())),
        "plan_of_first_sample": plan,
    }


def _explain(sql: str, params: dict, label: str, worker) -> tuple[dict, str]:
    """EXPLAIN (ANALYZE, BUFFERS), rolled back (the FOR UPDATE takes a real lock)."""
    from django.db import connection, transaction

    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)
            plan = [row[0] for row in cursor.fetchall()]
        transaction.set_rollback(True)
    figures = {"speed": worker.speed, "max_length": worker.max_length, "models": worker.served_models}
    for line in plan:
        line = line.strip()
        if line.startswith("Execution Time:"):
            figures["execution_ms"] = float(line.split()[2])
        elif line.startswith("Planning Time:"):
            figures["planning_ms"] = float(line.split()[2])
    figures["jit"] = any(line.strip().startswith("JIT:") for line in plan)
    figures["top_nodes"] = [
        line.strip().split("  (")[0].lstrip("-> ") for line in plan[:6] if "(cost=" in line
    ]
    header = f"=== {label}: speed={worker.speed} max_length={worker.max_length} models={worker.served_models}"
    return figures, "\n".join([header, *plan, ""])


def _pick(fleet: list, slow: bool):
    """The slowest (or the fastest) measured worker declaring a large max_length."""
    measured = [w for w in fleet if w.speed is not None and w.max_length >= 8192]
    measured = measured or [w for w in fleet if w.speed is not None]
    return (min if slow else max)(measured, key=lambda w: w.speed)


def _explain_both(fleet: list) -> tuple[dict, list[str]]:
    from django.utils import timezone

    from jobs.sql import pop as pop_sql

    figures, plans = {}, []
    for label, worker in (("slow", _pick(fleet, slow=True)), ("fast", _pick(fleet, slow=False))):
        figures[label], text = _explain(pop_sql(), _params(worker, timezone.now()), f"{label} worker", worker)
        plans.append(text)
    return figures, plans


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pops", type=int, default=200, help="timed pops per scenario")
    parser.add_argument("--block", type=int, default=25, help="pops per block; scenarios alternate by block")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--budget", type=float, default=150, help="seconds of timed pops in all, at most")
    parser.add_argument("--keep", action="store_true", help="leave the seeded rows in place")
    args = parser.parse_args()

    for name in DATABASES.values():
        prepare_database(name)
    import django

    django.setup()
    from django.utils import timezone

    run_started = time.perf_counter()
    rng = random.Random(args.seed)
    fleets, pops, results = {}, {}, {}
    for name, size in SCENARIOS.items():
        _use(DATABASES[name])
        _wipe()
        seed_started = time.perf_counter()
        fleets[name] = _seed(name, size["queued"], size["workers"], rng, timezone.now())
        results[name] = {
            **size,
            "models": len(MODELS),
            "seed_seconds": round(time.perf_counter() - seed_started, 1),
        }
        pops[name] = _Pops()
    loads = [os.getloadavg()[0]]
    timing_started = time.perf_counter()
    while any(len(p.walls) < args.pops for p in pops.values()):
        for name in SCENARIOS:
            _use(DATABASES[name])
            _Pops().run(fleets[name], 3, rng)  # untimed: the new connection's caches
            _vacuum()
            pops[name].run(fleets[name], min(args.block, args.pops - len(pops[name].walls)), rng)
        loads.append(os.getloadavg()[0])
        if time.perf_counter() - timing_started > args.budget:
            break
    for name in SCENARIOS:
        results[name].update(pops[name].summary())

    plans = []
    for name in SCENARIOS:
        _use(DATABASES[name])
        if name == "large":
            _vacuum()
            results[name]["explain"], plans = _explain_both(fleets[name])
            results[name]["miss"] = _case(fleets[name], MISS_SAMPLES, rng, "miss")
            results[name]["fallback"] = _case(fleets[name], FALLBACK_SAMPLES, rng, "fallback")
        if not args.keep:
            _wipe()
    load_after = os.getloadavg()[0]

    plan_path = Path(tempfile.gettempdir()) / "pop_scale_plans.txt"
    plan_path.write_text("\n".join(plans))
    print(f"full plans: {plan_path}", file=sys.stderr)
    small, large = results["small"], results["large"]

    def ratio(key: str, a: dict, b: dict) -> float:
        return round(b[key] / a[key], 2)

    ratio_median = ratio("median_ms", small, large)
    query = small["breakdown"]["pop_query"], large["breakdown"]["pop_query"]
    print(
        json.dumps(
            {
                "bench": "pop_scale",
                "machine": {
                    "cores": os.cpu_count(),
                    "load_average_1m_during_pops": [round(x, 2) for x in (min(loads), max(loads))],
                    "load_average_1m_after_explain_and_cases": round(load_after, 2),
                    "python": platform.python_version(),
                    "platform": platform.platform(),
                },
                "scenarios": results,
                "ratio_large_over_small": {
                    "pop_median": ratio_median,
                    "pop_mean": ratio("mean_ms", small, large),
                    "pop_query_median": ratio("median_ms", *query),
                    "pop_query_mean": ratio("mean_ms", *query),
                },
                "target": "large median pop <= 3x small median pop",
                "target_met": ratio_median <= 3,
                "plans_file": str(plan_path),
                "run_seconds": round(time.perf_counter() - run_started, 1),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
