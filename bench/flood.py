"""One key (and the anonymous key from many addresses) flooding the horde while another account
is served: what the flood gets, what the other account waits, and the pop's latency meanwhile.

Run:  .venv/bin/python bench/flood.py [--seconds 30] [--bounds off]

(about a minute a run; the JSON goes to stdout.)

It uses its own database (hordeops_bench_flood) and Redis database 9, and starts the stack's
web server as `bin/stack` does (gunicorn, 2 uvicorn workers), with TRUSTED_PROXIES=127.0.0.1
so that the load can send X-Forwarded-For as a proxy in front would: the anonymous flood
comes from a new address for every request. For --seconds, at once:

    heavy      8 threads, one key, async requests as fast as answers come back
    anonymous  4 threads, the anonymous key, a new client address each request
    light      one request a second from another account
    workers    4 workers (threads) of the model, each popping, then submitting at once

and reports, per flood, the answers by status and rc; for the light account, how long each
of its requests waited from being queued to being popped; the pop's p50/p99; and the queue
at the end. `--bounds off` runs the same with the per-account bounds and rate limits turned
off (the fair order stays: it is not a setting), for a before-and-after.
"""

import argparse
import http.client
import json
import os
import random
import sys
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.common import (  # noqa: E402
    HTTPConnection,
    bench_env,
    free_port,
    percentile,
    reset_tables,
    serving,
    setup_django,
)

DB_NAME = "hordeops_bench_flood"
MODEL = "flood-model"
ANONYMOUS_API_KEY = "0000000000"


def _env(bounds: bool) -> dict[str, str]:
    env = bench_env(DB_NAME, 9, TRUSTED_PROXIES="127.0.0.1")
    if not bounds:
        env.update(
            ACCOUNT_MAX_WAITING_REQUESTS="1000000",
            ANONYMOUS_MAX_WAITING_REQUESTS="1000000",
            KEY_RATE_PER_SECOND="0",
            ADDRESS_RATE_PER_SECOND="0",
        )
    return env


class Client:
    def __init__(self, port: int, api_key: str) -> None:
        self.port, self.api_key = port, api_key
        self.http = HTTPConnection("127.0.0.1", port, timeout=30)

    def call(self, method: str, path: str, body: dict | None = None, address: str | None = None):
        headers = {"apikey": self.api_key, "Content-Type": "application/json"}
        if address:
            headers["X-Forwarded-For"] = address
        for attempt in range(2):
            try:
                self.http.request(method, path, json.dumps(body) if body is not None else None, headers)
                answer = self.http.getresponse()
                return answer.status, json.loads(answer.read() or b"{}")
            except (OSError, http.client.HTTPException):
                self.http.close()  # a refused body closes the connection: open another
                self.http = HTTPConnection("127.0.0.1", self.port, timeout=30)
                if attempt:
                    raise
        raise AssertionError("unreachable")


def _flooder(port: int, api_key: str, stop: threading.Event, tally: Counter, many_addresses: bool) -> None:
    client = Client(port, api_key)
    body = {"prompt": "flood", "models": [MODEL], "params": {"max_length": 16}}
    while not stop.is_set():
        address = f"10.{random.randrange(256)}.{random.randrange(256)}.{random.randrange(1, 255)}"
        status, answer = client.call(
            "POST", "/api/v2/generate/text/async", body, address if many_addresses else None
        )
        tally[f"{status} {answer.get('rc', '')}".strip()] += 1


def _light(port: int, api_key: str, stop: threading.Event, ids: list[str], tally: Counter) -> None:
    client = Client(port, api_key)
    body = {"prompt": "light", "models": [MODEL], "params": {"max_length": 16}}
    while not stop.is_set():
        status, answer = client.call("POST", "/api/v2/generate/text/async", body, "192.0.2.10")
        tally[f"{status} {answer.get('rc', '')}".strip()] += 1
        if status == 202:
            ids.append(answer["id"])
        stop.wait(1.0)


def _worker(port: int, api_key: str, name: str, stop: threading.Event, pops: list[float]) -> None:
    client = Client(port, api_key)
    pop = {"name": name, "models": [MODEL], "max_length": 512, "max_context_length": 4096}
    while not stop.is_set():
        started = time.perf_counter()
        status, job = client.call("POST", "/api/v2/generate/text/pop", pop)
        pops.append((time.perf_counter() - started) * 1000)
        if status == 200 and job.get("id"):
            client.call("POST", "/api/v2/generate/text/submit", {"id": job["id"], "generation": "ok"})
        else:
            stop.wait(0.05)


def _reset() -> dict[str, str]:
    from workers.services import create_account

    reset_tables()
    return {name: create_account(name=f"flood-{name}")[1] for name in ("heavy", "light", "owner")}


def _light_waits(ids: list[str]) -> dict:
    from django.db.models import Min

    from jobs.models import TextRequest

    rows = TextRequest.objects.filter(pk__in=ids).annotate(popped=Min("generations__popped_at"))
    waits = [(r.popped - r.created_at).total_seconds() * 1000 for r in rows if r.popped]
    never = sum(1 for r in rows if not r.popped)
    if not waits:
        return {"requests": len(ids), "never_popped": never}
    return {
        "requests": len(ids),
        "never_popped": never,
        "queued_to_popped_ms": {
            "p50": round(percentile(waits, 0.5), 1),
            "p99": round(percentile(waits, 0.99), 1),
            "max": round(max(waits), 1),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--bounds", choices=("on", "off"), default="on")
    args = parser.parse_args()
    env = _env(args.bounds == "on")
    setup_django(DB_NAME, env)
    keys = _reset()
    from django.db import connection

    connection.close()
    port = free_port()
    with serving(port, 2, env):
        stop = threading.Event()
        heavy, anonymous, light, pops, light_ids = Counter(), Counter(), Counter(), [], []
        owner = Client(port, keys["owner"])
        owner.call("POST", "/api/v2/generate/text/pop", {"name": "flood-w0", "models": [MODEL]})
        threads = [
            *(
                threading.Thread(target=_flooder, args=(port, keys["heavy"], stop, heavy, True))
                for _ in range(8)
            ),
            *(
                threading.Thread(target=_flooder, args=(port, ANONYMOUS_API_KEY, stop, anonymous, True))
                for _ in range(4)
            ),
            threading.Thread(target=_light, args=(port, keys["light"], stop, light_ids, light)),
            *(
                threading.Thread(target=_worker, args=(port, keys["owner"], f"flood-w{i}", stop, pops))
                for i in range(4)
            ),
        ]
        for thread in threads:
            thread.start()
        time.sleep(args.seconds)
        stop.set()
        for thread in threads:
            thread.join(60)
        from jobs.models import TextRequest

        queued = Counter(
            TextRequest.objects.filter(state=TextRequest.State.ACTIVE).values_list("account__name", flat=True)
        )
        figures = {
            "bench": "flood",
            "bounds": args.bounds,
            "seconds": args.seconds,
            "machine": {"cores": os.cpu_count(), "load_average_1m": round(os.getloadavg()[0], 2)},
            "heavy_key": dict(heavy),
            "anonymous_many_addresses": dict(anonymous),
            "light_account": {"answers": dict(light), **_light_waits(light_ids)},
            "pop_ms": {
                "calls": len(pops),
                "p50": round(percentile(pops, 0.5), 1),
                "p99": round(percentile(pops, 0.99), 1),
            },
            "waiting_at_end": dict(queued),
        }
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
