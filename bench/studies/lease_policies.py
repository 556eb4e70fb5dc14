"""Flat leases against progress-renewed leases with caps, on the fleet simulator's real stack.

Run:  .venv/bin/python bench/studies/lease_policies.py [--requests 160] [--workers 30] [--seconds 240]

(about ten minutes; the JSON goes to stdout, the plot to docs/lease_policies.png.)

Both policies run on the same fleet, with the stack that bench/fleet.py starts (gunicorn with
uvicorn workers, Celery worker and beat) and time shrunk 15-fold: the 150 s lease is 10 s, a
trusted cap of 600 s is 40 s, an untrusted cap of 200 s is 13 s, the stale pass runs every 2 s.

    flat      the AI Horde's rule: every job has its 10 s ("150 s") from the pop, whatever it
              delivers (both caps set to the lease, so progress posts renew nothing)
    renewed   the renewal rule: each progress post with new output moves the lease end to
              now + 10 s, up to the cap (40 s trusted, 13 s untrusted)

The fleet: --workers chat workers in 3 processes, half trusted, each with a speed drawn once
from a log-normal spread (median 20 tokens/s, most between 6 and 70), streaming what they
generate in a progress post every second; one job in eight stalls at a random point (the
worker stops and never submits). The queue: --requests chat requests queued at the start, half
short replies (50-150 tokens) and half long ones (300-900 tokens: longer than a median worker
makes in one lease). Each policy runs until the queue is settled or --seconds have passed.

Reported per policy: the share of long and of short replies served (done), faulted after
their restarts, or still unsettled; and for each stalled job the time it held its request, from
the stall to the pass's abort.
"""

import argparse
import json
import math
import multiprocessing
import random
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from bench.common import terminate  # noqa: E402
from bench.fleet import (  # noqa: E402
    MODEL,
    _prepare,
    _start_stack,
    _wait_for_check_ins,
    json_lines,
    popped_jobs,
    read_lines,
)

LEASE = 10
POLICIES = {
    "flat": {
        "TRUSTED_TEXT_JOB_LEASE_CAP_SECONDS": str(LEASE),
        "UNTRUSTED_TEXT_JOB_LEASE_CAP_SECONDS": str(LEASE),
    },
    "renewed": {"TRUSTED_TEXT_JOB_LEASE_CAP_SECONDS": "40", "UNTRUSTED_TEXT_JOB_LEASE_CAP_SECONDS": "13"},
}
COMMON = {
    "TEXT_JOB_LEASE_SECONDS": str(LEASE),
    "TEXT_JOB_PREPARATION_SECONDS": "1",
    "STALE_GENERATION_PASS_SECONDS": "2",
    "TEXT_REQUEST_LIFETIME_SECONDS": "600",
    "TEXT_REQUEST_MAX_RESTARTS": "3",
    "WORKER_ONLINE_SECONDS": "60",
    "WORKER_ABORT_MAINTENANCE_THRESHOLD": "100000",
    # Unmeasured workers are assumed to make 10 tokens/s, so a 300-token reply is first offered
    # to measured fast workers, as the speed gate prefers.
}
STALL_SHARE = 1 / 8
LONG = (300, 900)
SHORT = (50, 150)


def _worker(base: str, api_key: str, name: str, speed: float, stop: float, log) -> None:
    rng = random.Random(name)
    for http, job in popped_jobs(base, api_key, name, max_length=1024, stop=stop):
        wanted = job["payload"]["max_length"]
        stall_after = rng.uniform(0.1, 0.9) * wanted / speed if rng.random() < STALL_SHARE else None
        started, made, seq, refused = time.time(), 0, 0, None
        while made < wanted:
            time.sleep(1.0)
            elapsed = time.time() - started
            if stall_after is not None and elapsed >= stall_after:
                log({"generation": job["id"], "stalled_at": time.time(), "speed": speed})
                break
            new = min(wanted, int(elapsed * speed)) - made
            if new <= 0:
                continue
            seq += 1
            answer = http.post(
                "/api/v2/generate/text/progress",
                json={"id": job["id"], "seq": seq, "delta": "tok " * new, "tokens": made + new},
            )
            made += new
            if answer.status_code != 200:
                refused = answer.json().get("rc")
                break
        else:
            http.post("/api/v2/generate/text/submit", json={"id": job["id"], "generation": "tok " * wanted})
        if refused:
            log({"generation": job["id"], "refused": refused, "made": made, "wanted": wanted, "speed": speed})


def _worker_process(
    base: str, keys: dict, index: int, count: int, stop: float, seed: int, out_path: str
) -> None:
    log = json_lines(out_path)
    rng = random.Random(seed * 100 + index)
    threads = []
    for t in range(count):
        speed = min(200.0, math.exp(rng.gauss(math.log(20), 0.75)))
        trust = "trusted" if t % 2 == 0 else "untrusted"
        thread = threading.Thread(
            target=_worker,
            args=(base, keys[trust], f"policy-{index}-{t}-{trust}", speed, stop, log),
            daemon=True,
        )
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()


