"""Do the pop and the status cost the same at 100,000 queued as at 100? In-process, real PostgreSQL.

Run:  .venv/bin/python bench/flat_costs.py [--samples 30] [--sizes 100:10,10000:100,100000:1000]
          [--kudos]

(a few minutes; the JSON goes to stdout, the plans to a text file under /tmp named on stderr.)

Its own database (hordeops_bench_flat) and Redis database 13. For each size (queued requests
: online chat workers) it empties the tables and fills them: chat requests for 20 models, a
tenth of them for models no worker serves, the fleet serving 1-3 of the 20 each. Then it
times each case, median and p99 of --samples runs after a warm-up that lets the statement be
prepared and its plan chosen, as on a pooled connection in service (the pop query only locks
what it picks, so the queue never changes):

    head      the pop query (`jobs.sql.pop`) for a worker of the first request's model
    miss      the pop query for a worker that serves only a model nobody asks for
    newest    the pop query for a worker whose only match is the newest request
    fallback  the pop query for a slow worker whose only matches are long requests that a
              faster worker of the same model could take (the tiered gate's NOT EXISTS)
    gated     the pop query for a slow worker of a popular model: every request of the model
              goes to a faster worker, so the walk checks each of them against the gate
    status    `jobs.status.request_status` of the newest request
    eligible  `jobs.status.eligible_workers` of the newest request

Printed, per size and case: median_ms, p99_ms; the ratio of the largest size to the smallest
per case; `python_loop_seconds` (the VM's speed that day). EXPLAIN (ANALYZE, BUFFERS) of the
miss and head pops at the largest size goes to the plans file.
"""

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.common import bench_env, percentile, python_loop_seconds, reset_tables, setup_django  # noqa: E402

DB_NAME = "hordeops_bench_flat"
os.environ.update(bench_env(DB_NAME, 13))

MODELS = [f"flat-model-{i:02d}" for i in range(20)]
UNSERVED = [f"flat-unserved-{i}" for i in range(5)]
NOBODY = "flat-model-nobody-asks"
NEWEST = "flat-model-only-the-newest"
LONG = "flat-model-long-replies"


def fill_queue(queued: int, workers: int, now) -> None:
    """Empty the tables and fill them with one INSERT per table (generate_series)."""
    from django.db import connection

    from jobs.models import TextRequest
    from workers.models import Account, Worker, hash_api_key

    rng = random.Random(queued)
    reset_tables()  # the ledger too: an earlier run's requests left wallets
    owner = Account.objects.create(name="flat-owner", api_key_hash=hash_api_key("flat-owner"))
    requester = Account.objects.create(name="flat-requester", api_key_hash=hash_api_key("flat-req"))
    Worker.objects.bulk_create(
        Worker(
            name=f"flat-worker-{i}",
            account=owner,
            served_models=rng.sample(MODELS, rng.randint(1, 3)) + ([LONG] if i % 10 == 0 else []),
            max_length=16384,
            max_context_length=32768,
            threads=1,
            chat=True,
            bridge_agent="bench:1:flat_costs",
            created_at=now - timedelta(days=1),
            last_pop_at=now - timedelta(seconds=rng.uniform(0, 120)),
            # The long-reply workers are fast: 80 tokens/s x 120 s covers the long requests.
            speed=80.0 if i % 10 == 0 else round(rng.uniform(20, 80), 2),
        )
        for i in range(workers)
    )
    names = MODELS + UNSERVED
    weights = [9 / len(MODELS)] * len(MODELS) + [1 / len(UNSERVED)] * len(UNSERVED)
    models = [rng.choices(names, weights)[0] for _ in range(queued)]
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO {TextRequest._meta.db_table}
                (id, account_id, kind, state, prompt, params, max_length, max_context_length,
                 requested_models, allowed_workers, trusted_workers, slow_workers, priority,
                 fair_rank, n, queued, finished, restarts, created_at, expires_at)
            SELECT gen_random_uuid(), %(account)s, 'chat', 'active', 'bench question', '{{}}',
                   256, 512, ARRAY[m.model]::varchar[], '{{}}', false, true,
                   CASE WHEN %(kudos)s THEN (random() ^ 3 * 100000)::integer ELSE 0 END,
                   0, 1, 1, 0, 0, %(now)s - (m.i || ' milliseconds')::interval,
                   %(now)s + interval '1 hour'
            FROM unnest(%(models)s::varchar[]) WITH ORDINALITY AS m(model, i)
            """,
            {"account": requester.pk, "now": now, "models": models, "kudos": KUDOS_PRIORITIES},
        )
    # The newest request: the only one for its model. The long ones, at the tail.
    for model, length in ((LONG, 4000), (LONG, 4000), (NEWEST, 256)):
        TextRequest.objects.create(
            account=requester,
            kind=TextRequest.Kind.CHAT,
            prompt="bench question",
            params={},
            max_length=length,
            max_context_length=length + 256,
            requested_models=[model],
            created_at=now + timedelta(seconds=1),
            expires_at=now + timedelta(hours=1),
        )
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")


def _worker(models: list[str], *, speed: float | None, now):
    from workers.models import Account, Worker

    return Worker(
        id=uuid.uuid4(),
        name="flat-popper",
        account=Account.objects.get(name="flat-owner"),
        served_models=models,
        max_length=16384,
        max_context_length=32768,
        chat=True,
        speed=speed,
        last_pop_at=now,
    )


def _pop_query(worker, now) -> tuple[float, object]:
    """One run of the pop query for `worker` in a transaction of its own: its seconds and what
    it picked. The query only locks what it picks, so the queue stays as it is; the transaction
    commits, as the pop's does in service: a rollback, even to a savepoint, would make psycopg
    drop the connection's prepared statements, and the pop would be planned afresh each time."""
    from django.db import connection, transaction

    from jobs import sql
    from jobs.services.pop import pop_params

    params = pop_params(worker, trusted=False, now=now)
    started = time.perf_counter()
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(sql.pop(), params)
            picked = cursor.fetchone()
    return time.perf_counter() - started, picked


