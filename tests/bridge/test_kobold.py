"""The bridge in front of the KoboldAI API that horde volunteers run today (KoboldCpp), through
a stand-in whose replies come from the real engine: chats stream from
`/api/extra/generate/stream`, the job's knobs reach the API as KoboldAI names them, a stopped
job is aborted by its `genkey`, and a server without the streaming routes is served whole."""

import time

import httpx
import pytest

from tests.bridge.conftest import engine_stopped, first_content, sse_data, until
from tests.bridge.kobold import KoboldStandIn

pytestmark = pytest.mark.timeout(240)
# Less than the engine's own 2048: the pop must declare what the API reports.
KOBOLD_CONTEXT = 1536
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello."}]


@pytest.fixture
def kobold(engine, request):
    # A model of its own: the module's other bridges, stopped but online for a while, would
    # otherwise be offered its jobs first (the speed gate).
    model = f"koboldcpp/hordeops-{request.node.name[7:22]}"
    stand_in = KoboldStandIn(engine.url, model=model, context=KOBOLD_CONTEXT).start()
    yield stand_in
    stand_in.stop()


def _kobold_bridge(stack, kobold, accounts, run_bridge, name: str, *args: str):
    """The bridge on the KoboldAI API, its lengths as the API reports them."""
    bridge = run_bridge(
        "--horde_url", stack.url, f"--api_key={accounts['owner']}", "--worker_name", name,
        "--backend", "kobold", "--backend_url", kobold.url, *args,
    )  # fmt: skip
    bridge.wait_for(rf"serving \S+ as {name}")
    until(lambda: httpx.get(f"{stack.url}/api/v2/workers/name/{name}").status_code == 200)
    return bridge


def _direct(engine, prompt: str, max_tokens: int) -> str:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    return httpx.post(f"{engine.url}/v1/completions", json=body, timeout=60).json()["choices"][0]["text"]


def _chat(stack, key: str, max_tokens: int, model: str):
    body = {
        "model": model,
        "messages": MESSAGES,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }
    return httpx.stream(
        "POST", f"{stack.url}/v1/chat/completions", json=body,
        headers={"Authorization": f"Bearer {key}"}, timeout=60,
    )  # fmt: skip


