"""The multi-machine topology on one machine, hosts in network namespaces, and its faults: what
was lost, what ended with a clear error, and how long each fault took to recover from.

Run (as root: it makes network namespaces):  .venv/bin/python bench/cluster_faults.py

(about five minutes; the JSON goes to stdout, progress notes to stderr.)

The hosts, each a network namespace on one bridge (10.77.0.0/24), with its own address:

    web1, web2   the web app (gunicorn, 2 uvicorn workers each), DATABASE_URL and
                 DATABASE_REPLICA_URL the multi-host URLs of docs/examples/database.env,
                 REDIS_SENTINELS set, TRUSTED_PROXIES the proxy
    pg1..pg3     PostgreSQL under Patroni, each running docs/examples/patroni.yml as shipped
                 (synchronous_mode, ttl 12, loop_wait 2, retry_timeout 5) but for its addresses
    etcd         etcd, Patroni's store (one member: a deployment runs three)
    redis1/2     a Redis primary and its replica
    (the root)   three Redis sentinels, HAProxy running docs/examples/haproxy.cfg in front of
                 web1 and web2, a Celery worker and beat, and the load

The load, for the whole run: requester threads queueing horde text requests and streaming
chat requests read to their last event; worker threads popping, posting progress on chat jobs
and submitting, all through HAProxy (the workers start first, and serve what the requesters
left queued once they stop). Leases are short (as in bench/fleet.py) so that jobs held by a
lost host are restarted within the run. The faults, in this order, each given time to recover
before the next:

    1. web1 cut off from Redis for 5 s (blackhole routes to both Redis hosts in its namespace)
    2. the Redis primary killed (SIGKILL): the sentinels promote the replica
    3. the PostgreSQL synchronous standby killed (Patroni and PostgreSQL, SIGKILL): Patroni makes
       the other replica synchronous; started again after --settle, it rejoins as a replica
    4. the PostgreSQL primary killed (likewise): Patroni promotes the synchronous standby once
       the leader lock expires; started again after --settle, the old primary is rewound and
       rejoins as a replica
    5. the PostgreSQL primary cut off from etcd and the other nodes for --partition seconds
       (blackhole routes in its namespace; the web hosts still reach it): it cannot renew the
       leader lock and demotes itself, its last commits unacknowledged (its standby is cut off),
       and the others promote one; the partition healed, it rejoins as a replica. A client
       writing to it straight through the partition must see no commit acknowledged
    6. web1 killed (its gunicorn, SIGKILL): HAProxy's health check takes it out

Reported: requests sent, by final state; `lost` (never reached a final state) and
`double_accept` (a generation accepted twice, or a request with more accepted generations than
it asked for), both must be 0; `acknowledged_missing`: requests answered 202 (or a stream's
first event) and submits answered 200 that the database no longer has, after every failover,
0; `check_kudos`: the ledger's check after the run, clean; for each PostgreSQL fault, the
seconds to a new primary (or to a new synchronous standby) and for the node to rejoin, and for
the partition when the old primary demoted itself and what a client writing to it saw; for
each fault, the answers that were errors (by status, or the client's exception, which must not
happen: HAProxy answers a call a dying host held), the streams
that ended with an error event and the ones cut (a host dying mid-reply: nothing is left to send
its error event), and for how long after the fault calls were refused outright (503); whether
the cut streams' requests were cancelled uncharged; HAProxy's termination states.
"""

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.common import VENV, celery_commands, web_command  # noqa: E402
from bench.fleet import SETTINGS as FLEET_SETTINGS  # noqa: E402
from tests.live import (  # noqa: E402
    ETCD,
    SENTINEL_SERVICE,
    HAProxy,
    PatroniCluster,
    answers_heartbeat,
    sentinel_conf,
    sentinel_knows_replica,
    sentinel_primary,
)

