"""Generation deadlines (docs/reference/generation_deadline.md): `X-MultiLLM-Deadline-Ms` end to end.

Deadlines run on the real monotonic clock, so every test that lets one run out uses a budget of
a few hundred milliseconds to a few seconds and bounded waits; nothing sleeps for a lease.
Header and settings rules go through the Django test client; anything that waits on a worker
goes over real HTTP: `local_server` is uvicorn on a thread of this process (so that the
`settings` fixture and caplog reach it), `live_stack` is separate uvicorn processes.
"""

import contextlib
import gc
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import anthropic
import httpx
import openai
import pytest
import uvicorn
from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, connections
from django.test import Client

from hordeops import asyncdb, clock
from hordeops.env import env_deadline_max_ms, env_route_limits
from jobs import deadlines, services
from jobs.models import Generation, TextRequest
from tests.live import Background, ChatWorker
from workers.models import Account, Worker

MODEL = "koboldcpp/deadline-test-8B"
HEADER = deadlines.HEADER
MAX_MS = 300000
# Distinctive prompt and reply text: none of it may reach a log or a settlement record.
PROMPT = "Describe the lighthouse PROMPT-SENTINEL-4f1c in one line."
MESSAGES = [{"role": "user", "content": PROMPT}]
DELTAS = ["REPLY-SENTINEL-alpha ", "REPLY-SENTINEL-beta ", "REPLY-SENTINEL-gamma"]
WAIT_SECONDS = 20
# The budget of a request that a worker takes, posts to, then stalls on: room for the pop and a
# few posts on a busy machine, and no more, since each such test waits it out.
STALL_BUDGET_MS = 2000
TEXT_ASYNC = "/api/v2/generate/text/async"
CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
MESSAGES_PATH = "/v1/messages"
PREFLIGHT_MAX_TOKENS = 8192
CANCELLED_SETTLEMENT_KEYS = {"usage", "tokens_relayed", "reservation", "reason"}


@pytest.fixture(autouse=True)
def _deadline_defaults(settings):
    """Pin the deadline settings, whatever the environment running the tests says."""
    settings.GENERATION_DEADLINE_MAX_MS = MAX_MS
    settings.GENERATION_DEADLINE_ROUTE_LIMITS_MS = {}
    settings.INTERNAL_HOP_SECRET = ""


@pytest.fixture
def accounts(make_caller):
    return make_caller("deadline-requester"), make_caller("deadline-owner")


@pytest.fixture
def local_server(transactional_db) -> Iterator[str]:
    """uvicorn serving the app on a thread of this process: real HTTP, this process's settings.

    Django runs each ASGI request's sync code on a thread of its own, so the server's database
    connections are closed at the end of each request rather than left to outlive the test.
    """
    from hordeops.asgi import application

    database = connections.settings[DEFAULT_DB_ALIAS]
    max_age = database["CONN_MAX_AGE"]
    database["CONN_MAX_AGE"] = 0
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        application, lifespan="off", log_config=None, loop="asyncio", http="h11", timeout_graceful_shutdown=2
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    started = time.monotonic()
    while not server.started:
        assert thread.is_alive(), "the in-process uvicorn server exited"
        assert time.monotonic() - started < 10, "the in-process uvicorn server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
        database["CONN_MAX_AGE"] = max_age
        gc.collect()  # and the connections of finished threads, if any are left


@pytest.fixture
def worker(local_server, accounts) -> Iterator[ChatWorker]:
    """A chat worker of MODEL on `local_server`, checked in so that the model is known."""
    chat_worker = ChatWorker(local_server, accounts[1].api_key, name="deadline-worker", model=MODEL)
    assert chat_worker.pop()["id"] is None
    yield chat_worker
    chat_worker.close()


# --- Helpers ------------------------------------------------------------------------------------


def _body(path: str, *, stream: bool = True, model: str = MODEL) -> dict[str, Any]:
    if path == TEXT_ASYNC:
        return {"prompt": PROMPT, "models": [model]}
    if path == RESPONSES:
        return {"model": model, "input": PROMPT, "stream": stream}
    if path == MESSAGES_PATH:
        return {"model": model, "max_tokens": 200, "messages": MESSAGES, "stream": stream}
    # Room for the preflight's 64 KiB of white space within the job's output bound.
    return {"model": model, "messages": MESSAGES, "stream": stream, "max_tokens": PREFLIGHT_MAX_TOKENS}


def _ask(
    base_url: str,
    api_key: str,
    deadline: str | int | None = None,
    *,
    path: str = CHAT,
    stream: bool = True,
    headers: list[tuple[str, str]] | None = None,
) -> httpx.Response:
    """One requester call over real HTTP, read to its end."""
    sent = [("Authorization", f"Bearer {api_key}"), *(headers or [])]
    if deadline is not None:
        sent.append((HEADER, str(deadline)))
    with httpx.Client(base_url=base_url, timeout=WAIT_SECONDS) as http:
        response = http.post(path, json=_body(path, stream=stream), headers=sent)
        response.read()
        return response


def _text_request(caller, deadline: str | None = None, **headers: str):
    """`POST /api/v2/generate/text/async` for model m1, with the deadline header if given."""
    if deadline is not None:
        headers["HTTP_X_MULTILLM_DEADLINE_MS"] = deadline
    return caller.post(TEXT_ASYNC, {"prompt": PROMPT, "models": ["m1"]}, **headers)


def _budget_ms(text_request: TextRequest) -> float:
    """The deadline a request was given, in ms after it was created."""
    return (text_request.deadline_at - text_request.created_at).total_seconds() * 1000


def _wait_for(predicate: Callable[[], bool], what: str, timeout: float = WAIT_SECONDS) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _generation_ends(generation_id: str, state: str = Generation.State.CANCELLED) -> Generation:
    def ended() -> bool:
        return Generation.objects.get(pk=generation_id).state == state

    _wait_for(ended, f"generation {generation_id} to be {state}", timeout=10)
    return Generation.objects.get(pk=generation_id)


def _serve_some(chat_worker: ChatWorker, deltas: list[str], tokens: int | None = None) -> str:
    """Pop a job and post `deltas`, then go silent; return the job id."""
    chat_worker.pop_job()
    for delta in deltas:
        response = chat_worker.progress(delta, tokens=tokens)
        assert response.status_code == 200, response.text
    return chat_worker.id