def _timed(call, samples: int) -> dict[str, float]:
    # Warm: the pages cached, and the statement run often enough on this connection for
    # psycopg to prepare it (its fifth run) and PostgreSQL to choose its plan (five more).
    for _ in range(11):
        call()
    seconds = []
    for _ in range(samples):
        started = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - started)
    ms = [s * 1000 for s in seconds]
    return {"median_ms": round(statistics.median(ms), 3), "p99_ms": round(percentile(ms, 0.99), 3)}


def _plans_used() -> dict[str, int]:
    """How often PostgreSQL ran the prepared pop query on a generic plan and on custom ones."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement LIKE %s",
            ["%jobs_queuedmodel%"],
        )
        generic, custom = cursor.fetchone() or (0, 0)
    return {"generic": generic, "custom": custom}


def _explain(worker, now) -> str:
    from django.db import connection

    from jobs import sql
    from jobs.services.pop import pop_params

    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql.pop(), pop_params(worker, trusted=False, now=now))
        return "\n".join(row[0] for row in cursor.fetchall())


def _measure(queued: int, workers: int, samples: int):
    """Fill the tables to this size and time every case; returns the figures, the pop cases'
    workers and the time they pop at."""
    from django.utils import timezone

    from jobs.models import TextRequest
    from jobs.status import eligible_workers, request_status

    now = timezone.now()
    fill_queue(queued, workers, now)
    first = TextRequest.objects.order_by("created_at").first().requested_models[0]
    newest = TextRequest.objects.get(requested_models=[NEWEST])
    cases = {
        "head": _worker([first], speed=50, now=now),
        "miss": _worker([NOBODY], speed=50, now=now),
        "newest": _worker([NEWEST], speed=50, now=now),
        "fallback": _worker([LONG], speed=2, now=now),
        "gated": _worker([MODELS[0]], speed=0.5, now=now),
    }
    found = {name: _pop_query(worker, now)[1] is not None for name, worker in cases.items()}
    assert found == {"head": True, "miss": False, "newest": True, "fallback": False, "gated": False}, found
    size = {name: _timed(lambda w=worker: _pop_query(w, now), samples) for name, worker in cases.items()}
    size["pop_plans"] = _plans_used()
    size["status"] = _timed(lambda: request_status(newest, now=now), samples)
    size["eligible"] = _timed(lambda: eligible_workers(newest, now=now), samples)
    return size, cases, now


# --kudos: queued requests' priorities spread as their accounts' balances would be (a few rich,
# most poor: 100,000 x u^3), rather than all 0.
KUDOS_PRIORITIES = False


def main() -> None:
    global KUDOS_PRIORITIES
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--sizes", default="100:10,10000:100,100000:1000")
    parser.add_argument(
        "--plan",
        choices=("auto", "force_generic_plan", "force_custom_plan"),
        default="auto",
        help="plan_cache_mode for the prepared statements (auto: PostgreSQL's choice, as in service)",
    )
    parser.add_argument("--kudos", action="store_true", help="priorities spread as kudos balances")
    args = parser.parse_args()
    KUDOS_PRIORITIES = args.kudos
    sizes = [tuple(int(x) for x in size.split(":")) for size in args.sizes.split(",")]

    setup_django(DB_NAME)
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"SET plan_cache_mode = {args.plan}")

    figures, plans = {}, []
    for queued, workers in sizes:
        size, cases, now = _measure(queued, workers, args.samples)
        figures[f"{queued}:{workers}"] = size
        print(f"flat_costs: {queued} queued, {workers} workers: {json.dumps(size)}", file=sys.stderr)
        if (queued, workers) == sizes[-1]:
            for name in ("miss", "head", "gated"):
                plans.append(f"-- {name}, {queued} queued, {workers} workers\n{_explain(cases[name], now)}\n")
    smallest, largest = (f"{q}:{w}" for q, w in (sizes[0], sizes[-1]))
    ratios = {
        case: round(figures[largest][case]["median_ms"] / figures[smallest][case]["median_ms"], 2)
        for case in figures[largest]
        if "median_ms" in figures[largest][case]
    }
    plans_path = Path(tempfile.mkstemp(prefix="flat-costs-plans-", suffix=".txt")[1])
    plans_path.write_text("\n".join(plans))
    print(f"flat_costs: plans in {plans_path}", file=sys.stderr)
    print(
        json.dumps(
            {
                "bench": "flat_costs",
                "python_loop_seconds": python_loop_seconds(),
                "cores": os.cpu_count(),
                "samples": args.samples,
                "plan_cache_mode": args.plan,
                "kudos_priorities": args.kudos,
                "figures": figures,
                "largest_over_smallest_median": ratios,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
