"""OpenAI's text completions (`POST /v1/completions`) over text jobs: any worker of the model
serves them, a legacy worker (the AI Horde's scribe pops without `chat`) whole at its submit,
and the openai SDK reads them, streamed and not, with the chat routes' rules."""

import json
import socket
import time

import httpx
import openai
import pytest

from jobs.models import Ending, TextRequest
from tests.live import Background, ChatWorker

pytestmark = pytest.mark.parametrize("live_stack", [1], indirect=True)

MODEL = "koboldcpp/completions-13B"
REPLY = " a lighthouse keeper who counted the waves."


@pytest.fixture
def accounts(make_caller):
    return make_caller("completions-requester"), make_caller("completions-owner")


class LegacyWorker:
    """A worker as the AI Horde's scribe is: pops without `chat`, submits the whole text."""

    def __init__(self, base_url: str, api_key: str) -> None:
        self.http = httpx.Client(base_url=base_url, headers={"apikey": api_key}, timeout=20)

    def pop(self) -> dict:
        body = {"name": "scribe-like", "models": [MODEL], "max_length": 512, "max_context_length": 2048}
        answer = self.http.post("/api/v2/generate/text/pop", json=body)
        assert answer.status_code == 200, answer.text
        return answer.json()

    def serve_one(self, text: str, timeout: float = 20) -> dict:
        deadline = time.monotonic() + timeout
        while (job := self.pop())["id"] is None:
            assert time.monotonic() < deadline, "no job came"
            time.sleep(0.05)
        answer = self.http.post("/api/v2/generate/text/submit", json={"id": job["id"], "generation": text})
        assert answer.status_code == 200, answer.text
        return job


def _sdk(base_url: str, api_key: str, **options) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key=api_key, max_retries=0, timeout=30, **options)


def test_a_legacy_worker_serves_a_completion_whole_and_the_sdk_reads_it(live_stack, accounts):
    requester, owner = accounts
    scribe = LegacyWorker(live_stack.urls[0], owner.api_key)
    assert scribe.pop()["id"] is None  # checked in with its model
    serving = Background(scribe.serve_one, REPLY)
    done = _sdk(live_stack.urls[0], requester.api_key).completions.create(
        model=MODEL, prompt="Once upon a time there was", max_tokens=40, temperature=0.7, stop=["\n\n"]
    )
    job = serving.result()
    assert job["payload"]["prompt"] == "Once upon a time there was"
    assert (job["payload"]["max_length"], job["payload"]["stop_sequence"]) == (40, ["\n\n"])
    assert done.object == "text_completion" and done.id.startswith("cmpl-")
    assert (done.choices[0].text, done.choices[0].finish_reason) == (REPLY, "stop")
    assert done.usage.completion_tokens > 0 and done.usage.prompt_tokens > 0
    request = TextRequest.objects.get(pk=done.id.removeprefix("cmpl-"))
    assert (request.kind, request.followed, request.state) == (
        TextRequest.Kind.TEXT,
        True,
        TextRequest.State.DONE,
    )


def test_a_streamed_completion_ends_with_its_text_a_finish_reason_and_done(live_stack, accounts):
    requester, owner = accounts
    worker = ChatWorker(live_stack.urls[0], owner.api_key, name="bridge-like", model=MODEL)
    assert worker.pop()["id"] is None

    def serve() -> int:
        deadline = time.monotonic() + 20
        while (job := worker.pop())["id"] is None:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        worker.job = job
        assert job["kind"] == "text"  # a text job, even to a chat worker
        return worker.submit(REPLY).status_code

    serving = Background(serve)
    stream = _sdk(live_stack.urls[0], requester.api_key).completions.create(
        model=MODEL, prompt=["One prompt in a list"], max_tokens=24, stream=True
    )
    chunks = list(stream)
    assert serving.result() == 200
    assert "".join(chunk.choices[0].text for chunk in chunks) == REPLY
    assert [chunk.choices[0].finish_reason for chunk in chunks][-1] == "stop"
    assert all(chunk.object == "text_completion" for chunk in chunks)


