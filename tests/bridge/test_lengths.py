"""What the bridge declares at its pop when the volunteer sets no lengths: the reply and context
limits its model server reports, where each kind of server reports them (llama-server's
`/props`, vLLM's `max_model_len`, KoboldCpp's true context), else a reply of 1024 tokens within
half of a 2048-token context; never a reply longer than the context.

The servers here are stand-ins that answer only the routes `describe()` reads, in each server's
own shape: the bridge's reading of them is what is tested. The real engine's (llama-cpp-python,
which reports no limit) is in `test_serving.py`."""

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from hordeops_bridge.backends import backend_for
from hordeops_bridge.config import lengths, load
from tests.bridge.kobold import KoboldStandIn
from tests.live import free_port

DEFAULT, BACKEND = "the bridge's default", "the backend's"
MODELS = {"object": "list", "data": [{"id": "/models/tiny.gguf", "object": "model", "owned_by": "llamacpp"}]}


class ModelServer:
    """A model server that answers each GET path in `answers` with its JSON, and 404 otherwise."""

    def __init__(self, answers: dict[str, Any]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                found = self.path in answers
                data = json.dumps(answers[self.path] if found else {"error": "not found"}).encode()
                self.send_response(200 if found else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def serve() -> Iterator:
    started: list[ModelServer] = []

    def start(answers: dict[str, Any]) -> ModelServer:
        started.append(ModelServer(answers))
        return started[-1]

    yield start
    for server in started:
        server.stop()


def _declared(backend: str, url: str, *args: str) -> tuple[str, int, int, str]:
    """The model, lengths and the reply length's source the bridge declares for this server."""
    config = load(["-a", "k", "-n", "w", "--backend", backend, "--backend_url", url, *args], environ={})

    async def describe():
        server = backend_for(config.backend, config.backend_url)
        try:
            return await server.describe()
        finally:
            await server.aclose()

    info = asyncio.run(describe())
    declared = lengths(config, info.max_length, info.max_context_length)
    return info.model, declared.max_length, declared.max_context_length, declared.length_from


@pytest.mark.parametrize(
    ("props", "declared"),
    [
        # llama-server without -n: its slot's context, no reply limit (-1).
        (
            {"default_generation_settings": {"n_ctx": 8192, "params": {"n_predict": -1}}},
            (1024, 8192, DEFAULT),
        ),
        # with -n 600, as newer servers nest it under params, and as older ones put it beside n_ctx.
        (
            {"default_generation_settings": {"n_ctx": 8192, "params": {"n_predict": 600}}},
            (600, 8192, BACKEND),
        ),
        ({"default_generation_settings": {"n_ctx": 4096, "n_predict": 700}}, (700, 4096, BACKEND)),
        # a small context: the default reply takes half of it, and a reported one no more than all.
        ({"default_generation_settings": {"n_ctx": 1200, "params": {"n_predict": -1}}}, (600, 1200, DEFAULT)),
        (
            {"default_generation_settings": {"n_ctx": 512, "params": {"n_predict": 4096}}},
            (512, 512, f"{BACKEND}, cut to the context"),
        ),
    ],
)
def test_a_llama_server_is_described_by_its_props(serve, props, declared) -> None:
    server = serve({"/v1/models": MODELS, "/props": props})
    model, length, context, source = _declared("openai", server.url)
    assert model == "llamacpp/tiny"
    assert (length, context, source) == declared


def test_vllms_max_model_len_is_the_context_and_the_default_reply_fits_in_half_of_it(serve) -> None:
    listing = {"data": [{"id": "Qwen/Qwen2.5-1.5B-Instruct", "owned_by": "vllm", "max_model_len": 1536}]}
    server = serve({"/v1/models": listing})
    # 768, KoboldAI Lite's ask, is still served by a context this small.
    assert _declared("openai", server.url) == (
        "vllm/Qwen2.5-1.5B-Instruct",
        768,
        1536,
        "the bridge's default",
    )


def test_a_server_that_reports_no_limit_gets_a_1024_token_reply_in_a_2048_token_context(serve) -> None:
    # llama-cpp-python's server: `owned_by: "me"`, no /props.
    listing = {"data": [{"id": "/models/tiny.gguf", "object": "model", "owned_by": "me", "permissions": []}]}
    server = serve({"/v1/models": listing})
    assert _declared("openai", server.url) == ("openai/tiny", 1024, 2048, "the bridge's default")
    # The volunteer's settings win over every default.
    assert _declared("openai", server.url, "--max_length", "300") == ("openai/tiny", 300, 2048, "set")


def test_koboldcpp_is_described_by_its_true_context_and_its_default_amount_is_no_limit() -> None:
    # The stand-in reports a max_length of 512: KoboldCpp's default amount, which a request may
    # exceed up to the context. The reply declared is the bridge's default, within the context.
    kobold = KoboldStandIn("http://127.0.0.1:9", model="koboldcpp/tiny", context=1600).start()
    try:
        assert _declared("kobold", kobold.url) == ("koboldcpp/tiny", 800, 1600, "the bridge's default")
    finally:
        kobold.stop()