def _sse(text: str) -> list[tuple[str | None, Any]]:
    """(event name, data) for each event of an SSE body; data is parsed unless it is [DONE]."""
    events = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line[len("event: ") :]
            elif line.startswith("data: "):
                data.append(line[len("data: ") :])
        payload = "\n".join(data)
        events.append((name, payload if payload == "[DONE]" else json.loads(payload)))
    return events


def _assert_504(response: httpx.Response, path: str = CHAT) -> None:
    assert response.status_code == 504, response.text
    assert response.headers["x-should-retry"] == "false"
    assert response.headers["content-type"].startswith("application/json")  # not a committed stream
    body = response.json()
    if path == MESSAGES_PATH:
        assert body == {
            "type": "error",
            "error": {"type": "timeout_error", "message": body["error"]["message"]},
        }
    else:
        assert body == {
            "error": {
                "message": body["error"]["message"],
                "type": "timeout_error",
                "param": None,
                "code": "generation_deadline_exceeded",
            }
        }


def _assert_502(response: httpx.Response) -> None:
    assert response.status_code == 502, response.text
    assert response.headers["x-should-retry"] == "false"
    error = response.json()["error"]
    assert error["code"] == "upstream_stream_invalid"
    assert error["type"] == "server_error"


def _assert_cancelled_without_restart(text_request_id, chat_worker: ChatWorker | None = None) -> None:
    text_request = TextRequest.objects.get(pk=text_request_id)
    assert text_request.state == TextRequest.State.CANCELLED
    assert (text_request.queued, text_request.restarts) == (0, 0)
    # Nothing restarts it: not the stale pass, not a worker's pop.
    services.abort_stale_generations(now=clock.now() + timedelta(hours=2))
    text_request.refresh_from_db()
    assert (text_request.state, text_request.queued, text_request.restarts) == ("cancelled", 0, 0)
    if chat_worker is not None:
        assert chat_worker.pop()["id"] is None


def _assert_settlement(generation: Generation, reason: str, tokens_relayed: int | None = None) -> None:
    settlement = generation.settlement_information
    assert set(settlement) == CANCELLED_SETTLEMENT_KEYS, settlement
    assert settlement["usage"] == "unknown"
    assert settlement["reason"] == reason
    assert settlement["tokens_relayed"] > 0
    if tokens_relayed is not None:
        assert settlement["tokens_relayed"] == tokens_relayed
    assert "SENTINEL" not in json.dumps(settlement)  # neither prompt nor reply text


def _assert_refused_as_cancelled(chat_worker: ChatWorker) -> None:
    late = chat_worker.progress("REPLY-SENTINEL-late")
    assert late.status_code == 409 and late.json()["rc"] == "GenerationCancelled", late.text
    late_submit = chat_worker.submit("".join(DELTAS))
    assert late_submit.status_code == 409 and late_submit.json()["rc"] == "GenerationCancelled"
    assert Worker.objects.get(name=chat_worker.name).aborted_jobs == 0


# --- 1. Parsing the header ----------------------------------------------------------------------

BAD_VALUES = [
    "0",
    str(MAX_MS + 1),
    "abc",
    "1.5",
    " 100",
    "100 ",
    "100,200",
    "",
    "-1",
    "+5",
    "1e3",
    "0x10",
    "１２",  # fullwidth digits
    "9" * 5000,  # too long for int(): must be a 400, not a 500
]


def _openai_shape(response) -> str:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == "invalid_request_error"
    return body["error"]["code"]


def _anthropic_shape(response) -> str:
    """Anthropic's shape has no code: the message names the header instead."""
    body = response.json()
    assert body == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": body["error"]["message"]},
    }
    return "invalid_generation_deadline" if HEADER in body["error"]["message"] else body["error"]["message"]


def _horde_shape(response) -> str:
    body = response.json()
    assert set(body) == {"message", "rc"}
    return body["rc"]


@pytest.mark.parametrize("path", [TEXT_ASYNC, CHAT, RESPONSES, MESSAGES_PATH])
def test_a_malformed_or_out_of_range_deadline_header_is_a_400_in_each_routes_shape(path, requester):
    # An unknown model: a route that ignored the header would answer 404 (or UnknownModel),
    # never queue a job and wait.
    client = Client()
    for value in BAD_VALUES:
        if path == TEXT_ASYNC:
            response = requester.post(
                path, {"prompt": PROMPT, "models": ["no/such-model"]}, HTTP_X_MULTILLM_DEADLINE_MS=value
            )
            shape = _horde_shape
        else:
            response = client.post(
                path,
                json.dumps(_body(path, model="no/such-model")),
                content_type="application/json",
                headers={"Authorization": f"Bearer {requester.api_key}", HEADER: value},
            )
            shape = _anthropic_shape if path == MESSAGES_PATH else _openai_shape
        assert response.status_code == 400, (value[:20], response.content[:300])
        assert shape(response) == "invalid_generation_deadline", (value[:20], response.content[:300])
    assert not TextRequest.objects.exists()


def test_valid_deadlines_are_accepted_on_the_horde_route_and_no_header_sets_none(requester, owner):
    owner.pop("w")
    maximum = _text_request(requester, str(MAX_MS))
    assert maximum.status_code == 202, maximum.content
    text_request = TextRequest.objects.get(pk=maximum.json()["id"])
    assert MAX_MS - 5000 < _budget_ms(text_request) <= MAX_MS
    assert text_request.expires_at == text_request.deadline_at

    # 1 ms is valid; it is spent before the request can be queued.
    one = _text_request(requester, "1")
    assert one.status_code in (202, 504), one.content
    if one.status_code == 504:
        assert one.json()["rc"] == "generation_deadline_exceeded"
        assert one.headers["x-should-retry"] == "false"

    plain = requester.request_text(PROMPT, models=["m1"])
    assert plain.status_code == 202
    text_request = TextRequest.objects.get(pk=plain.json()["id"])
    assert text_request.deadline_at is None
    assert text_request.expires_at - text_request.created_at == timedelta(seconds=1200)
    TextRequest.objects.exclude(pk=text_request.pk).update(state=TextRequest.State.CANCELLED, queued=0)
    job = owner.pop("w").json()
    assert job["id"] is not None and "deadline_ms" not in job


