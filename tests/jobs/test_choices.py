"""OpenAI's `n` on /v1: n choices of one request, a job each, served by any workers.

Real uvicorn processes, workers popping through the HTTP API, the requester reading the
official SDK or the raw SSE."""

import json
import socket
import time
from decimal import Decimal
from typing import Any

import httpx
import openai
import pytest

from jobs import spending
from jobs.models import Ending, Generation, TextRequest
from kudos.models import Hold
from tests.live import Background, ChatWorker

pytestmark = pytest.mark.parametrize("live_stack", [1], indirect=True)

MODEL = "koboldcpp/choices-8B"
MESSAGES = [{"role": "user", "content": "Name a colour."}]
# Short replies: a worker that finished one job is measured fast, and the speed gate would
# keep a long job from the others, still unmeasured, while it is online.
WAIT_SECONDS = 20


@pytest.fixture
def accounts(make_caller):
    return make_caller("choices-requester"), make_caller("choices-owner")


def _workers(url: str, api_key: str, count: int = 3) -> list[ChatWorker]:
    workers = [ChatWorker(url, api_key, name=f"choices-{i}", model=MODEL) for i in range(count)]
    for worker in workers:
        assert worker.pop()["id"] is None  # checked in with the model
    return workers


def _sdk(url: str, api_key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=api_key, max_retries=0, timeout=WAIT_SECONDS)


def _wait_for(predicate, what: str) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _committed(count: int) -> None:
    """Wait until `count` generations are committed to the stream: a choice's index is given
    as the requester's follower reads its first output, which may lag the workers' posts."""
    _wait_for(lambda: Generation.objects.filter(streamed=True).count() == count, f"{count} commitments")


def _events(url: str, api_key: str, body: dict[str, Any]) -> list[Any]:
    """A raw SSE request: each `data:` payload, decoded ([DONE] as the string)."""
    headers = {"Authorization": f"Bearer {api_key}"}
    with httpx.Client(base_url=url, headers=headers, timeout=WAIT_SECONDS) as http:
        with http.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200, response.read()
            events = []
            for line in response.iter_lines():
                if line.startswith("data: "):
                    payload = line[len("data: ") :]
                    events.append(payload if payload == "[DONE]" else json.loads(payload))
            return events


def test_n_3_not_streamed_gives_3_choices_indexed_0_1_2_served_by_different_pops(live_stack, accounts):
    requester, owner = accounts
    workers = _workers(live_stack.urls[0], owner.api_key)
    replies = ["Red.", "Green, I think.", "Blue"]

    def serve() -> list[str]:
        served = []
        for worker, reply in zip(workers, replies, strict=True):  # one after another: index order
            worker.pop_job()
            assert worker.submit(reply).status_code == 200
            served.append(worker.id)
        return served

    serving = Background(serve)
    completion = _sdk(live_stack.urls[0], requester.api_key).chat.completions.create(
        model=MODEL, messages=MESSAGES, n=3, max_tokens=50
    )
    served = serving.result()

    assert [c.index for c in completion.choices] == [0, 1, 2]
    assert [c.message.content for c in completion.choices] == replies
    assert all(c.finish_reason == "stop" and c.message.role == "assistant" for c in completion.choices)
    generations = [Generation.objects.get(pk=generation_id) for generation_id in served]
    assert len({g.worker_id for g in generations}) == 3  # three pops, by three workers
    request = generations[0].request
    assert all(g.request_id == request.pk and g.state == Generation.State.DONE for g in generations)
    assert (request.n, request.finished, request.queued, request.state) == (3, 3, 0, TextRequest.State.DONE)
    # Usage and kudos summed over the choices, the prompt counted once.
    assert completion.usage.completion_tokens == sum(g.tokens for g in generations)
    assert completion.usage.prompt_tokens == request.prompt_tokens
    assert Decimal(str(completion.usage.kudos)) == request.kudos_spent > 0
    # Held for three as the horde's route holds params.n, and released at the end.
    assert request.kudos_reserved == spending.request_cost(
        models=[MODEL], max_length=50, max_context_length=request.max_context_length, n=3
    )
    assert not Hold.objects.filter(request_id=request.pk).exists()