def test_a_chat_worker_streams_a_completions_text_job_in_pieces_through_progress_posts(live_stack, accounts):
    requester, owner = accounts
    worker = ChatWorker(live_stack.urls[0], owner.api_key, name="streaming-bridge", model=MODEL)
    assert worker.pop()["id"] is None
    pieces = ["Once ", "there ", "was ", "a ", "stream."]

    def serve() -> dict:
        deadline = time.monotonic() + 20
        while (job := worker.pop())["id"] is None:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        worker.job, worker.seq = job, 0
        answers = [worker.progress(piece, tokens=index + 1).json() for index, piece in enumerate(pieces)]
        assert worker.submit("".join(pieces)).status_code == 200
        return {"job": job, "leases": [answer["lease"] for answer in answers]}

    serving = Background(serve)
    chunks = list(
        _sdk(live_stack.urls[0], requester.api_key).completions.create(
            model=MODEL, prompt="Tell it", max_tokens=64, stream=True
        )
    )
    served = serving.result()
    assert (served["job"]["kind"], served["job"]["streamed"]) == ("text", True)
    assert set(served["leases"]) <= {"granted", "at_cap", "not_renewed"}  # renewed by its output
    texts = [chunk.choices[0].text for chunk in chunks]
    assert "".join(texts) == "".join(pieces)
    assert len([text for text in texts if text]) >= 3  # in pieces, not whole at the end


def test_a_completion_is_refused_in_openais_shape_for_what_the_horde_does_not_serve(live_stack, accounts):
    requester, owner = accounts
    sdk = _sdk(live_stack.urls[0], requester.api_key)
    with pytest.raises(openai.NotFoundError) as unknown:
        sdk.completions.create(model="nobody/serves-this", prompt="hi")
    assert unknown.value.body["code"] == "model_not_found"
    LegacyWorker(live_stack.urls[0], owner.api_key).pop()
    for bad in ({"prompt": ["two", "prompts"]}, {"prompt": "hi", "echo": True}, {"prompt": "hi", "n": 9}):
        with pytest.raises(openai.BadRequestError):
            sdk.completions.create(model=MODEL, **bad)
    with pytest.raises(openai.AuthenticationError):
        _sdk(live_stack.urls[0], "not-a-key").completions.create(model=MODEL, prompt="hi")


def test_a_completions_deadline_runs_out_with_a_504_and_cancels_its_request(live_stack, accounts):
    requester, owner = accounts
    LegacyWorker(live_stack.urls[0], owner.api_key).pop()  # online, but it never pops again
    sdk = _sdk(live_stack.urls[0], requester.api_key, default_headers={"X-MultiLLM-Deadline-Ms": "800"})
    with pytest.raises(openai.APIStatusError) as raised:
        sdk.completions.create(model=MODEL, prompt="hi")
    assert raised.value.status_code == 504
    assert raised.value.body["code"] == "generation_deadline_exceeded"
    request = TextRequest.objects.filter(followed=True).get()
    assert (request.state, request.ending) == (TextRequest.State.CANCELLED, Ending.DEADLINE)


def test_a_requester_that_leaves_a_completion_stream_cancels_its_request(live_stack, accounts):
    requester, owner = accounts
    LegacyWorker(live_stack.urls[0], owner.api_key).pop()
    url = httpx.URL(live_stack.urls[0])
    body = json.dumps({"model": MODEL, "prompt": "hi", "stream": True}).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {url.host}:{url.port}\r\n"
        f"Authorization: Bearer {requester.api_key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection((url.host, url.port)) as connection:
        connection.sendall(head + body)
        deadline = time.monotonic() + 10
        while not TextRequest.objects.filter(followed=True).exists():
            assert time.monotonic() < deadline, "the completion was not queued"
            time.sleep(0.05)
    # The requester left before any output: its request is cancelled, and nothing restarts it.
    deadline = time.monotonic() + 10
    while (request := TextRequest.objects.get(followed=True)).state == TextRequest.State.ACTIVE:
        assert time.monotonic() < deadline, "the request was not cancelled"
        time.sleep(0.1)
    assert (request.state, request.ending, request.queued) == (
        TextRequest.State.CANCELLED,
        Ending.CANCELLED,
        0,
    )
