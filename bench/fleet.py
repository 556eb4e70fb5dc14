"""A fault-injection fleet run against the real stack: is any request lost or accepted twice?

Run:  .venv/bin/python bench/fleet.py [--requests 2000] [--worker-processes 5]
          [--workers-per-process 11] [--requesters 16] [--outages]

(a few minutes; the JSON report goes to stdout, progress notes to stderr.)

It uses its own database (hordeops_bench_fleet) and Redis database 8, and starts the whole
stack as `bin/stack` does, with shrunken leases: gunicorn with uvicorn workers, one Celery
worker and Celery beat running the stale pass every STALE_GENERATION_PASS_SECONDS (2 s);
TEXT_JOB_LEASE_SECONDS 8, caps 24 s (trusted) and 16 s (untrusted), requests live 120 s.

The fleet: --worker-processes processes of --workers-per-process simulated chat workers
(threads), owned by a trusted and an untrusted account, each with a behaviour:

    fast      streams its reply in a few quick progress posts, then submits it
    slow      streams slowly (each post renews the lease; a long reply reaches the cap)
    plain     no progress posts: generates "silently", then submits within the lease
    staller   streams a post or none, then drops the job: its lease lapses, the pass aborts it
    retrier   posts every progress twice and submits twice (the repeat must be refused)

One worker process is killed with SIGKILL a third of the way through (its jobs in flight
lapse) and started again a little later, under the same worker names. Requesters
(--requesters threads in two processes) send --requests requests in all: chat completions
streamed (half with an X-MultiLLM-Deadline-Ms of 20 s), chat completions not streamed, and
horde text requests polled to the end.

With --outages the run has a redis-server and a PostgreSQL cluster of its own (the tests'
`PrivateRedis` and `PrivatePostgres`), and after the worker kill it kills Redis (SIGKILL) and
starts it again, empty, OUTAGE_SECONDS later, then stops PostgreSQL (`pg_ctl -m immediate`)
and starts it again as long after. The report then counts, per outage, the requests it ended
(answered 503, or streams ended by an error event) and the streams cut without one (must be 0).

The report, from the database and from the processes' own records: requests sent, and by
final state (done, faulted, expired, cancelled); `lost`, requests that never reached a final
state (must be 0); `double_accept`, generations accepted twice, or requests with more accepted
generations than asked (must be 0); refused repeat submits; restarts; for each stalled job the
time from the stall to the request's next pop (at most lease + one pass + a worker's pop
interval); every streamed text a requester assembled checked against the text the
worker submitted for it; and `kudos`: the ledger after the run (`bench.common.ledger_checks`:
sum 0, `check_kudos` clean, every accepted generation paid by exactly one event).
"""

import argparse
import json
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import tempfile
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
    reset_tables,
    setup_django,
    start_stack,
    terminate,
)

DB_NAME = "hordeops_bench_fleet"
MODEL = "fleet-model"
SETTINGS = {
    "TEXT_JOB_LEASE_SECONDS": "8",
    "TEXT_JOB_PREPARATION_SECONDS": "2",
    "TRUSTED_TEXT_JOB_LEASE_CAP_SECONDS": "24",
    "UNTRUSTED_TEXT_JOB_LEASE_CAP_SECONDS": "16",
    "STALE_GENERATION_PASS_SECONDS": "2",
    "TEXT_REQUEST_LIFETIME_SECONDS": "120",
    "TEXT_REQUEST_MAX_RESTARTS": "3",
    "WORKER_ONLINE_SECONDS": "60",
    "WORKER_ABORT_MAINTENANCE_THRESHOLD": "100000",
    # The fleet measures leases, not bounds: its one requester account keeps hundreds of
    # requests waiting, all from 127.0.0.1 (bench/flood.py measures the bounds).
    "ACCOUNT_MAX_WAITING_REQUESTS": "100000",
    "KEY_RATE_PER_SECOND": "0",
    "ADDRESS_RATE_PER_SECOND": "0",
}
BEHAVIOURS = ("fast", "fast", "slow", "plain", "plain", "staller", "retrier")
# --outages: how long each part stays down, and the pause between the faults.
OUTAGE_SECONDS = 5
BETWEEN_FAULTS_SECONDS = 15
# A request whose end came this soon after its part came back is still the outage's.
OUTAGE_GRACE_SECONDS = 10
POP_IDLE_SECONDS = 0.3


