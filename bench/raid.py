"""A scripted raid on a live web stack, and what the moderation defences let through.

Run:  .venv/bin/python bench/raid.py [--flood-seconds 5]

(about half a minute; the JSON goes to stdout.)

It uses its own database (hordeops_bench_raid) and Redis database 8, and starts the web server
as `bin/stack` does (gunicorn, 2 uvicorn workers) with TRUSTED_PROXIES=127.0.0.1, so that each
raider sends the address it comes from as a proxy in front would (X-Forwarded-For). The
horde's own limits are as they ship (3 workers an untrusted account, 3 workers of untrusted
accounts an address, 30 waiting requests an account, 10 calls a second a key with a burst of 30).

1. **New accounts' workers**: 50 new accounts each start a worker from one of 3 addresses.
   A moderator then switches raid mode on and 10 more new accounts try from new addresses;
   then times out the raiders' network (`POST /api/v2/operations/ipaddr`, a /24) and the
   raiders' workers that got in pop again: how long until every web process refuses them.
2. **A worker that lies about its speed**: an untrusted worker serving a 13B model (its
   ceiling 150 tokens/s) hands in every 512-token job at 1,500 tokens/s (10x), while an honest
   worker of the same model delivers 50 tokens/s; a requester keeps 20 jobs queued. How many
   jobs the liar gets before its account is flagged, and whether the honest one is suspected.
3. **A key flooding requests**: 8 threads of one key queue requests as fast as answers come
   for --flood-seconds; then a moderator suspends it (with a reason) and it tries again.
"""

import argparse
import json
import os
import sys
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.common import bench_env, free_port, reset_tables, serving, setup_django  # noqa: E402
from bench.flood import Client  # noqa: E402

DB_NAME = "hordeops_bench_raid"
MODEL = "koboldcpp/Raid-13B"
RAID_ADDRESSES = ("203.0.113.7", "203.0.113.8", "203.0.113.9")
ASYNC, POP, SUBMIT = (
    "/api/v2/generate/text/async",
    "/api/v2/generate/text/pop",
    "/api/v2/generate/text/submit",
)


def _env() -> dict[str, str]:
    # The horde's limits as they ship (bench_env lifts the per-account ones for the fleets).
    return bench_env(
        DB_NAME, 8, TRUSTED_PROXIES="127.0.0.1", WORKER_LIMIT_UNTRUSTED="3", WORKER_LIMIT_TRUSTED="20"
    )


def _tally(answers: list[tuple[int, dict]]) -> dict[str, int]:
    return dict(Counter(f"{status} {answer.get('rc', '')}".strip() for status, answer in answers))


def new_accounts_raid(port: int, moderator_key: str) -> dict:
    from workers.models import HordeModes
    from workers.services import create_account

    raiders = [create_account(name=f"raider-{n}")[1] for n in range(60)]
    first = []
    for n, key in enumerate(raiders[:50]):
        address = RAID_ADDRESSES[n % 3]
        first.append(Client(port, key).call("POST", POP, {"name": f"raid-{n}", "models": [MODEL]}, address))
    got_in = [n for n, (status, _) in enumerate(first) if status == 200]

    HordeModes.objects.update_or_create(pk=1, defaults={"raid": True})
    in_raid_mode = [
        Client(port, key).call(
            "POST", POP, {"name": f"raid-late-{n}", "models": [MODEL]}, f"198.51.100.{n + 1}"
        )
        for n, key in enumerate(raiders[50:])
    ]
    HordeModes.objects.update_or_create(pk=1, defaults={"raid": False})

    moderator = Client(port, moderator_key)
    timed_out = moderator.call("POST", "/api/v2/operations/ipaddr", {"ipaddr": "203.0.113.0/24", "hours": 24})
    started, refused_all = time.monotonic(), None
    while time.monotonic() - started < 10:
        again = [
            Client(port, raiders[n]).call(
                "POST", POP, {"name": f"raid-{n}", "models": [MODEL]}, RAID_ADDRESSES[n % 3]
            )
            for n in got_in
        ]
        if all(answer.get("rc") == "TimeoutIP" for _, answer in again):
            refused_all = round(time.monotonic() - started, 2)
            break
    return {
        "first_pops_from_3_addresses": _tally(first),
        "workers_that_got_in": len(got_in),
        "raid_mode_pops_from_new_addresses": _tally(in_raid_mode),
        "timeout_of_the_network": timed_out[1],
        "seconds_until_every_raider_was_refused": refused_all,
        "raiders_pops_after_the_timeout": _tally(again),
    }


