"""What synchronous replication costs the hot routes: bench/http_routes.py against the primary of
a three-node Patroni cluster (docs/examples/patroni.yml, as shipped but for its addresses: fsync
on) with `synchronous_mode` off, where a commit waits for the primary alone (one node), and on,
where it waits for a synchronous standby's flush too (the pair), round after round, side by side.

Run (as root where PostgreSQL must run as its own user):
    .venv/bin/python bench/sync_replication.py [--rounds 2] [--seconds 8] [--threads 4]

(about a minute and a half a round and mode; JSON on stdout, progress on stderr.) The mode is
switched through Patroni's REST API (PATCH /config), as `patronictl edit-config` does, and each
measurement waits until the primary's `synchronous_standby_names` says it took effect. The
cluster's nodes, the web processes and the load share the machine's cores (2 here): the figures
compare the modes, they are not a deployment's. The PostgreSQL CPU figure counts every process
named postgres on the machine (the standbys' included).
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.live import PatroniCluster, PrivateRedis  # noqa: E402

MODES = {"one_node": False, "synchronous_pair": True}
FIGURES = ("requests_per_second", "p50_ms", "p99_ms", "web_cpu_ms_per_request", "postgres_cpu_ms_per_request")


def note(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def set_mode(cluster: PatroniCluster, synchronous: bool) -> None:
    leader = cluster.leader()
    httpx.patch(
        f"http://127.0.0.1:{cluster.rest_ports[leader]}/config",
        json={"synchronous_mode": synchronous},
        timeout=5,
    ).raise_for_status()
    deadline = time.monotonic() + 60
    while True:
        (names,) = cluster.sql(leader, "SHOW synchronous_standby_names", database="postgres")[0]
        if bool(names) == synchronous:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"synchronous_standby_names is {names!r}")
        time.sleep(0.5)


def commit_latency(cluster: PatroniCluster, count: int = 300) -> dict:
    """One-row INSERTs on the leader, each its own transaction, one at a time: what a commit
    costs alone, without the routes' other work (milliseconds)."""
    import psycopg

    leader = cluster.leader()
    params = {"host": "127.0.0.1", "port": cluster.pg_ports[leader], "user": "postgres", "dbname": "postgres"}
    with psycopg.connect(**params, password=cluster.password, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS commit_probe (n serial PRIMARY KEY, at timestamptz)")
        took = []
        for _ in range(count):
            started = time.perf_counter()
            conn.execute("INSERT INTO commit_probe (at) VALUES (now())")
            took.append((time.perf_counter() - started) * 1000)
    took.sort()
    return {"p50_ms": round(took[len(took) // 2], 2), "p99_ms": round(took[int(len(took) * 0.99)], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--threads", type=int, default=4)
    args = parser.parse_args()
    cluster = PatroniCluster(timings={}, fast=False)
    # http_routes empties its Redis database: one of a redis-server of this bench's own.
    redis = PrivateRedis(cluster.workdir)
    try:
        redis.start()
        note("three PostgreSQL nodes under Patroni")
        cluster.start()
        cluster.wait(cluster.healthy, timeout=120)
        leader = cluster.leader()
        # http_routes makes its database on DATABASE_URL's server: the leader's, straight (no
        # failover happens meanwhile).
        url = f"postgres://postgres:{cluster.password}@127.0.0.1:{cluster.pg_ports[leader]}/hordeops"
        env = {**os.environ, "DATABASE_URL": url, "REDIS_URL": redis.url}
        rounds = []
        for number in range(args.rounds):
            measured = {}
            for mode, synchronous in MODES.items():
                set_mode(cluster, synchronous)
                note(f"round {number + 1}: {mode}")
                commit = commit_latency(cluster)
                done = subprocess.run(
                    [sys.executable, str(ROOT / "bench" / "http_routes.py"), "--seconds", str(args.seconds),
                     "--threads", str(args.threads)],
                    env=env, check=True, capture_output=True, text=True,
                )  # fmt: skip
                phases = json.loads(done.stdout)["rounds"][0]
                measured[mode] = {
                    "commit": commit,
                    **{
                        phase: {key: figures.get(key) for key in FIGURES}
                        for phase, figures in phases.items()
                        if isinstance(figures, dict)
                    },
                }
            rounds.append(measured)
        print(
            json.dumps(
                {
                    "bench": "sync_replication",
                    "cluster": "3 Patroni nodes on 127.0.0.1, docs/examples/patroni.yml (fsync on)",
                    "load": f"bench/http_routes.py, {args.threads} connections, {args.seconds} s a phase",
                    "rounds": rounds,
                },
                indent=2,
            )
        )
    finally:
        redis.kill()
        cluster.stop()


if __name__ == "__main__":
    main()