def test_n_above_8_is_refused_with_a_400_in_openais_shape_on_both_routes(live_stack, accounts):
    requester, owner = accounts
    _workers(live_stack.urls[0], owner.api_key, count=1)
    sdk = _sdk(live_stack.urls[0], requester.api_key)
    with pytest.raises(openai.BadRequestError) as chat:
        sdk.chat.completions.create(model=MODEL, messages=MESSAGES, n=9)
    with pytest.raises(openai.BadRequestError) as completion:
        sdk.completions.create(model=MODEL, prompt="hi", n=9)
    for refused in (chat.value, completion.value):
        assert refused.status_code == 400
        assert set(refused.body) == {"message", "type", "param", "code"}, refused.body
        assert (refused.body["type"], refused.body["param"]) == ("invalid_request_error", "n")
    assert not TextRequest.objects.exists()


def test_n_3_streamed_interleaves_the_choices_by_index_and_ends_each(live_stack, accounts):
    requester, owner = accounts
    url = live_stack.urls[0]
    workers = _workers(url, owner.api_key)
    reading = Background(
        _events,
        url,
        requester.api_key,
        {"model": MODEL, "messages": MESSAGES, "n": 3, "stream": True, "max_tokens": 50},
    )
    for worker in workers:
        worker.pop_job()
    parts = [["Re", "d", "."], ["Gr", "een", "!"], ["Bl", "ue", "?"]]
    for step in range(3):  # a's first, b's first, c's first, a's second, ...
        for worker, deltas in zip(workers, parts, strict=True):
            assert worker.progress(deltas[step], tokens=step + 1).status_code == 200
        if step == 0:
            _committed(3)  # indexed in the order of their first posts
    # The second choice ends first: each choice ends on its own.
    for worker, deltas in zip(
        [workers[1], workers[0], workers[2]], [parts[1], parts[0], parts[2]], strict=True
    ):
        assert worker.submit("".join(deltas)).status_code == 200
    events = reading.result()

    assert events[-1] == "[DONE]"
    *chunks, usage_chunk = events[:-1]
    choices = [c["choices"][0] for c in chunks]
    assert all(len(c["choices"]) == 1 for c in chunks)
    assert [c["index"] for c in choices[:3]] == [0, 1, 2]  # each starts with its role
    assert all(c["delta"] == {"role": "assistant", "content": ""} for c in choices[:3])
    contents = [(c["index"], c["delta"]["content"]) for c in choices if c["delta"].get("content")]
    assert [index for index, _ in contents] == [0, 1, 2] * 3  # interleaved as the workers posted
    for index, deltas in enumerate(parts):
        assert "".join(text for i, text in contents if i == index) == "".join(deltas)
    ends = [(c["index"], c["finish_reason"]) for c in choices if c["finish_reason"] is not None]
    assert ends == [(1, "stop"), (0, "stop"), (2, "stop")]  # each its own, as it ended
    # One usage after every choice ended: the three jobs' tokens and kudos summed.
    assert usage_chunk["choices"] == [] and usage_chunk["id"] == chunks[0]["id"]
    request = TextRequest.objects.get(pk=chunks[0]["id"].removeprefix("chatcmpl-"))
    generations = list(request.generations.all())
    assert usage_chunk["usage"]["completion_tokens"] == sum(g.tokens for g in generations) == 9
    assert Decimal(str(usage_chunk["usage"]["kudos"])) == request.kudos_spent > 0
    assert all(g.streamed and g.state == Generation.State.DONE for g in generations)
    assert request.state == TextRequest.State.DONE


def test_the_openai_sdk_reads_a_streamed_n_3_into_three_choices(live_stack, accounts):
    requester, owner = accounts
    workers = _workers(live_stack.urls[0], owner.api_key)
    replies = ["one", "two", "three"]

    def serve() -> None:
        for worker, reply in zip(workers, replies, strict=True):
            worker.pop_job()
            assert worker.progress(reply).status_code == 200
            assert worker.submit(reply).status_code == 200

    serving = Background(serve)
    stream = _sdk(live_stack.urls[0], requester.api_key).chat.completions.create(
        model=MODEL, messages=MESSAGES, n=3, stream=True, max_tokens=50
    )
    texts: dict[int, str] = {}
    finished: dict[int, str] = {}
    usage = None
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
            if choice.finish_reason:
                finished[choice.index] = choice.finish_reason
        usage = chunk.usage or usage
    serving.result()
    assert texts == {0: "one", 1: "two", 2: "three"}
    assert finished == {0: "stop", 1: "stop", 2: "stop"}
    assert usage is not None and usage.completion_tokens > 0


