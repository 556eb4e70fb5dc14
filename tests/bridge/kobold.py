"""A stand-in for KoboldCpp's KoboldAI API, for the bridge's tests: no registry these machines
reach ships KoboldCpp. It answers KoboldCpp's routes the way KoboldCpp does (the shapes
`../shared/reference` and KoboldCpp's own API page give) and generates each reply on the real
engine's `/v1/completions` stream, so the tokens, the stops and a stream that ends early are the
engine's. `/api/extra/abort` closes the engine stream of the generation with that `genkey`.

`streams=False` drops the `/api/extra/*` routes: the KoboldAI API as older servers give it,
which the bridge must serve with `/api/v1/generate`, whole.
"""

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

from tests.live import free_port

# KoboldAI's knobs and the engine's names for them (llama-cpp-python's server).
KNOBS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "typical": "typical_p",
    "rep_pen": "repeat_penalty",
    "sampler_seed": "seed",
    # KoboldCpp's API reads these two of OpenAI's under OpenAI's names (not frequency_penalty).
    "presence_penalty": "presence_penalty",
    "logit_bias": "logit_bias",
}


@dataclass
class KoboldStandIn:
    engine_url: str
    model: str = "koboldcpp/hordeops-tiny"
    context: int = 2048
    streams: bool = True
    received: list[dict[str, Any]] = field(default_factory=list)  # the generate bodies, in order
    aborted: list[str] = field(default_factory=list)  # the genkeys told to abort
    _running: dict[str, httpx.Response] = field(default_factory=dict)

    def start(self) -> "KoboldStandIn":
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), _handler(self))
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def engine_body(self, body: dict[str, Any], *, stream: bool) -> dict[str, Any]:
        engine = {
            "prompt": body.get("prompt", ""),
            "max_tokens": body.get("max_length", 100),
            "stream": stream,
        }
        engine.update({theirs: body[ours] for ours, theirs in KNOBS.items() if body.get(ours) is not None})
        if body.get("stop_sequence"):
            engine["stop"] = body["stop_sequence"]
        return engine

    def generate(self, body: dict[str, Any]):
        """The engine's (text, finish_reason) pieces for a KoboldAI generate body."""
        self.received.append(body)
        genkey = str(body.get("genkey") or "")
        with httpx.Client(base_url=self.engine_url, timeout=None) as client:
            with client.stream(
                "POST", "/v1/completions", json=self.engine_body(body, stream=True)
            ) as response:
                self._running[genkey] = response
                try:
                    for line in response.iter_lines():
                        if not line.startswith("data:") or "[DONE]" in line:
                            continue
                        choice = json.loads(line[5:])["choices"][0]
                        yield choice.get("text") or "", choice.get("finish_reason")
                except httpx.HTTPError:
                    return  # aborted: its stream was closed under it
                finally:
                    self._running.pop(genkey, None)

    def abort(self, genkey: str) -> bool:
        self.aborted.append(genkey)
        response = self._running.pop(genkey, None)
        if response is not None:
            response.close()
        return response is not None


def _handler(kobold: KoboldStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _json(self, status: int, value: Any) -> None:
            data = json.dumps(value).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> dict[str, Any]:
            return json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")

        def do_GET(self) -> None:
            extra = {
                "/api/extra/version": {"result": "KoboldCpp", "version": "1.80"},
                "/api/extra/true_max_context_length": {"value": kobold.context},
            }
            routes = {
                "/api/v1/model": {"result": kobold.model},
                "/api/v1/config/max_length": {"value": 512},
                "/api/v1/config/max_context_length": {"value": kobold.context},
                **(extra if kobold.streams else {}),
            }
            if self.path in routes:
                self._json(200, routes[self.path])
            else:
                self._json(404, {"detail": "Not Found"})

        def do_POST(self) -> None:
            body = self._body()
            if self.path == "/api/v1/generate":
                text, finish = "", "length"
                for piece, reason in kobold.generate(body):
                    text += piece
                    finish = reason or finish
                self._json(200, {"results": [{"text": text, "finish_reason": finish}]})
            elif self.path == "/api/extra/generate/stream" and kobold.streams:
                self._stream(body)
            elif self.path == "/api/extra/abort" and kobold.streams:
                self._json(200, {"success": kobold.abort(str(body.get("genkey") or ""))})
            elif self.path == "/api/extra/tokencount" and kobold.streams:
                with httpx.Client(base_url=kobold.engine_url) as client:
                    tokens = client.post("/extras/tokenize", json={"input": body.get("prompt", "")}).json()
                ids = tokens["tokens"][1:]  # KoboldCpp counts without the BOS token
                self._json(200, {"value": len(ids), "ids": ids})
            else:
                self._json(404, {"detail": "Not Found"})

        def _stream(self, body: dict[str, Any]) -> None:
            # KoboldCpp's SSE: `event: message` with `data: {"token": ..., "finish_reason": ...}`.
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            try:
                for piece, reason in kobold.generate(body):
                    event = {"token": piece, "finish_reason": reason}
                    self.wfile.write(f"event: message\ndata: {json.dumps(event)}\n\n".encode())
                    self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                pass  # the bridge left; KoboldCpp goes on until told to abort, which the bridge does

    return Handler
