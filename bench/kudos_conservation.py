"""Kudos conservation under load: the ledger balances and no upfront spend is admitted past its
payer, with 32 threads queueing, serving, cancelling, transferring and passing at once.

Run:  .venv/bin/python bench/kudos_conservation.py [--seconds 120] [--threads 32]

(about --seconds and a setup of seconds; the JSON goes to stdout.)

It uses its own database (hordeops_bench_kudos, created and migrated if missing) and Redis
database 11, and calls the services in this process (each thread its own connection):

    requesters (3/8 of the threads)  queue text requests (a third refusing slow workers, so that
                                     they need their kudos upfront), and cancel one in five
    workers (1/4)                    pop and submit, one job in ten held and never submitted
                                     (left to the stale pass)
    senders (1/4)                    transfer kudos between 8 overlapping accounts, one in four
                                     retried with its Idempotency-Key
    passes (1/8)                     the stale pass and the kudos pass, in turns

Leases are 2 s (TEXT_JOB_LEASE_SECONDS), so held jobs lapse within the run. At the end:
`ledger_sum` (all postings: must be 0), `check_kudos` (every balance and kudos_details against
its postings: "clean"), `deadlocks` and other errors by type (must be none), and
`forgiven_upfront_debits`: what the floor forgave to accounts that only ever queued upfront
requests and sent transfers, both admitted against what they could spend. Their requests name
one model, so what they are charged never passes what was held for it: anything forgiven there
would be a spend admitted past its payer (must be 0).
"""

import argparse
import json
import os
import random
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.common import (  # noqa: E402
    bench_env,
    ledger_checks,
    python_loop_seconds,
    reset_tables,
    setup_django,
)

DB_NAME = "hordeops_bench_kudos"
MODEL = "bench-13b"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--threads", type=int, default=32)
    args = parser.parse_args()
    env = bench_env(
        DB_NAME,
        11,
        TEXT_JOB_LEASE_SECONDS="2",
        TEXT_JOB_PREPARATION_SECONDS="1",
        KEY_RATE_PER_SECOND="0",
        ADDRESS_RATE_PER_SECOND="0",
        ACCOUNT_MAX_WAITING_REQUESTS="1000",
        DATABASE_POOL_MAX_SIZE="40",  # a connection for each thread
    )
    setup_django(DB_NAME, env)
    print(json.dumps(run(args.seconds, args.threads), indent=2))


def run(seconds: float, threads: int) -> dict:
    from decimal import Decimal

    from django.db import connections

    from hordeops import errors
    from jobs import services
    from kudos import ledger, transfers
    from kudos.models import Event, Posting, TextModel, Wallet
    from kudos.passes import run_kudos_pass
    from workers.declaration import WorkerDeclaration
    from workers.services import create_account

    reset_tables()
    TextModel.objects.update_or_create(name=MODEL, defaults={"parameters": 13_000_000_000})
    created = [create_account(name=f"kc-{i}", trusted=i < 4) for i in range(8)]
    accounts = [account for account, _ in created]
    keys = {account.pk: key for account, key in created}
    upfront_only = accounts[6:]  # queue upfront requests and send transfers, nothing else
    for account in accounts:
        ledger.post(
            kind=Event.Kind.AWARD,
            key=f"award:{account.pk}",
            entries=[
                ledger.to_system(Wallet.System.TREASURY, -Decimal(5000)),
                ledger.to_account(account.pk, Decimal(5000)),
            ],
        )
    stop = time.monotonic() + seconds
    outcomes: Counter[str] = Counter()
    failures: Counter[str] = Counter()
    lock = threading.Lock()

    def count(name: str, table: Counter = outcomes) -> None:
        with lock:
            table[name] += 1

    def loop(step) -> None:
        rng = random.Random()
        try:
            while time.monotonic() < stop:
                try:
                    count(step(rng))
                except errors.DomainError as exc:
                    count(exc.code)
                except Exception as exc:  # every other error is a finding
                    kind = "deadlock" if "deadlock" in str(exc) else type(exc).__name__
                    if kind not in failures:
                        print(f"{step.__name__}: {kind}: {str(exc)[:600]}", file=sys.stderr)
                    count(kind, failures)
        finally:
            connections.close_all()

    def request(rng) -> str:
        payer = rng.choice(upfront_only if rng.random() < 0.5 else accounts[:6])
        upfront = payer in upfront_only or rng.random() < 0.3
        queued = services.create_text_request(
            account=payer,
            address="",
            prompt="x" * rng.randint(10, 400),
            params={"n": 1, "max_length": rng.choice([64, 128, 600]), "max_context_length": 2048},
            models=[MODEL],
            workers=[],
            trusted_workers=False,
            slow_workers=not upfront,
            dry_run=False,
        )
        if rng.random() < 0.2:
            services.cancel_request(request_id=queued.request.pk)
            return "queued_and_cancelled"
        return "queued"

    def work(rng) -> str:
        name = f"kc-worker-{threading.get_ident() % 1000}"
        owner = accounts[threading.get_ident() % 6]
        popped = services.pop_generation(
            api_key=keys[owner.pk],
            declaration=WorkerDeclaration(
                name=name,
                models=[MODEL],
                max_length=1024,
                max_context_length=4096,
                amount=1,
                threads=1,
                nsfw=False,
                chat=False,
                tools=False,
                structured_outputs=False,
                bridge_agent="AI Horde Worker:1:bench",
                wait_seconds=0,
            ),
        )
        if isinstance(popped, services.EmptyPop):
            time.sleep(0.01)
            return "empty_pop"
        if rng.random() < 0.1:
            return "held"
        services.submit_generation(
            api_key=keys[owner.pk],
            generation_id=popped.first.pk,
            text="y" * rng.randint(80, 2400),
            state="ok",
            seed=0,
            gen_metadata=[],
        )
        return "submitted"

    def send(rng) -> str:
        source, target = rng.sample(accounts, 2)
        key = uuid.uuid4().hex
        amount = rng.randint(1, 40)
        tries = 2 if rng.random() < 0.25 else 1
        for _ in range(tries):
            transfers.transfer_kudos(
                source=source, username=f"x#{target.pk}", amount=amount, idempotency_key=key
            )
        return "transferred"

    def passes(rng) -> str:
        services.abort_stale_generations()
        run_kudos_pass()
        time.sleep(0.5)
        return "passes"

    roles = [request] * (threads * 3 // 8) + [work] * (threads // 4) + [send] * (threads // 4)
    roles += [passes] * (threads - len(roles))
    workers = [threading.Thread(target=loop, args=(role,)) for role in roles]
    started = time.monotonic()
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    elapsed = time.monotonic() - started

    upfront_ids = [a.pk for a in upfront_only]
    forgiven = Posting.objects.filter(
        event__kind=Event.Kind.FORGIVEN,
        wallet__account_id__in=upfront_ids,
        event__created_at__gt=_after_awards(),
    ).total()
    return {
        "bench": "kudos_conservation",
        "machine": {"cores": os.cpu_count(), "python_loop_seconds": python_loop_seconds()},
        "seconds": round(elapsed, 1),
        "threads": threads,
        "outcomes": dict(outcomes),
        "errors": dict(failures),
        **ledger_checks(),
        "forgiven_upfront_debits": str(forgiven),
    }


def _after_awards():
    from kudos.models import Event

    return (
        Event.objects.filter(kind=Event.Kind.AWARD)
        .order_by("-created_at")
        .values_list("created_at", flat=True)[0]
    )


if __name__ == "__main__":
    main()