def test_a_requester_that_leaves_an_n_3_stream_cancels_all_three(live_stack, accounts):
    requester, owner = accounts
    url = httpx.URL(live_stack.urls[0])
    workers = _workers(live_stack.urls[0], owner.api_key)
    body = json.dumps(
        {"model": MODEL, "messages": MESSAGES, "n": 3, "stream": True, "max_tokens": 50}
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {url.host}:{url.port}\r\n"
        f"Authorization: Bearer {requester.api_key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection((url.host, url.port)) as connection:
        connection.sendall(head + body)
        for worker in workers:
            worker.pop_job()
        assert workers[0].progress("Hello").status_code == 200  # the stream commits and starts
        assert connection.recv(4096).startswith(b"HTTP/1.1 200")
        assert workers[1].progress("Hi").status_code == 200  # a second choice is seen too
    # The requester has gone, with two choices started and one not: all three are cancelled.
    request = TextRequest.objects.get()
    _wait_for(lambda: TextRequest.objects.get().state != TextRequest.State.ACTIVE, "the cancellation")
    request.refresh_from_db()
    assert (request.state, request.ending, request.queued) == (
        TextRequest.State.CANCELLED,
        Ending.CANCELLED,
        0,
    )
    assert [g.state for g in request.generations.all()] == [Generation.State.CANCELLED] * 3
    for worker in workers:  # each worker is told to stop
        told = worker.progress("more")
        assert (told.status_code, told.json()["rc"]) == (409, "GenerationCancelled"), told.text


def test_a_choice_given_back_before_it_showed_output_is_served_by_another_pop(live_stack, accounts):
    requester, owner = accounts
    url = live_stack.urls[0]
    first, quitter, spare = _workers(url, owner.api_key)
    reading = Background(
        _events,
        url,
        requester.api_key,
        {"model": MODEL, "messages": MESSAGES, "n": 2, "stream": True, "max_tokens": 50},
    )
    first.pop_job()
    quitter.pop_job()
    assert first.progress("Red").status_code == 200  # the stream has begun: choice 0 is committed
    _committed(1)
    assert quitter.submit("", state="faulted").status_code == 200  # choice 1 showed nothing yet
    request = TextRequest.objects.get()
    assert (request.state, request.queued) == (TextRequest.State.ACTIVE, 1)  # not faulted: requeued
    spare.pop_job()
    assert spare.progress("Blue").status_code == 200
    _committed(2)
    assert spare.submit("Blue").status_code == 200
    assert first.submit("Red").status_code == 200
    events = reading.result()
    assert events[-1] == "[DONE]"
    contents = {}
    for chunk in events[:-2]:
        choice = chunk["choices"][0]
        contents[choice["index"]] = contents.get(choice["index"], "") + (choice["delta"].get("content") or "")
    assert contents == {0: "Red", 1: "Blue"}


def test_a_committed_choice_that_fails_ends_the_whole_stream_and_cancels_the_others(live_stack, accounts):
    requester, owner = accounts
    url = live_stack.urls[0]
    first, quitter, third = _workers(url, owner.api_key)
    reading = Background(
        _events,
        url,
        requester.api_key,
        {"model": MODEL, "messages": MESSAGES, "n": 3, "stream": True, "max_tokens": 50},
    )
    for worker in (first, quitter, third):
        worker.pop_job()
    assert first.progress("Red").status_code == 200
    _committed(1)
    assert first.submit("Red").status_code == 200  # choice 0 ends well
    assert third.progress("Gre").status_code == 200  # choice 1 is under way
    assert quitter.progress("Bl").status_code == 200  # choice 2 is seen ...
    _committed(3)
    assert quitter.submit("", state="faulted").status_code == 200  # ... then given back
    events = reading.result()
    assert "[DONE]" not in events
    error = events[-1]["error"]
    assert error["code"] == Ending.GIVEN_BACK.value
    ends = [c["choices"][0] for c in events[:-1] if c["choices"][0]["finish_reason"]]
    assert [(c["index"], c["finish_reason"]) for c in ends] == [(0, "stop")]  # its end stays sent
    request = TextRequest.objects.get()
    assert (request.state, request.ending) == (TextRequest.State.FAULTED, Ending.GIVEN_BACK)
    # The choice still running goes to no one: cancelled, and its worker told at its next post.
    told = third.progress("en")
    assert (told.status_code, told.json()["rc"]) == (409, "GenerationCancelled"), told.text
    assert Generation.objects.get(pk=third.id).state == Generation.State.CANCELLED
    assert request.kudos_spent > 0  # the choice that ended is charged; the hold is released
    assert not Hold.objects.filter(request_id=request.pk).exists()


def test_a_deadline_covers_every_choice_and_cancels_the_ones_not_done(live_stack, accounts):
    requester, owner = accounts
    first, slow, _ = _workers(live_stack.urls[0], owner.api_key)

    def serve() -> None:
        first.pop_job()
        assert first.submit("Red").status_code == 200  # one choice done in time
        slow.pop_job()  # the other popped, and never finished

    serving = Background(serve)
    sdk = openai.OpenAI(
        base_url=f"{live_stack.urls[0]}/v1",
        api_key=requester.api_key,
        max_retries=0,
        timeout=WAIT_SECONDS,
        default_headers={"X-MultiLLM-Deadline-Ms": "3000"},
    )
    with pytest.raises(openai.APIStatusError) as raised:
        sdk.chat.completions.create(model=MODEL, messages=MESSAGES, n=2, max_tokens=50)
    serving.result()
    assert (raised.value.status_code, raised.value.body["code"]) == (504, "generation_deadline_exceeded")
    request = TextRequest.objects.get()
    assert (request.state, request.ending) == (TextRequest.State.CANCELLED, Ending.DEADLINE)
    states = sorted(g.state for g in request.generations.all())
    assert states == [Generation.State.CANCELLED, Generation.State.DONE]
    told = slow.progress("late")
    assert (told.status_code, told.json()["rc"]) == (409, "GenerationCancelled")


def test_a_text_completion_of_n_2_is_two_legacy_jobs_answered_as_two_choices(live_stack, accounts):
    requester, owner = accounts
    http = httpx.Client(base_url=live_stack.urls[0], headers={"apikey": owner.api_key}, timeout=WAIT_SECONDS)
    pop = {"name": "scribe-like", "models": [MODEL], "max_length": 512, "max_context_length": 2048}
    assert http.post("/api/v2/generate/text/pop", json=pop).json()["id"] is None  # checked in
    replies = [" once.", " twice."]

    def serve() -> list[dict]:
        jobs = []
        for reply in replies:
            deadline = time.monotonic() + WAIT_SECONDS
            while (job := http.post("/api/v2/generate/text/pop", json=pop).json())["id"] is None:
                assert time.monotonic() < deadline, "no job came"
                time.sleep(0.05)
            assert "kind" not in job  # a legacy worker sees the AI Horde's shape
            answer = http.post("/api/v2/generate/text/submit", json={"id": job["id"], "generation": reply})
            assert answer.status_code == 200, answer.text
            jobs.append(job)
        return jobs

    serving = Background(serve)
    done = _sdk(live_stack.urls[0], requester.api_key).completions.create(
        model=MODEL, prompt="It happened", max_tokens=40, n=2
    )
    jobs = serving.result()
    assert len({job["id"] for job in jobs}) == 2
    assert [(c.index, c.text, c.finish_reason) for c in done.choices] == [
        (0, " once.", "stop"),
        (1, " twice.", "stop"),
    ]
    request = TextRequest.objects.get(pk=done.id.removeprefix("cmpl-"))
    assert (request.kind, request.n, request.state) == (TextRequest.Kind.TEXT, 2, TextRequest.State.DONE)
    assert done.usage.completion_tokens == sum(g.tokens for g in request.generations.all())