def _env(overrides: dict[str, str] | None = None) -> dict[str, str]:
    return bench_env(DB_NAME, 8, **{**SETTINGS, **(overrides or {}), "PYTHONUNBUFFERED": "1"})


def _note(text: str) -> None:
    print(f"fleet: {text}", file=sys.stderr, flush=True)


# --- simulated workers ----------------------------------------------------------------------


def _reply(generation_id: str, words: int) -> list[str]:
    """The reply to one job, as the deltas the worker streams (their join is the text)."""
    rng = random.Random(generation_id)
    return [f"{rng.choice(('alpha', 'beta', 'gamma', 'delta', 'omega'))}{i} " for i in range(words)]


def popped_jobs(base: str, api_key: str, name: str, *, max_length: int, stop: float):
    """A simulated chat worker's pops until `stop`: yields (its HTTP client, each job it got),
    popping again after POP_IDLE_SECONDS when there was none or the call failed."""
    import httpx

    http = httpx.Client(base_url=base, headers={"apikey": api_key}, timeout=30)
    pop = {
        "name": name,
        "models": [MODEL],
        "chat": True,
        "max_length": max_length,
        "max_context_length": 4096,
    }
    while time.time() < stop:
        try:
            answer = http.post("/api/v2/generate/text/pop", json=pop)
            job = answer.json() if answer.status_code == 200 else {}
        except (httpx.HTTPError, ValueError):
            job = {}
        if job.get("id"):
            yield http, job
        else:
            time.sleep(POP_IDLE_SECONDS)


def _worker_thread(base: str, api_key: str, name: str, behaviour: str, stop: float, log) -> None:
    import httpx

    rng = random.Random(name)
    for http, job in popped_jobs(base, api_key, name, max_length=512, stop=stop):
        generation_id = job["id"]
        deltas = _reply(generation_id, rng.randint(4, 12))
        streams = job["kind"] == "chat" and behaviour != "plain"
        record = {"generation": generation_id, "worker": name, "behaviour": behaviour, "kind": job["kind"]}
        pause = {"fast": 0.05, "slow": 1.5, "staller": 0.2, "retrier": 0.1, "plain": 0.0}[behaviour]
        sent = 0
        try:
            if behaviour == "staller":
                for seq in range(1, rng.randint(0, 1) + 1):
                    if streams:
                        http.post(
                            "/api/v2/generate/text/progress",
                            json={"id": generation_id, "seq": seq, "delta": deltas[seq - 1]},
                        )
                        sent = seq
                record["stalled_at"] = time.time()
                record["deltas_sent"] = sent
                log(record)
                continue  # drops the job
            if streams:
                for seq, delta in enumerate(deltas, start=1):
                    time.sleep(pause)
                    body = {"id": generation_id, "seq": seq, "delta": delta, "tokens": seq}
                    posted = http.post("/api/v2/generate/text/progress", json=body)
                    if behaviour == "retrier":
                        http.post("/api/v2/generate/text/progress", json=body)
                    if posted.status_code != 200:
                        record["progress_refused"] = posted.json().get("rc")
                        break
            else:
                time.sleep(rng.uniform(0.2, 2.0))
            if "progress_refused" not in record:
                text = "".join(deltas)
                # Written before the submit, so that a kill between the two keeps what was sent.
                log({"generation": generation_id, "worker": name, "sending": text})
                submitted = http.post(
                    "/api/v2/generate/text/submit", json={"id": generation_id, "generation": text}
                )
                record["submit"] = submitted.status_code
                record["text"] = text
                if submitted.status_code != 200:
                    record["submit_rc"] = submitted.json().get("rc")
                if behaviour == "retrier":
                    again = http.post(
                        "/api/v2/generate/text/submit", json={"id": generation_id, "generation": text}
                    )
                    record["repeat_submit"] = again.status_code
                    record["repeat_rc"] = again.json().get("rc") if again.status_code != 200 else None
        except httpx.HTTPError as error:
            record["error"] = repr(error)
        record["ended_at"] = time.time()
        log(record)