def test_valid_deadlines_are_accepted_on_the_chat_route_and_two_headers_are_refused(
    local_server, accounts, worker
):
    requester, _ = accounts
    Account.objects.filter(pk=requester.account.pk).update(deadline_limit_ms=300)
    for value in ("1", "300", str(MAX_MS - 1), str(MAX_MS)):
        started = time.monotonic()
        response = _ask(local_server, requester.api_key, value)
        _assert_504(response)  # accepted, and cut to the account's 300 ms
        assert time.monotonic() - started < 5

    # Two headers reach Django joined with a comma: one value only.
    for path in (CHAT, TEXT_ASYNC):
        twice = [(HEADER, "100"), (HEADER, "200"), ("apikey", requester.api_key)]
        response = _ask(local_server, requester.api_key, path=path, headers=twice)
        assert response.status_code == 400, response.text
        rc = response.json()["rc"] if path == TEXT_ASYNC else response.json()["error"]["code"]
        assert rc == "invalid_generation_deadline"

    # No header: no deadline, and the pop forwards none.
    def serve() -> dict[str, Any]:
        job = worker.pop_job()
        assert worker.submit("Fine.").status_code == 200
        return job

    serving = Background(serve)
    response = _ask(local_server, requester.api_key, stream=False)
    job = serving.result()
    assert response.status_code == 200, response.text
    assert "deadline_ms" not in job
    text_request = Generation.objects.get(pk=job["id"]).request
    assert text_request.deadline_at is None


# --- 2. GENERATION_DEADLINE_MAX_MS --------------------------------------------------------------

NAME = "GENERATION_DEADLINE_MAX_MS"


def test_an_empty_maximum_uses_the_default_and_a_valid_one_is_respected(monkeypatch, caplog):
    caplog.set_level(logging.DEBUG)
    for raw, expected in (("", 300000), ("   ", 300000), ("5000", 5000), ("1", 1), ("600000", 600000)):
        monkeypatch.setenv(NAME, raw)
        assert env_deadline_max_ms(NAME, 300000) == expected, raw
    monkeypatch.delenv(NAME)
    assert env_deadline_max_ms(NAME, 300000) == 300000
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("raw", ["abc", "0", "-98765", "12.5", "30s", "1e5", " 5000", "5,000"])
def test_a_malformed_maximum_disables_deadlines_with_one_warning_that_hides_the_value(
    raw, monkeypatch, caplog
):
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv(NAME, raw)
    assert env_deadline_max_ms(NAME, 300000) is None
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    [warning] = warnings
    assert NAME in warning.getMessage()
    assert raw.strip() not in warning.getMessage() and raw not in repr(warning.args)


@pytest.mark.parametrize("raw", ["²", "١٢", "9" * 16, str(2**31)])
def test_a_maximum_of_non_ascii_digits_or_beyond_the_ceiling_is_malformed_too(monkeypatch, caplog, raw):
    monkeypatch.setenv(NAME, raw)
    assert env_deadline_max_ms(NAME, 300000) is None
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 1


def test_route_limits_take_ascii_milliseconds_only(monkeypatch):
    monkeypatch.setenv("ROUTE_LIMITS", "/v1/messages=30000, /v1/responses/=60000")
    assert env_route_limits("ROUTE_LIMITS") == {"/v1/messages": 30000, "/v1/responses": 60000}
    for bad in ("/v1/messages=١٢", "/v1/messages=0", "/v1/messages"):
        monkeypatch.setenv("ROUTE_LIMITS", bad)
        with pytest.raises(ImproperlyConfigured):
            env_route_limits("ROUTE_LIMITS")


def test_disabled_deadlines_ignore_the_header_and_a_set_maximum_bounds_it(requester, owner, settings):
    owner.pop("w")
    settings.GENERATION_DEADLINE_MAX_MS = None  # what a malformed maximum leaves
    for value in ("abc", "1000", "0", str(MAX_MS + 1)):
        response = _text_request(requester, value)
        assert response.status_code == 202, (value, response.content)
        assert TextRequest.objects.get(pk=response.json()["id"]).deadline_at is None

    settings.GENERATION_DEADLINE_MAX_MS = 5000
    accepted = _text_request(requester, "5000")
    assert accepted.status_code == 202, accepted.content
    assert 0 < _budget_ms(TextRequest.objects.get(pk=accepted.json()["id"])) <= 5000
    refused = _text_request(requester, "5001")
    assert refused.status_code == 400 and refused.json()["rc"] == "invalid_generation_deadline"


# --- 3. Account and route limits ----------------------------------------------------------------


def _set_account_limit(caller, limit_ms: int | None) -> None:
    Account.objects.filter(pk=caller.account.pk).update(deadline_limit_ms=limit_ms)


def test_the_shortest_of_header_account_and_route_limit_wins_and_no_limit_lengthens(
    requester, owner, settings
):
    owner.pop("w", chat=True)

    def budget(header: str = "60000") -> tuple[float, int]:
        response = _text_request(requester, header)
        assert response.status_code == 202, response.content
        text_request = TextRequest.objects.get(pk=response.json()["id"])
        job = owner.pop("w", chat=True).json()
        assert job["id"] is not None and Generation.objects.get(pk=job["id"]).request_id == text_request.pk
        return _budget_ms(text_request), job["deadline_ms"]

    _set_account_limit(requester, 700)
    at, popped = budget()
    assert 0 < at <= 700 and 0 <= popped <= 700

    settings.GENERATION_DEADLINE_ROUTE_LIMITS_MS = {TEXT_ASYNC: 400}
    at, popped = budget()
    assert 0 < at <= 400 and popped <= 400

    settings.GENERATION_DEADLINE_ROUTE_LIMITS_MS = {TEXT_ASYNC: 900, CHAT: 100}
    at, popped = budget()
    assert 300 < at <= 700 and popped <= 700  # the account's 700, not the chat route's 100

    _set_account_limit(requester, 600000)
    settings.GENERATION_DEADLINE_ROUTE_LIMITS_MS = {TEXT_ASYNC: 600000}
    at, popped = budget("60000")
    assert 55000 < at <= 60000 and 55000 < popped <= 60000  # longer limits do not lengthen

    # A limit applies only to a request that sets a deadline.
    response = requester.request_text(PROMPT, models=["m1"])
    assert TextRequest.objects.get(pk=response.json()["id"]).deadline_at is None