def _queue(requests: int, seed: int) -> dict[str, str]:
    """Queue the chat requests; return each request id's size class."""
    from jobs.services import create_reply_request
    from workers.models import Account

    rng = random.Random(seed)
    account = Account.objects.get(name="fleet-requester")
    sizes = {}
    for i in range(requests):
        size = "long" if i % 2 else "short"
        low, high = LONG if size == "long" else SHORT
        request = create_reply_request(
            account=account,
            address="",
            model=MODEL,
            messages=[{"role": "user", "content": "Write it."}],
            max_length=rng.randint(low, high),
            params={},
        )
        sizes[str(request.id)] = size
    return sizes


def _run(policy: str, args) -> dict:
    overrides = {**COMMON, **POLICIES[policy]}
    keys = _prepare(overrides)
    from jobs.models import Generation, TextRequest

    rundir = Path(tempfile.mkdtemp(prefix=f"hordeops-policy-{policy}-"))
    port = 19000 + random.randint(0, 999)
    base = f"http://127.0.0.1:{port}"
    stack = _start_stack(port, rundir, overrides)
    context = multiprocessing.get_context("spawn")
    stop = time.time() + args.seconds
    per_process = args.workers // 3
    workers = [
        context.Process(
            target=_worker_process,
            args=(base, keys, i, per_process, stop, args.seed, str(rundir / f"workers-{i}.jsonl")),
        )
        for i in range(3)
    ]
    for process in workers:
        process.start()
    # Queued once the workers have checked in, so that the speed gate sees them online.
    _wait_for_check_ins(per_process * 3)
    sizes = _queue(args.requests, args.seed)
    started = time.time()
    while time.time() < stop and TextRequest.objects.filter(state=TextRequest.State.ACTIVE).exists():
        time.sleep(1)
    settled_after = time.time() - started
    for process in workers:
        process.terminate()
        process.join(timeout=30)
    terminate(stack)
    records = [r for path in rundir.glob("workers-*.jsonl") for r in read_lines(path)]
    states = dict(TextRequest.objects.values_list("id", "state"))
    outcome = {}
    for size in ("long", "short"):
        ids = [rid for rid, s in sizes.items() if s == size]
        counts = {}
        for rid in ids:
            state = states[uuid.UUID(rid)]
            counts[state] = counts.get(state, 0) + 1
        outcome[size] = {
            "requests": len(ids),
            "served_share": round(counts.get("done", 0) / len(ids), 3),
            "states": counts,
        }
    aborted_at = {
        str(g.id): g.finished_at.timestamp()
        for g in Generation.objects.filter(state=Generation.State.ABORTED).only("id", "finished_at")
    }
    holds = [
        aborted_at[r["generation"]] - r["stalled_at"]
        for r in records
        if "stalled_at" in r and r["generation"] in aborted_at
    ]
    return {
        "settings": overrides,
        "settled_after_s": round(settled_after, 1),
        "replies": outcome,
        "restarts": sum(TextRequest.objects.values_list("restarts", flat=True)),
        "progress_refused_at_cap_or_lapsed": sum(1 for r in records if "refused" in r),
        "stalls": {
            "jobs_stalled": sum(1 for r in records if "stalled_at" in r),
            "hold_s_median": round(statistics.median(holds), 2) if holds else None,
            "hold_s_max": round(max(holds), 2) if holds else None,
            "holds": [round(h, 2) for h in sorted(holds)],
        },
    }


def _plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (served, held) = plt.subplots(1, 2, figsize=(10, 4))
    names = list(results)
    width = 0.35
    for offset, size in ((-width / 2, "long"), (width / 2, "short")):
        values = [results[name]["replies"][size]["served_share"] * 100 for name in names]
        bars = served.bar([i + offset for i in range(len(names))], values, width, label=f"{size} replies")
        served.bar_label(bars, fmt="%.0f%%")
    served.set_xticks(range(len(names)), [f"{n} lease" for n in names])
    served.set_ylabel("replies served (%)")
    served.set_ylim(0, 110)
    served.set_title("Chat replies served")
    served.legend(loc="lower right")
    held.boxplot(
        [results[name]["stalls"]["holds"] or [0] for name in names], tick_labels=[f"{n} lease" for n in names]
    )
    held.set_ylabel(f"seconds (lease = {LEASE} s, i.e. 150 s / 15)")
    held.set_title("Time a stalled job holds its request")
    fig.suptitle("Flat 150 s lease vs progress-renewed leases with caps (time shrunk 15x)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=160)
    parser.add_argument("--workers", type=int, default=30)
    parser.add_argument("--seconds", type=int, default=240)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--plot", default=str(ROOT / "docs" / "lease_policies.png"))
    args = parser.parse_args()
    results = {}
    for policy in POLICIES:
        print(f"lease_policies: {policy}", file=sys.stderr, flush=True)
        results[policy] = _run(policy, args)
    _plot(results, Path(args.plot))
    for result in results.values():
        result["stalls"].pop("holds")
    print(json.dumps({"bench": "lease_policies", "plot": args.plot, "policies": results}, indent=2))


if __name__ == "__main__":
    main()