def _worker_process(base: str, keys: dict, index: int, count: int, stop: float, out_path: str) -> None:
    log = json_lines(out_path)
    threads = []
    for t in range(count):
        behaviour = BEHAVIOURS[(index * count + t) % len(BEHAVIOURS)]
        trust = "trusted" if t % 2 == 0 else "untrusted"
        name = f"fleet-{index}-{t}-{behaviour}-{trust}"
        thread = threading.Thread(
            target=_worker_thread, args=(base, keys[trust], name, behaviour, stop, log), daemon=True
        )
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()


def json_lines(path: str):
    """A log for a process's threads: one JSON line per record, written as it happens, so
    that a SIGKILL loses at most the line it tears."""
    out = open(path, "a", buffering=1)  # noqa: SIM115
    lock = threading.Lock()

    def log(record: dict) -> None:
        with lock:
            out.write(json.dumps(record) + "\n")

    return log


def read_lines(path: Path) -> list[dict]:
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # the line a kill tore
    return records


# --- requesters -------------------------------------------------------------------------------


def _chat(http, kind: str, deadline: bool) -> dict:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 300}
    headers = {"X-MultiLLM-Deadline-Ms": "20000"} if deadline else {}
    if kind == "chat-stream":
        body["stream"] = True
        text, final, request_id = [], None, None
        with http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as answer:
            if answer.status_code != 200:
                return {"status": answer.status_code, "final": "http-error"}
            request_id = answer.headers.get("x-request-id")
            for line in answer.iter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[len("data: ") :]
                if data == "[DONE]":
                    final = final or "done"
                    break
                event = json.loads(data)
                if "error" in event and event.get("error"):
                    final = "error"
                    continue
                request_id = request_id or event.get("id")
                for choice in event.get("choices", []):
                    text.append(choice.get("delta", {}).get("content") or "")
                    if choice.get("finish_reason"):
                        final = "finished"
        return {"status": 200, "final": final or "ended", "text": "".join(text), "chat_id": request_id}
    answer = http.post("/v1/chat/completions", json=body, headers=headers)
    if answer.status_code != 200:
        return {"status": answer.status_code, "final": "http-error"}
    payload = answer.json()
    return {
        "status": 200,
        "final": "done",
        "text": payload["choices"][0]["message"]["content"],
        "chat_id": payload["id"],
    }


def _requester_thread(base: str, api_key: str, quota: int, seed: int, records: list) -> None:
    import httpx

    rng = random.Random(seed)
    http = httpx.Client(
        base_url=base, headers={"apikey": api_key, "Authorization": f"Bearer {api_key}"}, timeout=180
    )
    for _ in range(quota):
        kind = rng.choice(("chat-stream", "chat-stream", "chat", "text"))
        deadline = kind != "text" and rng.random() < 0.5
        started = time.time()
        record = {"kind": kind, "deadline": deadline, "sent_at": started}
        try:
            if kind == "text":
                answer = http.post(
                    "/api/v2/generate/text/async",
                    json={"prompt": "Once upon a time", "models": [MODEL], "params": {"max_length": 80}},
                )
                record["status"] = answer.status_code
                if answer.status_code == 202:
                    record["request_id"] = answer.json()["id"]
                    while time.time() - started < 180:
                        status = http.get(f"/api/v2/generate/text/status/{record['request_id']}").json()
                        if status.get("done") or status.get("faulted"):
                            record["final"] = "done" if not status.get("faulted") else "faulted"
                            record["texts"] = [g["text"] for g in status.get("generations", [])]
                            break
                        time.sleep(0.5)
            else:
                record.update(_chat(http, kind, deadline))
        except httpx.HTTPError as error:
            record["error"] = repr(error)
        record["ended_at"] = time.time()
        records.append(record)


