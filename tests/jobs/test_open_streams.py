"""Open chat requests cost no thread and no database connection while they wait or stream.

A crowd of requesters holds hundreds of `/v1/chat/completions` requests open on one live
uvicorn process, most streamed and some not, from one event loop on a thread of the test.
Meanwhile a worker pops, posts progress and submits on the same process, and the heartbeat
answers, each within a second; the process's threads, PostgreSQL connections and Redis
clients stay a handful. Served requests finish (`[DONE]`, or the JSON reply); the rest are
cancelled when their requesters go away.
"""

import asyncio
import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from django.db import connection
from django_redis import get_redis_connection

from jobs.models import TextRequest
from tests.live import Background, ChatWorker

MODEL = "koboldcpp/crowd-test-8B"
OPEN = 300
# Each account queues a share, so that a bound on one account's waiting requests (the AI
# Horde's 30) never limits the crowd.
ACCOUNTS = 12
SERVED = 5
DELTAS = ["Once ", "upon ", "a time."]
ROUTE_SECONDS = 1.0
WAIT_SECONDS = 30
# What one process may use whatever the crowd's size: sync and async database threads and
# asgiref's one thread, uvicorn's, the psycopg pool's workers and a few of Python's own.
MAX_THREADS = 25
MAX_DATABASE_CONNECTIONS = 8
MAX_REDIS_CLIENTS = 12


@dataclass
class Reply:
    status: int = 0
    body: bytes = b""
    done: bool = False


@dataclass
class Crowd:
    """OPEN chat requests held open from one event loop; `release()` hangs them all up."""

    url: str
    api_keys: list[str]
    replies: list[Reply] = field(default_factory=list)
    sent: threading.Event = field(default_factory=threading.Event)
    _loop: asyncio.AbstractEventLoop | None = None
    _release: asyncio.Event | None = None

    def run(self) -> None:
        asyncio.run(self._main())

    def release(self) -> None:
        assert self._loop is not None and self._release is not None
        self._loop.call_soon_threadsafe(self._release.set)

    def finished(self) -> list[Reply]:
        return [reply for reply in self.replies if reply.done]

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._release = asyncio.Event()
        url = httpx.URL(self.url)
        connections = []
        for index in range(OPEN):
            reader, writer = await asyncio.open_connection(url.host, url.port)
            stream = index % 5 != 0
            body = json.dumps(
                {"model": MODEL, "messages": [{"role": "user", "content": "Hi."}], "stream": stream}
            ).encode()
            writer.write(
                (
                    f"POST /v1/chat/completions HTTP/1.1\r\nHost: {url.host}:{url.port}\r\n"
                    f"Authorization: Bearer {self.api_keys[index % len(self.api_keys)]}\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                ).encode()
                + body
            )
            await writer.drain()
            reply = Reply()
            self.replies.append(reply)
            connections.append((reader, writer, asyncio.create_task(self._read(reader, reply, stream))))
        self.sent.set()
        await self._release.wait()
        for _reader, writer, reading in connections:
            reading.cancel()
            writer.close()
        await asyncio.gather(*(reading for _r, _w, reading in connections), return_exceptions=True)

    async def _read(self, reader: asyncio.StreamReader, reply: Reply, stream: bool) -> None:
        status_line = await reader.readline()
        reply.status = int(status_line.split()[1])
        while True:
            chunk = await reader.read(65536)
            if not chunk:
                return
            reply.body += chunk
            if (stream and b"data: [DONE]" in reply.body) or (
                not stream and b'"chat.completion"' in reply.body
            ):
                reply.done = True


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no thread count")


def _database_connections() -> int:
    """Connections to the test database besides this test's own."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return cursor.fetchone()[0]


def _redis_clients() -> int:
    redis = get_redis_connection("default")
    db = redis.connection_pool.connection_kwargs.get("db", 0)
    return sum(1 for client in redis.client_list() if int(client["db"]) == db)


def _timed(call) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    response = call()
    return response, time.monotonic() - started


def _wait_for(predicate, what: str, timeout: float = WAIT_SECONDS) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


@pytest.mark.parametrize("live_stack", [1], indirect=True)
def test_hundreds_of_open_chat_requests_leave_the_worker_routes_and_heartbeat_answering(
    live_stack, make_caller
):
    [url] = live_stack.urls
    [server] = live_stack.servers
    requesters = [make_caller(f"crowd-{index}") for index in range(ACCOUNTS)]
    owner = make_caller("crowd-owner")
    worker = ChatWorker(url, owner.api_key, name="crowd-worker", model=MODEL)
    assert worker.pop()["id"] is None  # checks the worker in with its model
    redis_before = _redis_clients()
    # This process's own pool may hold connections that earlier tests' threads gave back.
    database_before = _database_connections()

    crowd = Crowd(url, [requester.api_key for requester in requesters])
    holding = Background(crowd.run)
    try:
        assert crowd.sent.wait(WAIT_SECONDS), "the crowd could not connect"
        _wait_for(
            lambda: TextRequest.objects.filter(state=TextRequest.State.ACTIVE).count() == OPEN, "the crowd"
        )
        assert not crowd.finished()

        heartbeat, seconds = _timed(lambda: httpx.get(f"{url}/api/v2/status/heartbeat", timeout=WAIT_SECONDS))
        assert heartbeat.status_code == 200 and seconds < ROUTE_SECONDS, (heartbeat.text, seconds)
        for _ in range(SERVED):
            job, seconds = _timed(worker.pop)
            assert job["id"] is not None and seconds < ROUTE_SECONDS, (job, seconds)
            worker.job, worker.seq = job, 0
            for delta in DELTAS:
                posted, seconds = _timed(lambda delta=delta: worker.progress(delta))
                assert posted.status_code == 200 and seconds < ROUTE_SECONDS, (posted.text, seconds)
            submitted, seconds = _timed(lambda: worker.submit("".join(DELTAS)))
            assert submitted.status_code == 200 and seconds < ROUTE_SECONDS, (submitted.text, seconds)

        _wait_for(lambda: len(crowd.finished()) == SERVED, "the served requests to finish")
        for reply in crowd.finished():
            assert reply.status == 200
            text = reply.body.decode()
            assert all(json.dumps(delta) in text for delta in DELTAS) or "Once upon a time." in text

        threads = _threads(server.process.pid)
        assert threads <= MAX_THREADS, f"{threads} threads for {OPEN} open requests"
        database = _database_connections() - database_before
        assert database <= MAX_DATABASE_CONNECTIONS, f"{database} connections for {OPEN} open requests"
        redis = _redis_clients() - redis_before
        assert redis <= MAX_REDIS_CLIENTS, f"{redis} Redis clients for {OPEN} open requests"
    finally:
        crowd.release()
        holding.result(timeout=WAIT_SECONDS)

    unserved = TextRequest.objects.exclude(state=TextRequest.State.DONE)
    assert unserved.count() == OPEN - SERVED
    _wait_for(
        lambda: not unserved.exclude(state=TextRequest.State.CANCELLED).exists(),
        "the abandoned requests to be cancelled",
    )
    live_stack.assert_alive()