BRIDGE, PREFIX, NET = "hzbr0", "hz-", "10.77.0"
HOSTS = {"web1": 11, "web2": 12, "redis1": 21, "redis2": 22, "pg1": 31, "pg2": 32, "pg3": 33, "etcd": 41}
PG_HOSTS = ("pg1", "pg2", "pg3")
ROOT_IP = f"{NET}.1"
SENTINEL_PORTS = (26371, 26372, 26373)
MODEL = "cluster-model"
# The fleet's (short leases, no bounds), with requests that live 90 s: the run is shorter.
SETTINGS = {
    **FLEET_SETTINGS,
    "TEXT_REQUEST_LIFETIME_SECONDS": "90",
    "WORKER_LIMIT_UNTRUSTED": "100000",
    "WORKER_LIMIT_TRUSTED": "100000",
    "LOG_LEVEL": "WARNING",
    # The kudos pass (uptime, settlements) runs within the run, so that its return is seen.
    "KUDOS_PASS_SECONDS": "5",
}


def note(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def sh(*command: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(command, check=check, capture_output=True, text=True)


def ip(host: str) -> str:
    return f"{NET}.{HOSTS[host]}"


def in_ns(host: str, *command: str) -> list[str]:
    return ["ip", "netns", "exec", PREFIX + host, *command]


def make_network() -> None:
    tear_down_network()
    sh("ip", "link", "add", BRIDGE, "type", "bridge")
    sh("ip", "addr", "add", f"{ROOT_IP}/24", "dev", BRIDGE)
    sh("ip", "link", "set", BRIDGE, "up")
    for host in HOSTS:
        ns, veth = PREFIX + host, f"hzv-{host}"
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        sh("ip", "link", "set", veth, "master", BRIDGE, "up")
        sh(*in_ns(host, "ip", "addr", "add", f"{ip(host)}/24", "dev", "eth0"))
        sh(*in_ns(host, "ip", "link", "set", "eth0", "up"))
        sh(*in_ns(host, "ip", "link", "set", "lo", "up"))


def tear_down_network() -> None:
    for host in HOSTS:
        sh("ip", "link", "del", f"hzv-{host}", check=False)  # its peer goes with it
        sh("ip", "netns", "del", PREFIX + host, check=False)
    sh("ip", "link", "del", BRIDGE, check=False)


class Cluster:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.processes: dict[str, subprocess.Popen] = {}
        self.patroni = PatroniCluster(
            timings={},  # the example's own
            hosts={host: ip(host) for host in PG_HOSTS},
            wrap=lambda host: in_ns(host),
            etcd=f"{ip('etcd')}:2379",
            network=f"{NET}.0/24",
            fast=False,
        )
        self.env = {
            **os.environ,
            **SETTINGS,
            "DATABASE_URL": self.patroni.url,
            "DATABASE_REPLICA_URL": self.patroni.replica_url,
            "REDIS_URL": f"redis://{ip('redis1')}:6379/0",
            "REDIS_SENTINELS": ",".join(f"{ROOT_IP}:{port}" for port in SENTINEL_PORTS),
            "REDIS_SENTINEL_SERVICE": SENTINEL_SERVICE,
            "TRUSTED_PROXIES": ROOT_IP,
            "ALLOWED_HOSTS": ",".join(
                ["127.0.0.1", "localhost", ROOT_IP, *(ip(h) for h in ("web1", "web2"))]
            ),
            "DJANGO_SETTINGS_MODULE": "hordeops.settings",
        }

    def log(self, name: str):
        return open(self.workdir / f"{name}.log", "w")  # noqa: SIM115

    def start(self, name: str, command: list[str], **kwargs) -> subprocess.Popen:
        # A session of its own: killing it kills its children too (gunicorn's workers).
        self.processes[name] = subprocess.Popen(
            command,
            cwd=ROOT,
            stdout=self.log(name),
            stderr=subprocess.STDOUT,
            start_new_session=True,
            **kwargs,
        )
        return self.processes[name]

    def kill(self, name: str) -> None:
        """SIGKILL to the process and everything it started, as a host's power cut."""
        try:
            os.killpg(self.processes[name].pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.processes[name].wait(timeout=10)

    def postgres(self) -> None:
        """etcd, then the three Patroni nodes; the database made and migrated on the leader."""
        etcd = f"http://{ip('etcd')}:2379"
        peer = f"http://{ip('etcd')}:2380"
        self.start("etcd", in_ns("etcd", ETCD, "--name", "etcd1", "--data-dir", str(self.workdir / "etcd"),
                                 "--listen-client-urls", etcd, "--advertise-client-urls", etcd,
                                 "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                                 "--initial-cluster", f"etcd1={peer}"))  # fmt: skip
        self.patroni.start()
        self.patroni.wait(self.patroni.healthy, timeout=120)
        self.patroni.sql(self.patroni.leader(), "CREATE DATABASE hordeops", database="postgres")
        subprocess.run([str(VENV / "python"), "manage.py", "migrate", "--noinput", "-v0"], cwd=ROOT,
                       env=self.env, check=True)  # fmt: skip

    def roles(self) -> dict[str, str]:
        """Each node's role as the nodes that answer see it (leader, sync_standby, replica)."""
        members = self.patroni.members()
        return {name: f"{m.get('role')}/{m.get('state')}" for name, m in members.items()}

    def own_role(self, host: str) -> str | None:
        """What the node's own Patroni says it is (GET /patroni), reachable from here."""
        try:
            answer = httpx.get(f"http://{ip(host)}:8008/patroni", timeout=1).json()
            return answer.get("role")
        except (httpx.HTTPError, ValueError):
            return None

    def redis(self) -> None:
        base = [
            "redis-server",
            "--port",
            "6379",
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "no",
        ]
        for host in ("redis1", "redis2"):
            # A replica's full sync writes an RDB file: into the run's own directory.
            (self.workdir / host).mkdir(exist_ok=True)
            here = [*base, "--dir", str(self.workdir / host), "--bind", ip(host)]
            follow = ["--replicaof", ip("redis1"), "6379"] if host == "redis2" else []
            self.start(host, in_ns(host, *here, *follow))
        time.sleep(0.5)
        for port in SENTINEL_PORTS:
            conf = self.workdir / f"sentinel-{port}.conf"
            conf.write_text(
                sentinel_conf(port, bind=ROOT_IP, workdir=self.workdir, primary=(ip("redis1"), 6379))
            )
            self.start(f"sentinel-{port}", ["redis-server", str(conf), "--sentinel"])
        deadline = time.monotonic() + 30
        while not sentinel_knows_replica(ROOT_IP, SENTINEL_PORTS[0]):
            if time.monotonic() > deadline:
                raise RuntimeError("the sentinels did not find the replica")
            time.sleep(0.2)

    def primary_redis(self) -> str:
        return sentinel_primary(ROOT_IP, SENTINEL_PORTS[0])[0]

    def web(self) -> None:
        for host in ("web1", "web2"):
            self.start(host, in_ns(host, *web_command(f"{ip(host)}:8000", 2)), env=self.env)
        for name, command in celery_commands(self.workdir / "beat-schedule").items():
            # Each task's success logged, to time the passes' return after a failover.
            command = [part.replace("--loglevel=WARNING", "--loglevel=INFO") for part in command]
            self.start(name, command, env=self.env)
        for host in ("web1", "web2"):
            deadline = time.monotonic() + 60
            while not answers_heartbeat(f"http://{ip(host)}:8000"):
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{host} did not come up: {(self.workdir / f'{host}.log').read_text()[-2000:]}"
                    )
                time.sleep(0.3)

    def stop(self) -> None:
        self.patroni.stop()
        for name in self.processes:
            try:
                self.kill(name)
            except subprocess.TimeoutExpired:
                pass


class Timeline:
    """Every call of the load: when, and whether it succeeded; and how each stream ended."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[float, str, bool, str]] = []  # (time, what, ok, detail)
        self.streams: list[tuple[float, str]] = []  # (time, "done" | "error_event" | "cut" | "refused ...")
        # The ids of the requests the horde acknowledged: answered 202, or a stream's first event.
        self.acknowledged: list[str] = []

    def call(self, what: str, ok: bool, detail: str = "", *, started: float | None = None) -> None:
        """A call's outcome, filed at the time it was made (a timeout is the fault of then)."""
        with self.lock:
            self.calls.append((started or time.monotonic(), what, ok, detail))

    def stream(self, outcome: str) -> None:
        with self.lock:
            self.streams.append((time.monotonic(), outcome))


def requester(base: str, key: str, stop: threading.Event, timeline: Timeline, cut: list) -> None:
    # A stream whose job was lost with a host waits for its lease to lapse and the job to be
    # handed out again, at worst until its request expires (TEXT_REQUEST_LIFETIME_SECONDS):
    # the read timeout outlasts that, so that its end (the error event) is seen.
    with httpx.Client(base_url=base, timeout=120, headers={"apikey": key}) as client:
        while not stop.is_set():
            started = time.monotonic()
            try:
                if random.random() < 0.5:
                    body = {"prompt": "Once", "models": [MODEL], "params": {"max_length": 32}}
                    answer = client.post("/api/v2/generate/text/async", json=body)
                    timeline.call("queue", answer.status_code == 202, str(answer.status_code))
                    if answer.status_code == 202:
                        timeline.acknowledged.append(answer.json()["id"])
                else:
                    _stream(client, key, timeline, cut)
            except httpx.HTTPError as failed:
                timeline.call("requester", False, type(failed).__name__, started=started)
                stop.wait(0.2)


def _stream(client: httpx.Client, key: str, timeline: Timeline, cut: list) -> None:
    """One streamed chat request read to its end. One cut short (its host died while it
    streamed) is filed with its request's id, to see how its request ended."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "stream": True, "max_tokens": 32}
    lines: list[str] = []
    with client.stream("POST", "/v1/chat/completions", json=body,
                       headers={"Authorization": f"Bearer {key}"}) as streamed:  # fmt: skip
        if streamed.status_code != 200:
            streamed.read()
            # Filed when answered: a refusal belongs to the fault that was on then.
            timeline.call("stream", False, str(streamed.status_code))
            timeline.stream(f"refused {streamed.status_code}")
            return
        try:
            lines.extend(line for line in streamed.iter_lines() if line.startswith("data: "))
        except httpx.TransportError:
            pass  # cut: told below
    if lines and lines[0].startswith("data: {"):
        timeline.acknowledged.append(json.loads(lines[0][6:])["id"].removeprefix("chatcmpl-"))
    errors = any('"error"' in line for line in lines)
    if lines and (lines[-1] == "data: [DONE]" or errors):
        timeline.stream("error_event" if errors else "done")
        timeline.call("stream", not errors, "error event" if errors else "")
        return
    timeline.stream("cut")
    timeline.call("stream", False, "cut")
    if lines:
        cut.append(json.loads(lines[0][6:])["id"].removeprefix("chatcmpl-"))


def worker(
    base: str, key: str, name: str, stop: threading.Event, timeline: Timeline, accepted: Counter
) -> None:
    pop = {"name": name, "models": [MODEL], "chat": True, "max_length": 512, "max_context_length": 4096}
    with httpx.Client(base_url=base, timeout=30, headers={"apikey": key}) as client:
        while not stop.is_set():
            try:
                answer = client.post("/api/v2/generate/text/pop", json=pop)
                timeline.call("pop", answer.status_code == 200, str(answer.status_code))
                job = answer.json() if answer.status_code == 200 else {}
                if not job.get("id"):
                    stop.wait(0.1 if answer.status_code == 200 else 0.5)
                    continue
                for seq, delta in enumerate(["Hello", " there."], start=1):
                    client.post(
                        "/api/v2/generate/text/progress", json={"id": job["id"], "seq": seq, "delta": delta}
                    )
                    time.sleep(0.05)
                done = client.post(
                    "/api/v2/generate/text/submit", json={"id": job["id"], "generation": "Hello there."}
                )
                timeline.call("submit", done.status_code in (200, 400, 409), str(done.status_code))
                if done.status_code == 200:
                    accepted[job["id"]] += 1
            except httpx.HTTPError as failed:
                timeline.call("worker", False, f"{type(failed).__name__} {_called(failed)}".strip())
                stop.wait(0.2)


def _within(check, seconds: float) -> float | None:
    """Poll `check` until true: the seconds it took, or None if it never was within `seconds`."""
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        try:
            if check():
                return round(time.monotonic() - started, 2)
        except Exception:  # noqa: BLE001 - a node busy electing, restarting
            pass
        time.sleep(0.1)
    return None


def _kill_and_rejoin(cluster: Cluster, node: str, settle: float, *, wall: float) -> dict:
    """Kill `node` (Patroni and PostgreSQL, SIGKILL); time the cluster's answer (a new leader,
    or a new synchronous standby), then start it again and time its return as a replica."""
    patroni = cluster.patroni
    was = patroni.members()[node]["role"]
    others = [name for name in PG_HOSTS if name != node]
    patroni.kill(node)
    killed = time.monotonic()
    report: dict = {"node": node, "was": was, "at": wall}
    if was == "leader":
        report["new_primary_after_seconds"] = _within(lambda: patroni.leader(others) in others, 60)
    else:
        report["new_sync_standby_after_seconds"] = _within(lambda: patroni.healthy(others), 60)
    report["promoted_at"] = wall + (time.monotonic() - killed)
    report["roles_after"] = cluster.roles()
    time.sleep(max(0.0, settle - (time.monotonic() - killed)))
    patroni.start_node(node)
    restarted = time.monotonic()
    report["rejoined_after_seconds"] = _within(
        lambda: patroni.members()[node].get("role") in ("replica", "sync_standby")
        and patroni.members()[node].get("state") == "running",
        90,
    )
    report["roles_rejoined"] = cluster.roles()
    time.sleep(max(0.0, settle - (time.monotonic() - restarted)))
    return report


def _partition_and_rejoin(cluster: Cluster, node: str, seconds: float, settle: float) -> dict:
    """Cut the primary `node` off from etcd and the other nodes (blackhole routes in its
    namespace: the web hosts still reach it), and write to it straight meanwhile, one commit at
    a time: none may be acknowledged once its standby is cut off. Then heal, and time its
    return as a replica."""
    import psycopg

    patroni = cluster.patroni
    others = [name for name in PG_HOSTS if name != node]
    patroni.sql(node, "CREATE TABLE IF NOT EXISTS fence_probe (n int PRIMARY KEY, at timestamptz)")
    written: list[tuple[int, float, str]] = []  # (n, seconds after the cut, outcome)
    stop = threading.Event()
    straight = {"host": ip(node), "user": "postgres", "password": patroni.password, "dbname": "hordeops"}

    def write() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            started = time.monotonic()
            try:
                with psycopg.connect(**straight, connect_timeout=2, autocommit=True) as conn:
                    conn.execute("INSERT INTO fence_probe VALUES (%s, now())", (n,))
                written.append((n, round(started - cut, 2), "acknowledged"))
                continue
            except psycopg.Error as failed:
                first_line = str(failed).strip().splitlines()[-1][:120] if str(failed).strip() else ""
                written.append((n, round(started - cut, 2), f"{type(failed).__name__}: {first_line}"))
                if n == 1:  # the commit under way at the cut: how long it waited, unacknowledged
                    report["first_write_refused_after_seconds"] = round(time.monotonic() - cut, 2)
                stop.wait(0.5)

    report: dict = {"node": node, "seconds": seconds}
    wall = time.time()
    for target in (*others, "etcd"):
        sh(*in_ns(node, "ip", "route", "add", "blackhole", f"{ip(target)}/32"))
    cut = time.monotonic()
    writer = threading.Thread(target=write)
    writer.start()
    report["at"] = wall
    report["new_primary_after_seconds"] = _within(lambda: patroni.leader(others) in others, seconds)
    report["promoted_at"] = wall + (time.monotonic() - cut)
    # What the old primary's own Patroni says it is, each change (its REST API is reachable).
    seen: list[tuple[float, str | None]] = []
    while time.monotonic() - cut < seconds:
        role = cluster.own_role(node)
        if not seen or seen[-1][1] != role:
            seen.append((round(time.monotonic() - cut, 2), role))
        time.sleep(0.2)
    # Patroni answers "master" while the demoting shutdown waits for its WAL senders: the
    # demotion is when the commit under way at the cut was refused (first_write_refused_after).
    report["old_primary_roles"] = seen
    stop.set()
    writer.join(30)
    for target in (*others, "etcd"):
        sh(*in_ns(node, "ip", "route", "del", "blackhole", f"{ip(target)}/32"))
    healed = time.monotonic()
    report["rejoined_after_heal_seconds"] = _within(
        lambda: patroni.members(others)[node].get("role") in ("replica", "sync_standby")
        and patroni.members(others)[node].get("state") == "running",
        90,
    )
    report["roles_rejoined"] = cluster.roles()
    # What a client writing straight to the old primary saw once it was cut off: a commit
    # acknowledged after the cut must be on the new primary (synchronous), else it was a lie.
    acknowledged_after = [n for n, at, outcome in written if outcome == "acknowledged" and at > 0]
    leader = patroni.leader()
    kept = {row[0] for row in patroni.sql(leader, "SELECT n FROM fence_probe")}
    report["writes_to_old_primary"] = dict(Counter(outcome for _, _, outcome in written))
    report["acknowledged_after_cut_and_lost"] = len([n for n in acknowledged_after if n not in kept])
    report["acknowledged_after_cut"] = len(acknowledged_after)
    time.sleep(max(0.0, settle - (time.monotonic() - healed)))
    return report


def _passes_after(log: Path, postgres: dict) -> dict:
    """For each PostgreSQL fault, the seconds from its new primary (or standby) to the first
    stale pass and kudos pass that Celery's worker logged as succeeded after it."""
    import datetime

    done = []
    for line in log.read_text(errors="replace").splitlines():
        if "succeeded in" in line and line.startswith("["):
            stamp = datetime.datetime.strptime(line[1:24], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            done.append(
                (
                    stamp,
                    "stale"
                    if "abort_stale_generations_task" in line
                    else "kudos"
                    if "kudos_pass_task" in line
                    else "",
                )
            )
    report = {}
    for name, fault in postgres.items():
        after = fault["promoted_at"]
        report[name] = {
            kind: next((round(stamp - after, 1) for stamp, k in done if k == kind and stamp > after), None)
            for kind in ("stale", "kudos")
        }
    return report


def _check_kudos(env: dict[str, str]) -> str:
    """`manage.py check_kudos` on the cluster after the run: its last line."""
    done = subprocess.run([str(VENV / "python"), "manage.py", "check_kudos"], cwd=ROOT, env=env,
                          capture_output=True, text=True)  # fmt: skip
    return (
        (done.stdout.strip() or done.stderr.strip()).splitlines()[-1] if (done.stdout or done.stderr) else ""
    )


def _called(failed: httpx.HTTPError) -> str:
    """The route a failed call was sent to (pop, progress, submit)."""
    try:
        return failed.request.url.path.rsplit("/", 1)[-1]
    except RuntimeError:  # no request attached
        return ""


def _wait_for_model(base: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        models = httpx.get(f"{base}/api/v2/status/models", params={"type": "text"}, timeout=5)
        if any(model["name"] == MODEL for model in models.json()):
            return
        time.sleep(0.2)
    raise RuntimeError(f"no worker served {MODEL}")


def recovery(timeline: Timeline, faults: list[tuple[str, float, float]]) -> dict:
    """For each fault: the errors in its window (calls made then; streams by when they ended),
    and for how long after it calls were refused outright (503: no host could take them): the
    time the horde took to serve again. A call a dying host held (502), a stream that ended with
    its error event or was cut by its host's death are counted, not timed."""
    report = {}
    for name, started, until in faults:
        window = [c for c in timeline.calls if started <= c[0] < until]
        failures = [c for c in window if not c[2]]
        refusals = [c[0] for c in failures if c[3] == "503"]
        streams = Counter(outcome for when, outcome in timeline.streams if started <= when < until)
        report[name] = {
            "errors": dict(Counter(f"{c[1]} {c[3]}".strip() for c in failures)),
            "streams": dict(streams),
            "refused_for_seconds": round(max(refusals, default=started) - started, 2),
        }
    return report


def _cut_requests(cut: list[str]) -> dict[str, int]:
    """A stream cut by its host's death has lost its follower: its request is cancelled at its
    worker's next post through the other host (or by the stale pass), and its requester pays
    nothing. How many of the cut ones ended so."""
    from jobs.models import Ending, TextRequest

    ended = TextRequest.objects.filter(
        pk__in=cut, state=TextRequest.State.CANCELLED, ending=Ending.UNAVAILABLE, kudos_spent=0
    )
    return {"count": len(cut), "cancelled_uncharged": ended.count()}


def _terminations(log: str) -> dict[str, int]:
    """HAProxy's termination states of the calls that did not end normally ("----"), by state
    and backend/server: who closed, and when (HAProxy's manual: "Session state at disconnection")."""
    found = Counter()
    for line in log.splitlines():
        parts = line.split()
        if len(parts) > 11 and parts[2] == "horde" and not parts[9].startswith("--"):
            found[f"{parts[9]} {parts[3]} {parts[5]}"] += 1
    return dict(found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settle", type=float, default=15, help="seconds between faults")
    parser.add_argument("--partition", type=float, default=30, help="seconds the primary is cut off")
    parser.add_argument("--logs", type=Path, help="a directory to keep every host's log in")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the hosts are network namespaces")
    # Stopped (SIGTERM, or SIGINT in the background, where it is ignored): clean up all the same.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped"))
    workdir = Path(tempfile.mkdtemp(prefix="hordeops-cluster-"))
    cluster = Cluster(workdir)
    proxy = None
    try:
        note("network")
        make_network()
        note("etcd and three PostgreSQL nodes under Patroni")
        cluster.postgres()
        note("redis, its replica and three sentinels")
        cluster.redis()
        os.environ.update(cluster.env)
        import django

        django.setup()
        from workers.services import create_account

        _, requester_key = create_account(name="cluster-requester", trusted=True)
        _, owner_key = create_account(name="cluster-owner", trusted=True)
        from django.db import connections

        connections.close_all()
        note("web hosts, celery")
        cluster.web()
        # Each call logged with how it ended (its termination state), to tell what cut a call.
        logged = {
            "global\n": "global\n    log stdout format raw local0\n",
            "defaults\n    mode http\n": "defaults\n    mode http\n    log global\n    option httplog\n",
        }
        proxy = HAProxy([f"http://{ip('web1')}:8000", f"http://{ip('web2')}:8000"], replace=logged)
        base = proxy.url
        note(f"load through {base}")
        # Two stops: the requesters stop first, and the workers serve what they left queued.
        stop_requests, stop_workers = threading.Event(), threading.Event()
        timeline, cut, accepted = Timeline(), [], Counter()
        workers = [
            threading.Thread(
                target=worker, args=(base, owner_key, f"cw-{n}", stop_workers, timeline, accepted)
            )
            for n in range(6)
        ]
        requesters = [
            threading.Thread(target=requester, args=(base, requester_key, stop_requests, timeline, cut))
            for _ in range(6)
        ]
        for thread in workers:
            thread.start()
        _wait_for_model(base)  # checked in by the workers' first pops: no request is refused 404
        for thread in requesters:
            thread.start()
        time.sleep(args.settle)
        faults: list[tuple[str, float]] = []

        note("1. web1 cut off from Redis for 5 s")
        faults.append(("web1_cut_from_redis_5s", time.monotonic()))
        for host in ("redis1", "redis2"):
            sh(*in_ns("web1", "ip", "route", "add", "blackhole", f"{ip(host)}/32"))
        time.sleep(5)
        for host in ("redis1", "redis2"):
            sh(*in_ns("web1", "ip", "route", "del", "blackhole", f"{ip(host)}/32"))
        time.sleep(args.settle)

        note("2. the Redis primary killed")
        named_before = cluster.primary_redis()
        faults.append(("redis_primary_killed", time.monotonic()))
        cluster.kill("redis1")
        promoted_at = None
        while promoted_at is None and time.monotonic() - faults[-1][1] < 30:
            try:
                if cluster.primary_redis() != named_before:
                    promoted_at = time.monotonic()
            except Exception:  # noqa: BLE001 - a sentinel busy electing
                pass
            time.sleep(0.1)
        time.sleep(args.settle)

        postgres = {}
        patroni = cluster.patroni

        note("3. the PostgreSQL synchronous standby killed")
        roles = patroni.members()
        standby = next(name for name, m in roles.items() if m.get("role") == "sync_standby")
        faults.append(("postgres_sync_standby_killed", time.monotonic()))
        postgres["sync_standby_killed"] = _kill_and_rejoin(cluster, standby, args.settle, wall=time.time())

        note("4. the PostgreSQL primary killed")
        old = patroni.leader()
        faults.append(("postgres_primary_killed", time.monotonic()))
        postgres["primary_killed"] = _kill_and_rejoin(cluster, old, args.settle, wall=time.time())

        note(f"5. the PostgreSQL primary cut off from etcd and the other nodes for {args.partition:.0f} s")
        old = patroni.leader()
        faults.append(("postgres_primary_partitioned", time.monotonic()))
        postgres["primary_partitioned"] = _partition_and_rejoin(cluster, old, args.partition, args.settle)

        note("6. web1 killed")
        faults.append(("web1_killed", time.monotonic()))
        cluster.kill("web1")
        time.sleep(args.settle)

        note("requesters stopped; the workers serve what is left")
        stop_requests.set()
        for thread in requesters:
            thread.join(120)
        from django.db.models import Count, Q

        from jobs.models import Generation, TextRequest

        deadline = time.monotonic() + 120
        while (
            TextRequest.objects.filter(state=TextRequest.State.ACTIVE).exists()
            and time.monotonic() < deadline
        ):
            time.sleep(1)
        stop_workers.set()
        for thread in workers:
            thread.join(60)
        windows = [(name, start, faults[i + 1][1] if i + 1 < len(faults) else time.monotonic())
                   for i, (name, start) in enumerate(faults)]  # fmt: skip
        states = Counter(TextRequest.objects.values_list("state", flat=True))
        over_n = TextRequest.objects.annotate(
            accepted=Count("generations", filter=Q(generations__state=Generation.State.DONE))
        )
        accepted_twice = [g for g, n in accepted.items() if n > 1]
        acknowledged = set(timeline.acknowledged)
        kept = set(map(str, TextRequest.objects.filter(pk__in=acknowledged).values_list("pk", flat=True)))
        done = set(
            map(
                str,
                Generation.objects.filter(pk__in=list(accepted), state=Generation.State.DONE).values_list(
                    "pk", flat=True
                ),
            )
        )
        report = {
            "bench": "cluster_faults",
            "requests": dict(states),
            "lost": states.get(TextRequest.State.ACTIVE, 0),
            "double_accept": len(accepted_twice) + sum(1 for r in over_n if r.accepted > r.n),
            "streams": dict(Counter(outcome for _, outcome in timeline.streams)),
            "calls": len(timeline.calls),
            "faults": recovery(timeline, windows),
            "redis_primary": {"before": named_before, "after": cluster.primary_redis()},
            "redis_promoted_after_seconds": round(promoted_at - faults[1][1], 2) if promoted_at else None,
            "acknowledged": {"requests": len(acknowledged), "submits": len(accepted)},
            "acknowledged_missing": {
                "requests": len(acknowledged - kept),
                "submits": len({str(g) for g in accepted} - done),
            },
            "postgres": postgres,
            "celery_passes_after_each_promotion": _passes_after(workdir / "celery.log", postgres),
            "check_kudos": _check_kudos(cluster.env),
        }
        report["streams_cut_with_their_host"] = _cut_requests(cut)
        report["proxy_terminations"] = _terminations(proxy.log_path.read_text())
        print(json.dumps(report, indent=2))
    finally:
        if args.logs:
            args.logs.mkdir(parents=True, exist_ok=True)
            for log in [*workdir.glob("*.log"), *cluster.patroni.workdir.glob("*.log")]:
                shutil.copy(log, args.logs / log.name)
            if proxy is not None:
                shutil.copy(proxy.log_path, args.logs / "haproxy.log")
        if proxy is not None:
            proxy.stop()
        cluster.stop()
        tear_down_network()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