def _requester_process(base: str, api_key: str, threads: int, quota: int, index: int, out_path: str) -> None:
    records: list = []
    per_thread = [quota // threads + (1 if t < quota % threads else 0) for t in range(threads)]
    workers = [
        threading.Thread(target=_requester_thread, args=(base, api_key, n, index * 1000 + t, records))
        for t, n in enumerate(per_thread)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    Path(out_path).write_text(json.dumps(records))


# --- the run ----------------------------------------------------------------------------------


def _start_stack(port: int, rundir: Path, overrides: dict[str, str] | None = None) -> list[subprocess.Popen]:
    return start_stack(port, rundir, _env(overrides), web_workers=3)


def _prepare(overrides: dict[str, str] | None = None) -> dict[str, str]:
    setup_django(DB_NAME, _env(overrides))
    from workers.services import create_account

    reset_tables()
    keys = {}
    for name, trusted in (("requester", False), ("trusted", True), ("untrusted", False)):
        _, keys[name] = create_account(name=f"fleet-{name}", trusted=trusted)
    return keys


def _wait_for_check_ins(expected: int, timeout: float = 120) -> None:
    from django.db import connection

    from workers.models import Worker

    deadline = time.monotonic() + timeout
    while Worker.objects.count() < expected:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {Worker.objects.count()} of {expected} workers checked in")
        time.sleep(0.2)
    connection.close()


def _report(requests_sent: list[dict], worker_records: list[dict], elapsed: float) -> dict:
    from django.db.models import Count, F, Q

    from jobs.models import Generation, TextRequest

    states = Counter(TextRequest.objects.values_list("state", flat=True))
    lost = states.get(TextRequest.State.ACTIVE, 0)
    accepted = Counter(r["generation"] for r in worker_records if r.get("submit") == 200)
    accepted_twice = [g for g, n in accepted.items() if n > 1]
    over_n = TextRequest.objects.annotate(
        done=Count("generations", filter=Q(generations__state=Generation.State.DONE))
    ).filter(done__gt=F("n"))
    repeats = [r for r in worker_records if "repeat_submit" in r]
    # Stall to reassignment: from the worker's stall to the next pop of the same request.
    stalls = {r["generation"]: r["stalled_at"] for r in worker_records if "stalled_at" in r}
    gens = {str(g.id): g for g in Generation.objects.filter(id__in=list(stalls))}
    waits, to_abort = [], []
    for generation_id, stalled_at in stalls.items():
        g = gens.get(generation_id)
        if g is None:
            continue
        if g.finished_at is not None:
            to_abort.append(g.finished_at.timestamp() - stalled_at)
        later = (
            Generation.objects.filter(request_id=g.request_id, popped_at__gt=g.popped_at)
            .order_by("popped_at")
            .values_list("popped_at", flat=True)
            .first()
        )
        if later is not None:
            waits.append(later.timestamp() - stalled_at)
    # Streamed texts against what the workers submitted and the horde accepted.
    done_text = dict(Generation.objects.filter(state=Generation.State.DONE).values_list("request_id", "text"))
    streamed = [
        r for r in requests_sent if r["kind"].startswith("chat") and r.get("final") in ("done", "finished")
    ]
    sent_texts = {r["sending"] for r in worker_records if "sending" in r}
    not_sent = [r for r in streamed if r.get("text") not in sent_texts]
    # The chat id carries the request id: the text must be the one the horde accepted for it.
    not_accepted = [
        r
        for r in streamed
        if done_text.get(uuid.UUID(r["chat_id"].removeprefix("chatcmpl-"))) != r.get("text")
    ]
    step = int(SETTINGS["TEXT_JOB_LEASE_SECONDS"])
    bound = step + int(SETTINGS["STALE_GENERATION_PASS_SECONDS"]) + 2 * POP_IDLE_SECONDS
    return {
        "requests_sent": len(requests_sent),
        "requests_in_database": sum(states.values()),
        "final_states": {k: v for k, v in states.items() if k != TextRequest.State.ACTIVE},
        "lost": lost,
        "double_accept": len(accepted_twice) + over_n.count(),
        "repeat_submits": {
            "sent": len(repeats),
            "refused": sum(1 for r in repeats if r["repeat_submit"] != 200),
            "codes": dict(Counter(str(r.get("repeat_rc")) for r in repeats)),
        },
        "restarts": sum(TextRequest.objects.values_list("restarts", flat=True)),
        "generations": dict(Counter(Generation.objects.values_list("state", flat=True))),
        "stalls": {
            "jobs_stalled": len(stalls),
            "longest_stall_to_abort_s": round(max(to_abort), 2) if to_abort else None,
            "abort_bound_s": step + int(SETTINGS["STALE_GENERATION_PASS_SECONDS"]),
            "aborts_within_bound": all(
                w <= step + int(SETTINGS["STALE_GENERATION_PASS_SECONDS"]) + 0.5 for w in to_abort
            ),
            "reassigned": len(waits),
            "longest_stall_to_reassignment_s": round(max(waits), 2) if waits else None,
            "median_stall_to_reassignment_s": round(sorted(waits)[len(waits) // 2], 2) if waits else None,
            "reassignment_bound_s": bound,
            "reassignments_within_bound": sum(1 for w in waits if w <= bound),
        },
        "streams": {
            "completed_chat_replies_checked": len(streamed),
            "text_no_worker_sent": len(not_sent),
            "text_not_the_accepted_one": len(not_accepted),
        },
        "requester_outcomes": dict(
            Counter(f"{r['kind']}:{r.get('final', r.get('status'))}" for r in requests_sent)
        ),
        "requester_errors": sum(1 for r in requests_sent if "error" in r),
        "elapsed_s": round(elapsed, 1),
    }


def _unsettled(TextRequest, Generation) -> bool:
    """Whether any request or generation is still open (True while the database is away)."""
    from django.db import DatabaseError

    try:
        return (
            TextRequest.objects.filter(state=TextRequest.State.ACTIVE).exists()
            or Generation.objects.processing().exists()
        )
    except DatabaseError:
        return True


def _outage_report(outages: list[dict], requests_sent: list[dict]) -> list[dict]:
    """Per outage: the requests that ended in it, and how."""
    report = []
    for outage in outages:
        ended = [
            r
            for r in requests_sent
            if outage["down_at"] <= r["ended_at"] <= outage["up_at"] + OUTAGE_GRACE_SECONDS
            and r["sent_at"] <= outage["up_at"]
        ]
        report.append(
            {
                "part": outage["part"],
                "down_s": round(outage["up_at"] - outage["down_at"], 1),
                "requests_ended_in_it": len(ended),
                "answered_503": sum(1 for r in ended if r.get("status") == 503),
                "streams_ended_by_error_event": sum(1 for r in ended if r.get("final") == "error"),
                "streams_cut_without_event": sum(1 for r in ended if r.get("final") == "ended"),
                "transport_errors": sum(1 for r in ended if "error" in r),
                "finished_anyway": sum(1 for r in ended if r.get("final") in ("done", "finished")),
            }
        )
    return report


def _outages(redis, postgres) -> list[dict]:
    """Kill Redis, bring it back; later stop PostgreSQL, bring it back. Returns their times."""
    outages = []
    for part, down, up in (
        ("redis", redis.kill, redis.start),
        ("postgresql", postgres.stop, postgres.start),
    ):
        time.sleep(BETWEEN_FAULTS_SECONDS)
        down_at = time.time()
        down()
        _note(f"{part} down")
        time.sleep(OUTAGE_SECONDS)
        up()
        outages.append({"part": part, "down_at": down_at, "up_at": time.time()})
        _note(f"{part} back")
    return outages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--worker-processes", type=int, default=5)
    parser.add_argument("--workers-per-process", type=int, default=11)
    parser.add_argument("--requesters", type=int, default=32)
    parser.add_argument("--max-seconds", type=int, default=900)
    parser.add_argument("--outages", action="store_true", help="kill Redis, then PostgreSQL, mid-run")
    args = parser.parse_args()

    rundir = Path(tempfile.mkdtemp(prefix="hordeops-fleet-"))
    overrides, servers = {}, None
    if args.outages:
        from tests.live import PrivatePostgres, PrivateRedis

        servers = PrivateRedis(rundir), PrivatePostgres()
        servers[0].start()
        servers[1].create()
        overrides = {"REDIS_URL": servers[0].url, "DATABASE_URL": servers[1].url}
        _note(f"own Redis at {servers[0].url}, own PostgreSQL at {servers[1].url}")
    keys = _prepare(overrides)
    port = 18000 + random.randint(0, 999)
    base = f"http://127.0.0.1:{port}"
    stack = _start_stack(port, rundir, overrides)
    _note(f"stack up on {base}, logs in {rundir}")
    context = multiprocessing.get_context("spawn")
    started = time.time()
    stop = started + args.max_seconds
    workers = {}
    for i in range(args.worker_processes):
        out = str(rundir / f"workers-{i}.jsonl")
        workers[i] = context.Process(
            target=_worker_process,
            args=(base, keys, i, args.workers_per_process, stop, out),
        )
        workers[i].start()
    # Requests for models no worker serves yet are refused (400), as the AI Horde does: the
    # requesters start once every worker has checked in.
    _wait_for_check_ins(args.worker_processes * args.workers_per_process)
    requesters = []
    for i in range(2):
        out = str(rundir / f"requesters-{i}.json")
        quota = args.requests // 2 + (args.requests % 2 if i == 0 else 0)
        process = context.Process(
            target=_requester_process, args=(base, keys["requester"], args.requesters // 2, quota, i, out)
        )
        process.start()
        requesters.append((process, out))
    # The fault: kill one worker process outright a while in, and bring it back later.
    time.sleep(20)
    victim = args.worker_processes - 1
    os.kill(workers[victim].pid, signal.SIGKILL)
    _note(f"SIGKILLed worker process {victim}")
    time.sleep(10)
    out = str(rundir / f"workers-{victim}-again.jsonl")
    workers["again"] = context.Process(
        target=_worker_process, args=(base, keys, victim, args.workers_per_process, stop, out)
    )
    workers["again"].start()
    _note("worker process restarted")
    outages = _outages(*servers) if servers else []
    for process, _ in requesters:
        process.join(timeout=max(1, stop - time.time()))
    elapsed = time.time() - started
    _note(f"requesters done after {elapsed:.0f} s; draining")
    # Let the last leases lapse and the pass settle what is left, then stop the workers.
    deadline = time.time() + 60
    from jobs.models import Generation, TextRequest

    while time.time() < deadline and _unsettled(TextRequest, Generation):
        time.sleep(1)
    for process in workers.values():
        if process.is_alive():
            process.terminate()
        process.join(timeout=30)
    worker_records = [r for path in rundir.glob("workers-*.jsonl") for r in read_lines(path)]
    requests_sent = []
    for _, path in requesters:
        requests_sent += json.loads(Path(path).read_text())
    report = _report(requests_sent, worker_records, elapsed)
    report["kudos"] = ledger_checks()
    if outages:
        report["outages"] = _outage_report(outages, requests_sent)
    terminate(stack)
    if servers:
        from django.db import connections

        connections.close_all()
        servers[0].kill()
        servers[1].stop()
    print(
        json.dumps(
            {
                "bench": "fleet",
                "machine": {"cores": os.cpu_count(), "load_average_1m": round(os.getloadavg()[0], 2)},
                "settings": SETTINGS,
                "fleet": {
                    "worker_processes": args.worker_processes,
                    "workers": args.worker_processes * args.workers_per_process,
                    "behaviours": dict(Counter(BEHAVIOURS)),
                    "killed_and_restarted": 1,
                    "requester_threads": args.requesters,
                },
                **report,
                "run_id": uuid.uuid4().hex[:8],
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
