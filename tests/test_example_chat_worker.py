"""The example worker, examples/chat_worker.py (the worker bridge with a canned reply for its
backend), serves chat jobs against a live server: the bridge's own horde side (progress posts,
lease answers, deadlines, resends), fast and without a model server.

It runs as a subprocess (as its users run it) or in-process with a transport that loses
answers, against pytest-django's live server: a WSGI server, which serves the worker routes
as the ASGI app does. No requester follows these requests, so nothing commits a stream; the
relay stream in Redis shows what a requester would have been sent.
"""

import asyncio
import importlib.util
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import httpx
import pytest
from django_redis import get_redis_connection

from hordeops_bridge.config import load
from hordeops_bridge.horde import Horde
from hordeops_bridge.worker import Bridge
from jobs import services
from jobs.leases import relay_key
from jobs.models import Generation, TextRequest
from workers.services import create_account

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "chat_worker.py"
PYTHON = ROOT / ".venv" / "bin" / "python"
MODEL = "example-echo"
WORKER = "example-worker"
PROMPT_MARKER = "prompt-marker-that-no-log-may-carry"
RUN_TIMEOUT_SECONDS = 60


@pytest.fixture(scope="module")
def chat_worker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("chat_worker", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _worker_args(url: str, api_key: str, *extra: str) -> list[str]:
    # `--api_key=KEY`: a key may start with "-" (older keys could), which argparse would take
    # for an option if it came as a separate argument.
    return [
        "--horde_url",
        url,
        f"--api_key={api_key}",
        "--worker_name",
        WORKER,
        "--model",
        MODEL,
        "--once",
        *extra,
    ]


def _queue_chat(url: str, worker_key: str) -> TextRequest:
    # A model is known once a worker declares it: this pop checks the worker in, finds nothing.
    first = httpx.post(
        f"{url}/api/v2/generate/text/pop",
        headers={"apikey": worker_key},
        json={
            "name": WORKER,
            "models": [MODEL],
            "chat": True,
            "max_length": 1024,
            "max_context_length": 4096,
        },
    )
    assert first.status_code == 200 and first.json()["id"] is None
    requester, _ = create_account(name="example-requester")
    return services.create_reply_request(
        account=requester,
        address="",
        model=MODEL,
        messages=[{"role": "user", "content": f"Say hello. {PROMPT_MARKER}"}],
        max_length=100,
        params={"temperature": 0.7},
    )


def _relayed(text_request: TextRequest) -> list[dict[str, str]]:
    entries = get_redis_connection("default").xrange(relay_key(text_request.pk))
    return [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in entries]


@pytest.mark.django_db(transaction=True)
def test_example_worker_streams_a_chat_job_and_submits_it(live_server, chat_worker) -> None:
    _, worker_key = create_account(name="example-owner")
    text_request = _queue_chat(live_server.url, worker_key)

    run = subprocess.run(
        [str(PYTHON), str(EXAMPLE), *_worker_args(live_server.url, worker_key, "--word_delay", "0.01")],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_SECONDS,
    )

    assert run.returncode == 0, run.stderr
    generation = Generation.objects.get(request=text_request)
    assert generation.state == Generation.State.DONE
    assert generation.text == chat_worker.CANNED_REPLY
    # Progress renewed the lease, and the last post's running count is the one recorded.
    assert generation.renewals > 0
    assert generation.tokens == len(chat_worker.CANNED_REPLY.split(" "))
    text_request.refresh_from_db()
    assert text_request.state == TextRequest.State.DONE
    # The progress posts relayed the whole reply, in order, before the submit ended it.
    relayed = _relayed(text_request)
    deltas = [event for event in relayed if event["type"] == "delta"]
    assert [int(event["seq"]) for event in deltas] == list(range(1, len(deltas) + 1))
    assert "".join(event["text"] for event in deltas) == chat_worker.CANNED_REPLY
    assert relayed[-1]["type"] == "done"
    # Its log has ids and counts, never the prompt or the reply.
    log = run.stdout + run.stderr
    assert str(generation.pk) in log
    assert PROMPT_MARKER not in log
    assert "canned words" not in log


@pytest.mark.django_db(transaction=True)
def test_example_worker_stops_when_the_requester_cancels(live_server) -> None:
    _, worker_key = create_account(name="example-owner")
    text_request = _queue_chat(live_server.url, worker_key)

    worker = subprocess.Popen(
        [str(PYTHON), str(EXAMPLE), *_worker_args(live_server.url, worker_key, "--word_delay", "0.2")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_SECONDS
        while not Generation.objects.filter(request=text_request, renewals__gt=0).exists():
            if worker.poll() is not None or time.monotonic() >= deadline:
                worker.kill()
                _, early = worker.communicate()
                pytest.fail(f"the worker never posted progress (exit {worker.returncode}): {early}")
            time.sleep(0.1)
        services.cancel_request(request_id=text_request.pk)
        _, stderr = worker.communicate(timeout=RUN_TIMEOUT_SECONDS)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()

    assert worker.returncode == 1, stderr
    assert "GenerationCancelled" in stderr
    generation = Generation.objects.get(request=text_request)
    assert generation.state == Generation.State.CANCELLED
    assert generation.text is None  # it stopped instead of submitting


@pytest.mark.django_db(transaction=True)
def test_example_worker_stops_at_the_pops_deadline_before_the_horde_refuses_it(live_server) -> None:
    from datetime import timedelta

    from hordeops import clock

    _, worker_key = create_account(name="example-owner")
    text_request = _queue_chat(live_server.url, worker_key)
    # A deadline 4 s out (the bridge starts in about 1.5 s): the canned reply at 0.2 s a word
    # takes about 8 s.
    TextRequest.objects.filter(pk=text_request.pk).update(
        deadline_at=clock.now() + timedelta(milliseconds=4000),
        expires_at=clock.now() + timedelta(milliseconds=4000),
    )
    started = time.monotonic()
    run = subprocess.run(
        [str(PYTHON), str(EXAMPLE), *_worker_args(live_server.url, worker_key, "--word_delay", "0.2")],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_SECONDS,
    )
    seconds = time.monotonic() - started
    assert run.returncode == 1, run.stderr
    assert re.search(r"\): deadline, \d+ tokens .*; deadline \d+ ms", run.stderr), run.stderr
    assert "GenerationCancelled" not in run.stderr  # it stopped first; nothing was refused
    assert seconds < 4 + 2  # the start, the pop, then one word's delay past the deadline at most
    generation = Generation.objects.get(request=text_request)
    assert generation.text is None and generation.state == Generation.State.PROCESSING


class LoseFirstAnswers(httpx.AsyncBaseTransport):
    """Deliver every progress post, but lose the answer to its first attempt."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.seqs: list[int] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if request.url.path.endswith("/progress"):
            seq = json.loads(request.content)["seq"]
            self.seqs.append(seq)
            if self.seqs.count(seq) == 1:
                await response.aread()
                await response.aclose()
                raise httpx.ReadError("the answer was lost", request=request)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


@pytest.mark.django_db(transaction=True)
def test_a_post_whose_answer_is_lost_is_resent_under_its_seq_and_relayed_once(
    live_server, chat_worker
) -> None:
    _, worker_key = create_account(name="example-owner")
    text_request = _queue_chat(live_server.url, worker_key)
    transport = LoseFirstAnswers()
    config = load(_worker_args(live_server.url, worker_key), environ={})
    horde = Horde(
        config.horde_url, config.api_key, agent="test", retry_delays=(0.01,) * 3, transport=transport
    )
    bridge = Bridge(config, horde=horde, backend=chat_worker.CannedBackend(MODEL, word_delay=0))

    async def run() -> int:
        try:
            return await bridge.run()
        finally:
            await bridge.aclose()

    exit_code = asyncio.run(run())

    assert exit_code == 0
    posts = max(transport.seqs)
    assert transport.seqs == [seq for seq in range(1, posts + 1) for _ in range(2)]
    generation = Generation.objects.get(request=text_request)
    assert generation.text == chat_worker.CANNED_REPLY
    # Each seq renewed the lease once; its resend was a retry: no renewal, not relayed.
    assert generation.renewals == posts
    deltas = [event for event in _relayed(text_request) if event["type"] == "delta"]
    assert [int(event["seq"]) for event in deltas] == list(range(1, posts + 1))
    assert "".join(event["text"] for event in deltas) == chat_worker.CANNED_REPLY


def test_the_example_is_the_bridge_with_a_backend_of_its_own() -> None:
    stdlib = set(sys.stdlib_module_names)
    source = EXAMPLE.read_text()
    imported = {
        line.split()[1].split(".")[0]
        for line in source.splitlines()
        if line.startswith(("import ", "from ")) and not line.startswith("from __future__")
    }
    assert imported - stdlib == {"hordeops_bridge"}
    assert len(source.splitlines()) < 80