def _serve(port: int, key: str, name: str, speed: float, jobs: int, stop: threading.Event, got: list) -> None:
    """A worker that hands each 512-token job in at `speed` tokens a second, `jobs` of them."""
    client = Client(port, key)
    body = {"name": name, "models": [MODEL], "max_length": 512, "max_context_length": 4096}
    deadline = time.monotonic() + 60
    while not stop.is_set() and len(got) < jobs and time.monotonic() < deadline:
        status, job = client.call("POST", POP, body)
        if status != 200 or not job.get("id"):
            got.append(None)  # offered nothing
            if got.count(None) >= 5:
                return
            stop.wait(0.2)
            continue
        time.sleep(512 / speed)
        client.call("POST", SUBMIT, {"id": job["id"], "generation": "x" * 2048})  # 512 tokens
        got.append(job["id"])


def speed_liar(port: int) -> dict:
    from kudos.models import TextModel
    from workers.models import Account, Suspicion
    from workers.services import create_account

    TextModel.objects.update_or_create(name=MODEL, defaults={"parameters": 13_000_000_000})
    _, liar_key = create_account(name="liar")
    _, honest_key = create_account(name="honest")
    _, requester_key = create_account(name="raid-requester", trusted=True)
    Account.objects.filter(name="raid-requester").update(max_waiting_requests=1000)
    requester = Client(port, requester_key)
    for _ in range(60):
        requester.call(
            "POST", ASYNC, {"prompt": "Tell me more.", "models": [MODEL], "params": {"max_length": 512}}
        )
    stop = threading.Event()
    liar_jobs, honest_jobs = [], []
    threads = [
        threading.Thread(target=_serve, args=(port, liar_key, "liar-w", 1500.0, 20, stop, liar_jobs)),
        threading.Thread(target=_honest, args=(port, honest_key, stop, honest_jobs)),
    ]
    for thread in threads:
        thread.start()
    threads[0].join(90)
    stop.set()
    threads[1].join(90)
    liar = Account.objects.get(name="liar")
    return {
        "liar_jobs_before_it_was_offered_nothing": sum(1 for job in liar_jobs if job),
        "liar_flagged": liar.flagged_at is not None,
        "liar_suspicions": [s.detail for s in Suspicion.objects.filter(account=liar)[:2]],
        "honest_jobs": sum(1 for job in honest_jobs if job),
        "honest_suspicions": Suspicion.objects.filter(account__name="honest").count(),
    }


def _honest(port: int, key: str, stop: threading.Event, got: list) -> None:
    """50 tokens a second: 64-token jobs handed in after 1.28 s."""
    client = Client(port, key)
    body = {"name": "honest-w", "models": [MODEL], "max_length": 512, "max_context_length": 4096}
    while not stop.is_set() and len(got) < 3:
        status, job = client.call("POST", POP, body)
        if status != 200 or not job.get("id"):
            stop.wait(0.2)
            continue
        time.sleep(64 / 50)
        client.call("POST", SUBMIT, {"id": job["id"], "generation": "y" * 256})  # 64 tokens
        got.append(job["id"])


def flooding_key(port: int, seconds: float) -> dict:
    from front.moderation import suspend_accounts
    from jobs.models import TextRequest
    from workers.models import Account
    from workers.services import create_account

    _, key = create_account(name="flooder")
    stop, answers, lock = threading.Event(), [], threading.Lock()

    def flood() -> None:
        client = Client(port, key)
        while not stop.is_set():
            answer = client.call(
                "POST", ASYNC, {"prompt": "flood", "models": ["nobody-serves-this"]}, "192.0.2.77"
            )
            with lock:
                answers.append(answer)

    threads = [threading.Thread(target=flood) for _ in range(8)]
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join(30)
    waiting = TextRequest.objects.filter(account__name="flooder", state=TextRequest.State.ACTIVE).count()
    suspend_accounts(accounts=Account.objects.filter(name="flooder"), reason="Flooding requests.", now=_now())
    after = Client(port, key).call("POST", ASYNC, {"prompt": "flood"}, "192.0.2.77")
    states = Counter(TextRequest.objects.filter(account__name="flooder").values_list("state", flat=True))
    return {
        "answers_while_flooding": _tally(answers),
        "waiting_at_most_at_once": waiting,
        "after_suspension": {
            "status": after[0],
            "rc": after[1].get("rc"),
            "message": after[1].get("message"),
        },
        "its_requests_by_state_after_suspension": dict(states),
    }


def _now():
    from hordeops import clock

    return clock.now()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flood-seconds", type=float, default=5)
    args = parser.parse_args()
    env = _env()
    setup_django(DB_NAME, env)
    reset_tables()
    from workers.models import Account
    from workers.services import create_account

    _, moderator_key = create_account(name="raid-moderator")
    Account.objects.filter(name="raid-moderator").update(moderator=True)
    from django.db import connection

    connection.close()
    port = free_port()
    with serving(port, 2, env):
        figures = {
            "bench": "raid",
            "machine": {"cores": os.cpu_count()},
            "new_accounts_raid": new_accounts_raid(port, moderator_key),
            "speed_liar": speed_liar(port),
            "flooding_key": flooding_key(port, args.flood_seconds),
        }
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