def test_a_shorter_route_limit_cuts_a_chat_requests_budget(local_server, accounts, worker, settings):
    requester, _ = accounts
    settings.GENERATION_DEADLINE_ROUTE_LIMITS_MS = {CHAT: 500}
    started = time.monotonic()
    response = _ask(local_server, requester.api_key, 60000)
    elapsed = time.monotonic() - started
    _assert_504(response)
    assert 0.5 <= elapsed < 5, elapsed
    text_request = TextRequest.objects.get()
    assert 0 < _budget_ms(text_request) <= 500
    assert text_request.expires_at == text_request.deadline_at


# --- 4. A deadline spent in the queue -----------------------------------------------------------


def test_a_deadline_spent_in_the_queue_is_a_504_that_cancels_the_request(local_server, accounts, worker):
    requester, _ = accounts
    for stream in (False, True):
        TextRequest.objects.all().delete()
        started = time.monotonic()
        response = _ask(local_server, requester.api_key, 400, stream=stream)
        assert time.monotonic() - started >= 0.4
        _assert_504(response)
        [text_request] = TextRequest.objects.all()
        assert text_request.deadline_at is not None
        _assert_cancelled_without_restart(text_request.pk, worker)


@contextlib.contextmanager
def _database_threads_held() -> Iterator[None]:
    """Every thread of the chat routes' database steps (hordeops.asyncdb) busy for the block."""
    release = threading.Event()
    threads = django_settings.WEB_ASYNC_DB_THREADS
    started = threading.Barrier(threads + 1)

    def hold() -> None:
        started.wait(WAIT_SECONDS)
        release.wait(WAIT_SECONDS)

    holds = [asyncdb._threads().submit(hold) for _ in range(threads)]
    try:
        started.wait(WAIT_SECONDS)
        yield
    finally:
        release.set()
        for held in holds:
            held.result(WAIT_SECONDS)


def test_a_deadline_spent_waiting_for_a_database_thread_is_a_504_that_queues_nothing(
    local_server, accounts, worker
):
    """The chat routes' database steps share a few threads (hordeops.asyncdb): waiting for one
    spends the budget like any other phase, and the step that never got a thread never runs."""
    requester, _ = accounts
    with _database_threads_held():
        asked = time.monotonic()
        response = _ask(local_server, requester.api_key, 300)
        answered = time.monotonic() - asked
    assert response.status_code == 504, response.text
    assert response.json()["error"]["code"] == "generation_deadline_exceeded"
    assert 0.3 <= answered < 2, answered  # at the deadline, not when a thread came free
    time.sleep(0.2)
    assert not TextRequest.objects.exists()


@pytest.mark.parametrize("path", [CHAT, "/v1/completions", RESPONSES, MESSAGES_PATH])
def test_a_missing_key_is_a_401_even_when_the_deadline_runs_out_first(local_server, path):
    """The database threads are all busy, so the step that checks a key waits past a 1 ms
    deadline: a missing key must still be told it is missing, not that time ran out."""
    with _database_threads_held(), httpx.Client(base_url=local_server, timeout=WAIT_SECONDS) as http:
        response = http.post(path, json=_body(path, stream=False), headers={HEADER: "1"})
    assert response.status_code == 401, response.text
    assert not TextRequest.objects.exists()


def test_the_sdks_get_a_504_they_do_not_retry(local_server, accounts, worker):
    requester, _ = accounts
    deadline = {HEADER: "400"}
    # Default retries on: only x-should-retry: false keeps each call to one request.
    sdk = openai.OpenAI(
        base_url=f"{local_server}/v1",
        api_key=requester.api_key,
        timeout=WAIT_SECONDS,
        default_headers=deadline,
    )
    calls = (
        lambda: sdk.chat.completions.create(model=MODEL, messages=MESSAGES),
        lambda: sdk.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True),
        lambda: sdk.responses.create(model=MODEL, input=PROMPT, stream=True),
    )
    for number, call in enumerate(calls, start=1):
        with pytest.raises(openai.InternalServerError) as raised:
            call()
        assert raised.value.status_code == 504
        assert raised.value.code == "generation_deadline_exceeded"
        assert raised.value.type == "timeout_error"
        assert raised.value.response.headers["x-should-retry"] == "false"
        assert TextRequest.objects.count() == number

    claude = anthropic.Anthropic(
        base_url=local_server, api_key=requester.api_key, timeout=WAIT_SECONDS, default_headers=deadline
    )
    for stream in (False, True):
        with pytest.raises(anthropic.InternalServerError) as raised:
            claude.messages.create(model=MODEL, max_tokens=50, messages=MESSAGES, stream=stream)
        assert isinstance(raised.value, anthropic.GatewayTimeoutError)
        assert raised.value.status_code == 504
        assert raised.value.type == "timeout_error"
    assert TextRequest.objects.count() == 5
    for text_request in TextRequest.objects.all():
        _assert_cancelled_without_restart(text_request.pk)
    assert worker.pop()["id"] is None


# --- 5. A deadline spent in preflight, and preflight's own bounds -------------------------------


def test_a_deadline_spent_on_white_space_in_preflight_is_a_504_not_a_committed_stream(
    local_server, accounts, worker
):
    requester, _ = accounts
    serving = Background(_serve_some, worker, [" ", "\n", "\t ", "  \r\n", " "], 1)
    response = _ask(local_server, requester.api_key, STALL_BUDGET_MS)
    generation_id = serving.result()
    _assert_504(response)
    generation = _generation_ends(generation_id)
    _assert_settlement(generation, "generation_deadline_exceeded", tokens_relayed=1)
    assert generation.request.stream_generation is None
    _assert_refused_as_cancelled(worker)
    _assert_cancelled_without_restart(generation.request_id, worker)