def test_a_chat_streams_from_the_kobold_stream_route_and_the_pop_declares_its_context(
    stack, engine, kobold, accounts, run_bridge
) -> None:
    bridge = _kobold_bridge(stack, kobold, accounts, run_bridge, "kobold-bridge")
    bridge.wait_for(
        rf"serving {kobold.model} as kobold-bridge .*max_length 768 \(the bridge's default\), "
        rf"max_context_length {KOBOLD_CONTEXT} \(the backend's\)"
    )
    worker = httpx.get(f"{stack.url}/api/v2/workers/name/kobold-bridge").json()
    # Its max_length (512) is a default, not a limit: the bridge's own, half the context.
    assert (worker["max_length"], worker["max_context_length"]) == (KOBOLD_CONTEXT // 2, KOBOLD_CONTEXT)

    with _chat(stack, accounts["requester"], 64, kobold.model) as response:
        assert response.status_code == 200, response.read()
        chunks = sse_data(response)
    pieces = [c["choices"][0]["delta"].get("content") for c in chunks if c["choices"]]
    pieces = [piece for piece in pieces if piece]
    (body,) = kobold.received
    # The chat went as the horde's rendering of it; the reply is the engine's to that prompt.
    assert "Say hello." in body["prompt"] and body["max_length"] == 64 and body["temperature"] == 0
    assert "".join(pieces) == _direct(engine, body["prompt"], 64)
    assert len(pieces) >= 3
    bridge.wait_for(rf"job \S+ \(chat, {kobold.model}\): submitted, 64 tokens")


def test_a_horde_text_jobs_knobs_reach_the_kobold_api_as_sent(stack, engine, kobold, accounts, run_bridge):
    _kobold_bridge(stack, kobold, accounts, run_bridge, "knobs-bridge")
    params = {
        "max_length": 40, "max_context_length": 1024, "temperature": 0.7, "top_p": 0.9, "top_k": 30,
        "min_p": 0.05, "typical": 0.95, "rep_pen": 1.1, "rep_pen_range": 320, "sampler_seed": 77,
        "stop_sequence": ["\n\n", "###"],
    }  # fmt: skip
    body = {"prompt": "A knobs test", "params": params, "models": [kobold.model]}
    headers = {"apikey": accounts["requester"]}
    queued = httpx.post(f"{stack.url}/api/v2/generate/text/async", json=body, headers=headers)
    assert queued.status_code == 202, queued.text
    status_url = f"{stack.url}/api/v2/generate/text/status/{queued.json()['id']}"
    until(lambda: httpx.get(status_url).json()["done"], timeout=60)

    (sent,) = kobold.received
    for key in (
        "max_length",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "typical",
        "rep_pen",
        "rep_pen_range",
    ):
        assert sent[key] == params[key], key
    assert sent["stop_sequence"] == ["\n\n", "###"] and sent["sampler_seed"] == 77
    assert sent["max_context_length"] == 1024 and sent["prompt"] == "A knobs test"
    text = httpx.get(status_url).json()["generations"][0]["text"]
    assert text and "###" not in text


def test_openais_penalties_and_bias_reach_kobold_as_it_reads_them_and_the_rest_is_logged_once(
    stack, engine, kobold, accounts, run_bridge
):
    bridge = _kobold_bridge(stack, kobold, accounts, run_bridge, "penalties-bridge")
    knobs = {"temperature": 0, "presence_penalty": 1.5, "frequency_penalty": 0.5, "logit_bias": {"45": -100}}
    headers = {"Authorization": f"Bearer {accounts['requester']}"}
    for _ in range(2):
        body = {"model": kobold.model, "prompt": "A penalty test", "max_tokens": 24, **knobs}
        answer = httpx.post(f"{stack.url}/v1/completions", json=body, headers=headers, timeout=60)
        assert answer.status_code == 200, answer.text
    first, second = kobold.received
    for sent in (first, second):
        assert (sent["presence_penalty"], sent["logit_bias"]) == (1.5, {"45": -100})
    # KoboldCpp has no frequency_penalty: said once in the bridge's run, not once a job.
    bridge.wait_for(r"job \S+ \(text, .*\): submitted")
    assert bridge.output().count("cannot honour frequency_penalty") == 1


def test_a_delete_aborts_the_kobold_generation_by_its_genkey(stack, engine, kobold, accounts, run_bridge):
    bridge = _kobold_bridge(stack, kobold, accounts, run_bridge, "aborting-bridge", "--max_length", "1800")
    disconnects = engine.disconnects()
    # Long enough to be running when deleted, and within the 1536 tokens of context.
    with _chat(stack, accounts["requester"], 1300, kobold.model) as response:
        lines = response.iter_lines()
        request_id = first_content(lines)["id"].removeprefix("chatcmpl-")
        assert httpx.delete(f"{stack.url}/api/v2/generate/text/status/{request_id}").status_code == 200
        rest = "\n".join(lines)
    assert '"error"' in rest
    (body,) = kobold.received
    until(lambda: kobold.aborted == [body["genkey"]], timeout=5, message=f"aborted: {kobold.aborted}")
    engine_stopped(engine, disconnects)
    bridge.wait_for(r"job \S+ \(chat, .*\): lost, .*GenerationCancelled")


def test_a_kobold_api_without_streaming_is_served_whole(stack, engine, accounts, run_bridge) -> None:
    kobold = KoboldStandIn(engine.url, model="koboldcpp/hordeops-whole", streams=False).start()
    try:
        bridge = _kobold_bridge(stack, kobold, accounts, run_bridge, "whole-bridge")
        # Without `true_max_context_length`, the context is the API's own setting.
        bridge.wait_for(r"serving \S+ as whole-bridge .*max_context_length 2048")
        started = time.monotonic()
        with _chat(stack, accounts["requester"], 48, kobold.model) as response:
            assert response.status_code == 200, response.read()
            chunks = sse_data(response)
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        (body,) = kobold.received
        assert text == _direct(engine, body["prompt"], 48)
        assert time.monotonic() - started < 30
        # Without a token count route, the reply's tokens are estimated at 4 characters each.
        bridge.wait_for(rf"job \S+ \(chat, .*\): submitted, {max(1, len(text) // 4)} tokens")
    finally:
        kobold.stop()