def test_a_non_streamed_reply_not_finished_in_time_is_a_504_and_its_generation_cancelled(
    local_server, accounts, worker
):
    requester, _ = accounts
    serving = Background(_serve_some, worker, DELTAS)  # real output, but never submitted
    response = _ask(local_server, requester.api_key, STALL_BUDGET_MS, stream=False)
    generation_id = serving.result()
    _assert_504(response)
    generation = _generation_ends(generation_id)
    # No tokens reported: the relayed characters / 4.
    _assert_settlement(generation, "generation_deadline_exceeded", -(-len("".join(DELTAS)) // 4))
    _assert_refused_as_cancelled(worker)
    _assert_cancelled_without_restart(generation.request_id, worker)


def _preflight(
    local_server, requester, worker, deltas: list[str], last: str, *, then: str | None = None
) -> tuple[httpx.Response, str]:
    """Post `deltas`, check that the requester still waits, then post `last` (and submit `then`)."""
    requesting = Background(_ask, local_server, requester.api_key, 20000)
    generation_id = _serve_some(worker, deltas)
    time.sleep(0.3)  # a requester that gave up too early would be done by now
    assert not requesting.done(), requesting.result().text[:300]
    posted = worker.progress(last)
    if then is None and posted.status_code == 409:
        # The post whose delta trips the preflight: the follower may cancel the request between
        # the delta's relay and the post's own renewal. Both answers tell the worker the truth.
        assert posted.json()["rc"] == "GenerationCancelled", posted.text
    else:
        assert posted.status_code == 200, posted.text
    if then is not None:
        assert worker.submit(then).status_code == 200
    return requesting.result(), generation_id


def test_thirty_two_white_space_events_are_a_502_and_the_request_is_cancelled(local_server, accounts, worker):
    requester, _ = accounts
    response, generation_id = _preflight(
        local_server, requester, worker, [" ", "\n", "\t"] * 10 + [" "], "\n"
    )
    _assert_502(response)
    generation = _generation_ends(generation_id)
    assert generation.settlement_information["reason"] == "upstream_stream_invalid"
    _assert_refused_as_cancelled(worker)
    _assert_cancelled_without_restart(generation.request_id, worker)


def test_output_within_65536_bytes_commits_the_stream(local_server, accounts, worker):
    requester, _ = accounts
    response, generation_id = _preflight(
        local_server, requester, worker, [" " * 65535], "x", then=" " * 65535 + "x"
    )
    assert response.status_code == 200, response.text[:300]
    contents = [e["choices"][0]["delta"].get("content") for _, e in _sse(response.text)[:-1]]
    assert contents[:2] == ["", " " * 65535 + "x"]


def test_65536_bytes_of_white_space_are_a_502_counted_in_bytes_not_characters(local_server, accounts, worker):
    requester, _ = accounts
    # U+3000 is three bytes of white space: 21845 of them are 65535 bytes.
    response, generation_id = _preflight(local_server, requester, worker, ["\u3000" * 21845], "\u3000")
    _assert_502(response)
    generation = _generation_ends(generation_id)
    assert generation.settlement_information["reason"] == "upstream_stream_invalid"
    _assert_refused_as_cancelled(worker)
    _assert_cancelled_without_restart(generation.request_id, worker)


def test_a_job_that_ends_before_any_output_is_a_502(local_server, accounts, worker):
    requester, _ = accounts
    for ending in ("", " \n\t "):  # an empty generation, and one of white space only
        requesting = Background(_ask, local_server, requester.api_key, 20000)
        generation_id = _serve_some(worker, [" ", "\n"])
        assert worker.submit(ending).status_code == 200
        response = requesting.result()
        _assert_502(response)
        text_request = Generation.objects.get(pk=generation_id).request
        assert text_request.stream_generation is None
        assert (text_request.queued, text_request.restarts) == (0, 0)
        assert worker.pop()["id"] is None  # not replayed


# --- 6. A deadline spent mid-stream -------------------------------------------------------------


def _in_turn(calls: list[Callable[[], Any]], workers: list[ChatWorker], deltas: list[str], tokens=None):
    """Start each call and have its own worker take its job and post `deltas` before the next
    call starts, so that their budgets run out together; return (result, generation id) pairs."""
    running = []
    for call, chat_worker in zip(calls, workers, strict=True):
        requesting = Background(call)
        running.append((requesting, _serve_some(chat_worker, deltas, tokens)))
    return [(requesting.result(), generation_id) for requesting, generation_id in running]


def _raised(call: Callable[[], Any]) -> tuple[Exception, list[Any]]:
    """Run a streamed SDK call to its end: what it raised, and what it yielded before."""
    received = []
    try:
        for item in call():
            received.append(item)
    except Exception as err:
        return err, received
    raise AssertionError(f"the stream ended without raising after {len(received)} items")


def test_a_deadline_spent_mid_stream_ends_the_chat_stream_with_its_error_event(live_stack, accounts):
    server_a, server_b = live_stack.urls
    requester, owner = accounts
    workers = [ChatWorker(server_b, owner.api_key, name=f"deadline-live-{n}", model=MODEL) for n in (1, 2)]
    assert workers[0].pop()["id"] is None
    budget_ms = 2500
    sdk = openai.OpenAI(
        base_url=f"{server_a}/v1", api_key=requester.api_key, max_retries=2, timeout=WAIT_SECONDS
    )

    def raw() -> tuple[httpx.Response, float]:
        started = time.monotonic()
        return _ask(server_a, requester.api_key, budget_ms), time.monotonic() - started

    def with_sdk():
        return _raised(
            lambda: sdk.chat.completions.create(
                model=MODEL, messages=MESSAGES, stream=True, extra_headers={HEADER: str(budget_ms)}
            )
        )

    # Requester on A, workers on B: some deltas, then each worker stalls and the budget runs out.
    [((response, elapsed), raw_id), ((error, chunks), sdk_id)] = _in_turn([raw, with_sdk], workers, DELTAS, 7)

    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert budget_ms / 1000 <= elapsed < budget_ms / 1000 + 5, elapsed
    assert "[DONE]" not in response.text
    assert response.text.endswith("\n\n")
    lines = [line for line in response.text.split("\n") if line]
    assert all(line.startswith("data: ") for line in lines), lines
    last = json.loads(lines[-1][len("data: ") :])
    assert last == {
        "error": {
            "message": last["error"]["message"],
            "type": "timeout_error",
            "param": None,
            "code": "generation_deadline_exceeded",
        }
    }
    assert isinstance(last["error"]["message"], str) and last["error"]["message"]
    chunks_sent = [json.loads(line[len("data: ") :]) for line in lines[:-1]]
    assert [c["choices"][0]["delta"].get("content") for c in chunks_sent] == ["", *DELTAS]
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks_sent)

    # The openai SDK raises on that event: a plain APIError, no status.
    assert isinstance(error, openai.APIError) and not isinstance(error, openai.APIStatusError), error
    assert error.code == "generation_deadline_exceeded"
    assert error.type == "timeout_error"
    assert [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content] == DELTAS

    for chat_worker, generation_id in zip(workers, (raw_id, sdk_id), strict=True):
        generation = _generation_ends(generation_id)
        assert str(generation.request.stream_generation) == generation_id  # it had been committed
        _assert_refused_as_cancelled(chat_worker)
        _assert_settlement(generation, "generation_deadline_exceeded", tokens_relayed=7)
        _assert_cancelled_without_restart(generation.request_id, chat_worker)
    assert TextRequest.objects.count() == 2
    output = live_stack.output()
    assert "PROMPT-SENTINEL" not in output and "REPLY-SENTINEL" not in output
    for chat_worker in workers:
        chat_worker.close()


def test_a_deadline_spent_mid_stream_ends_responses_and_messages_streams_with_their_error_events(
    local_server, accounts, worker
):
    requester, owner = accounts
    Account.objects.filter(pk=owner.account.pk).update(worker_limit=4)  # past the untrusted 3
    workers = [worker] + [
        ChatWorker(local_server, owner.api_key, name=f"deadline-{n}", model=MODEL) for n in (2, 3, 4)
    ]
    deadline = {HEADER: str(STALL_BUDGET_MS)}
    sdk = openai.OpenAI(base_url=f"{local_server}/v1", api_key=requester.api_key, timeout=WAIT_SECONDS)
    claude = anthropic.Anthropic(base_url=local_server, api_key=requester.api_key, timeout=WAIT_SECONDS)
    calls = [
        lambda: _ask(local_server, requester.api_key, STALL_BUDGET_MS, path=RESPONSES),
        lambda: _ask(local_server, requester.api_key, STALL_BUDGET_MS, path=MESSAGES_PATH),
        lambda: _raised(
            lambda: sdk.responses.create(model=MODEL, input=PROMPT, stream=True, extra_headers=deadline)
        ),
        lambda: _raised(
            lambda: claude.messages.create(
                model=MODEL, max_tokens=200, messages=MESSAGES, stream=True, extra_headers=deadline
            )
        ),
    ]
    results = _in_turn(calls, workers, DELTAS[:2])

    # Raw SSE on both routes: one error event, last, and no completion or stop event.
    tails = []
    for response, _ in results[:2]:
        assert response.status_code == 200, response.text
        events = _sse(response.text)
        names = [name for name, _ in events]
        assert names.count("error") == 1 and names[-1] == "error", names
        assert not {"response.completed", "response.failed", "message_delta", "message_stop"} & set(names)
        assert "[DONE]" not in response.text
        tails.append(events[-1][1])
    responses_error, messages_error = tails
    assert set(responses_error) == {"type", "code", "message", "param", "sequence_number", "error"}
    assert responses_error["type"] == "error"
    assert responses_error["code"] == "generation_deadline_exceeded"
    assert responses_error["param"] is None
    assert responses_error["sequence_number"] == 4 + 2  # four opening events and two deltas
    assert responses_error["error"] == {
        "type": "timeout_error",
        "code": "generation_deadline_exceeded",
        "message": responses_error["message"],
        "param": None,
    }
    assert messages_error == {
        "type": "error",
        "error": {"type": "timeout_error", "message": messages_error["error"]["message"]},
    }

    # The SDKs raise on those events.
    (responses_raised, _), _ = results[2]
    assert isinstance(responses_raised, openai.APIError), responses_raised
    assert responses_raised.code == "generation_deadline_exceeded"
    assert responses_raised.type == "timeout_error"
    (messages_raised, _), _ = results[3]
    assert isinstance(messages_raised, anthropic.APIStatusError), messages_raised
    assert messages_raised.type == "timeout_error"
    assert messages_raised.status_code == 200  # raised on a committed stream

    for chat_worker, (_, generation_id) in zip(workers, results, strict=True):
        generation = _generation_ends(generation_id)
        _assert_refused_as_cancelled(chat_worker)
        _assert_settlement(generation, "generation_deadline_exceeded")
    assert TextRequest.objects.filter(state=TextRequest.State.CANCELLED).count() == 4
    for chat_worker in workers[1:]:
        chat_worker.close()


# --- 7. Forwarding the budget, and the internal hop ---------------------------------------------


def test_the_pop_forwards_the_remaining_budget_rounded_down(requester, owner, time_machine):
    owner.pop("w", chat=True)
    created = _text_request(requester, "60000")
    text_request = TextRequest.objects.get(pk=created.json()["id"])
    time_machine.move_to(text_request.deadline_at - timedelta(seconds=20, microseconds=12700), tick=False)
    job = owner.pop("w", chat=True).json()
    assert job["deadline_ms"] == 20012  # 20012.7 ms left, rounded down

    created = _text_request(requester, "60000")
    text_request = TextRequest.objects.get(pk=created.json()["id"])
    time_machine.move_to(text_request.deadline_at - timedelta(microseconds=900), tick=False)
    assert owner.pop("w", chat=True).json()["deadline_ms"] == 0
    time_machine.move_to(text_request.deadline_at, tick=False)
    assert owner.pop("w", chat=True).json()["id"] is None  # spent: nobody may take it


def _internal_budget(caller, public: str | None, headers: dict[str, str]) -> float | None:
    meta = {f"HTTP_{name.upper().replace('-', '_')}": value for name, value in headers.items()}
    response = _text_request(caller, public, **meta)
    assert response.status_code == 202, response.content
    text_request = TextRequest.objects.get(pk=response.json()["id"])
    return None if text_request.deadline_at is None else _budget_ms(text_request)


def _signed(remaining_ms: int, *, secret: str = "s3cret", path: str = TEXT_ASYNC, method: str = "POST", **kw):
    return deadlines.sign_internal_deadline(
        secret=secret, method=method, path=path, remaining_ms=remaining_ms, **kw
    )


def test_an_internal_deadline_counts_only_when_signed_fresh_and_only_shortens(requester, owner, settings):
    settings.ACCOUNT_MAX_WAITING_REQUESTS = 100  # each case queues a request
    owner.pop("w")
    settings.INTERNAL_HOP_SECRET = "s3cret"
    internal = deadlines.INTERNAL_HEADER
    signature = deadlines.SIGNATURE_HEADER
    now = time.time()

    # Forged: no signature, a wrong secret, another path, method or value, a stale timestamp.
    forged = [
        {internal: "500"},
        {internal: "500", signature: "t=1,v1=00"},
        _signed(500, secret="guess"),
        _signed(500, path=CHAT),
        _signed(500, method="GET"),
        {**_signed(900), internal: "500"},
        _signed(500, now=now - 300),  # five minutes old
        _signed(500, now=now - deadlines.SIGNATURE_WINDOW_SECONDS - 2),
        _signed(500, now=now + 300),  # from the future
        {internal: "500", signature: "t=²,v1=00"},
        {internal: "500", signature: "t=" + "9" * 5000 + ",v1=00"},
        {internal: "500", signature: f"t={int(now)},v1=é"},
        {internal: "500", signature: "garbage"},
        {internal: "9" * 5000, signature: f"t={int(now)},v1=00"},
    ]
    for headers in forged:
        assert _internal_budget(requester, None, headers) is None, headers
        assert 55000 < _internal_budget(requester, "60000", headers) <= 60000, headers

    # Signed and fresh: honoured, and it can only shorten the public budget. (Each signature
    # is new: a header seen before is a replay, below.)
    assert 0 < _internal_budget(requester, "60000", _signed(500)) <= 500
    assert 0 < _internal_budget(requester, None, _signed(501)) <= 501
    assert 0 < _internal_budget(requester, "60000", _signed(502, now=now - 20)) <= 502
    assert 55000 < _internal_budget(requester, "60000", _signed(90000)) <= 60000
    assert 0 < _internal_budget(requester, "1000", _signed(90001)) <= 1000

    # With no secret configured, internal headers are never proof of anything.
    settings.INTERNAL_HOP_SECRET = ""
    for headers in (_signed(500), _signed(500, secret="")):
        assert _internal_budget(requester, None, headers) is None
        assert 55000 < _internal_budget(requester, "60000", headers) <= 60000


def test_a_signed_internal_deadline_alone_is_held_to_the_largest_accepted_one(requester, owner, settings):
    owner.pop("w")
    settings.INTERNAL_HOP_SECRET = "s3cret"
    for remaining_ms in (2 * 10**14 + 1, 10**15 - 1):  # past a datetime's range as a deadline
        budget = _internal_budget(requester, None, _signed(remaining_ms))
        assert settings.GENERATION_DEADLINE_MAX_MS - 5000 < budget <= settings.GENERATION_DEADLINE_MAX_MS


def test_a_captured_internal_deadline_header_counts_once_and_its_replays_are_ignored(
    requester, owner, settings
):
    owner.pop("w")
    settings.INTERNAL_HOP_SECRET = "s3cret"
    captured = _signed(700)

    assert 0 < _internal_budget(requester, None, captured) <= 700
    # The same headers again, within the signature's window: the hop is not believed twice.
    assert _internal_budget(requester, None, captured) is None
    assert 55000 < _internal_budget(requester, "60000", captured) <= 60000
    # A fresh signature from the same hop is believed.
    assert 0 < _internal_budget(requester, None, _signed(701)) <= 701


def test_a_replayed_internal_deadline_header_does_not_cut_a_chat_requests_budget(
    local_server, accounts, worker, settings
):
    requester, _ = accounts
    settings.INTERNAL_HOP_SECRET = "s3cret"
    captured = list(_signed(300, path=CHAT).items())

    started = time.monotonic()
    _assert_504(_ask(local_server, requester.api_key, headers=captured))
    assert time.monotonic() - started < 1.4  # the hop's 300 ms

    started = time.monotonic()
    _assert_504(_ask(local_server, requester.api_key, 1500, headers=captured))
    assert time.monotonic() - started >= 1.5  # the public 1,500 ms: the replayed hop is ignored


# --- 8. The horde route: the deadline bounds the request's life ---------------------------------


def test_a_text_request_with_a_deadline_expires_at_it_and_its_generation_is_cancelled(
    requester, owner, time_machine
):
    owner.pop("w", chat=True)
    created = _text_request(requester, "60000")
    request_id = created.json()["id"]
    text_request = TextRequest.objects.get(pk=request_id)
    assert text_request.expires_at == text_request.deadline_at
    job = owner.pop("w", chat=True).json()
    assert 55000 < job["deadline_ms"] <= 60000

    time_machine.move_to(text_request.deadline_at + timedelta(milliseconds=1), tick=False)
    result = services.abort_stale_generations()
    assert (result.expired_requests, result.cancelled_by_expiry, result.aborted) == (1, 1, 0)
    text_request.refresh_from_db()
    assert (text_request.state, text_request.queued) == (TextRequest.State.EXPIRED, 0)
    generation = Generation.objects.get(pk=job["id"])
    assert generation.state == Generation.State.CANCELLED
    assert generation.settlement_information == {
        "usage": "unknown",
        "tokens_relayed": 0,
        "reservation": None,
        "reason": "generation_deadline_exceeded",
    }
    late = owner.submit(job["id"], "REPLY-SENTINEL-late")
    assert late.status_code == 409 and late.json()["rc"] == "GenerationCancelled", late.content
    worker = Worker.objects.get(name="w")
    assert (worker.aborted_jobs, worker.uncompleted_jobs) == (0, 0)
    status = requester.status(request_id).json()
    assert (status["done"], status["faulted"], status["processing"], status["waiting"]) == (True, True, 0, 0)
    assert owner.pop("w", chat=True).json()["id"] is None


def test_a_request_past_its_deadline_is_final_at_once_without_waiting_for_the_stale_pass(
    requester, owner, time_machine
):
    owner.pop("w", chat=True)
    running = TextRequest.objects.get(pk=_text_request(requester, "60000").json()["id"])
    waiting = TextRequest.objects.get(pk=_text_request(requester, "60000").json()["id"])
    job = owner.pop("w", chat=True).json()
    assert job["id"] and Generation.objects.get(pk=job["id"]).request_id == running.pk
    time_machine.move_to(waiting.deadline_at + timedelta(milliseconds=1), tick=False)
    # No stale pass has run: the status alone makes both final, as the pass would have.
    for text_request in (running, waiting):
        status = requester.status(str(text_request.id)).json()
        assert (status["done"], status["faulted"], status["waiting"], status["processing"]) == (
            True,
            True,
            0,
            0,
        )
        assert (status["queue_position"], status["wait_time"]) == (0, 0)
        text_request.refresh_from_db()
        assert text_request.state == TextRequest.State.EXPIRED
    generation = Generation.objects.get(pk=job["id"])
    assert generation.state == Generation.State.CANCELLED
    assert generation.settlement_information["reason"] == "generation_deadline_exceeded"
    assert owner.submit(job["id"], "late").json()["rc"] == "GenerationCancelled"
    assert services.abort_stale_generations().expired_requests == 0  # nothing left for it


def test_a_delete_past_the_deadline_records_the_deadlines_ending_not_a_cancellation(
    requester, owner, time_machine
):
    owner.pop("w", chat=True)
    text_request = TextRequest.objects.get(pk=_text_request(requester, "60000").json()["id"])
    job = owner.pop("w", chat=True).json()
    time_machine.move_to(text_request.deadline_at + timedelta(milliseconds=1), tick=False)
    answer = requester.client.delete(f"/api/v2/generate/text/status/{text_request.id}")
    assert answer.status_code == 200 and answer.json()["faulted"] is True
    text_request.refresh_from_db()
    assert text_request.state == TextRequest.State.EXPIRED
    reason = Generation.objects.get(pk=job["id"]).settlement_information["reason"]
    assert reason == "generation_deadline_exceeded"
    # Before its deadline, a DELETE is the requester's cancellation, as ever.
    before = TextRequest.objects.get(pk=_text_request(requester, "60000").json()["id"])
    requester.client.delete(f"/api/v2/generate/text/status/{before.id}")
    before.refresh_from_db()
    assert before.state == TextRequest.State.CANCELLED


def test_a_chat_workers_submit_after_the_deadline_but_before_the_pass_is_refused_as_cancelled(
    requester, owner, time_machine
):
    owner.pop("w", chat=True)
    request_id = _text_request(requester, "60000").json()["id"]
    job = owner.pop("w", chat=True).json()
    deadline_at = TextRequest.objects.get(pk=request_id).deadline_at
    time_machine.move_to(deadline_at + timedelta(milliseconds=1), tick=False)
    late = owner.submit(job["id"], "REPLY-SENTINEL-late")
    assert late.status_code == 409 and late.json()["rc"] == "GenerationCancelled", late.content
    generation = Generation.objects.get(pk=job["id"])
    assert generation.state == Generation.State.CANCELLED and generation.text is None
    assert generation.settlement_information["reason"] == "generation_deadline_exceeded"
    assert TextRequest.objects.get(pk=request_id).state == TextRequest.State.CANCELLED
    assert Worker.objects.get(name="w").aborted_jobs == 0
    assert services.abort_stale_generations().aborted == 0


def test_a_legacy_workers_submit_after_the_deadline_is_accepted_and_its_text_goes_to_no_one(
    requester, owner, time_machine
):
    owner.pop("w")
    request_id = _text_request(requester, "60000").json()["id"]
    job = owner.pop("w").json()
    deadline_at = TextRequest.objects.get(pk=request_id).deadline_at
    time_machine.move_to(deadline_at + timedelta(milliseconds=1), tick=False)
    late = owner.submit(job["id"], "REPLY-SENTINEL-late")
    assert late.status_code == 200 and late.json()["reward"] == 0, late.content  # counted nowhere
    generation = Generation.objects.get(pk=job["id"])
    assert generation.state == Generation.State.CANCELLED and generation.text is None
    assert TextRequest.objects.get(pk=request_id).state == TextRequest.State.CANCELLED
    assert Worker.objects.get(name="w").aborted_jobs == 0


# --- 9. Logs ------------------------------------------------------------------------------------


def test_a_deadline_exceeded_cycle_logs_neither_the_prompt_nor_the_reply(
    local_server, accounts, worker, caplog
):
    caplog.set_level(logging.DEBUG)
    requester, owner = accounts
    second = ChatWorker(local_server, owner.api_key, name="deadline-2", model=MODEL)
    # Mid-stream (committed, then the budget runs out), in preflight, and in the queue, at once.
    mid_stream = Background(_ask, local_server, requester.api_key, STALL_BUDGET_MS)
    _serve_some(worker, DELTAS)
    in_preflight = Background(_ask, local_server, requester.api_key, STALL_BUDGET_MS)
    _serve_some(second, [" "])
    _assert_504(_ask(local_server, requester.api_key, 300, stream=False))
    committed = mid_stream.result()
    _assert_504(in_preflight.result())
    assert committed.status_code == 200 and "generation_deadline_exceeded" in committed.text
    for chat_worker in (worker, second):
        _generation_ends(chat_worker.id)
        _assert_refused_as_cancelled(chat_worker)  # the worker tries to go on, with more text
    second.close()

    records = caplog.records
    # The server's own logs were captured: its 409s and 504s, and its access log.
    assert any(
        r.name == "django.request" and "/api/v2/generate/text/submit" in r.getMessage() for r in records
    )
    assert any(r.name == "uvicorn.access" and "/v1/chat/completions" in r.getMessage() for r in records)
    for record in records:
        text = " ".join(
            str(part) for part in (record.getMessage(), record.exc_text, record.stack_info, record.__dict__)
        )
        assert "PROMPT-SENTINEL" not in text, record.getMessage()
        assert "REPLY-SENTINEL" not in text, record.getMessage()
