"""The KoboldAI API (KoboldCpp): its stream route when it has one, else whole replies."""

import json
import secrets
from collections.abc import AsyncIterator
from typing import Any

import httpx

from hordeops_bridge.backends.base import (
    NEUTRAL,
    Backend,
    BackendError,
    BackendInfo,
    Delta,
)
from hordeops_bridge.job import Request


class KoboldBackend(Backend):
    """The KoboldAI API: `/api/v1/generate`, and KoboldCpp's `/api/extra/generate/stream`."""

    kind = "kobold"
    TOKENIZERS = ("/api/extra/tokencount",)
    # The payload is KoboldAI's own: every knob goes as it came. KoboldCpp also reads OpenAI's
    # `presence_penalty` and `logit_bias` there, but no `frequency_penalty`.
    HONOURED = set(NEUTRAL) - {
        "frmtadsnsp",
        "frmtrmblln",
        "frmtrmspch",
        "frmttriminc",
        "singleline",
        "frequency_penalty",
    }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._streams: bool | None = None

    async def describe(self) -> BackendInfo:
        model = await self._get("/api/v1/model")
        name = model.get("result") if isinstance(model, dict) else None
        if not name or name == "ReadOnly":
            raise BackendError("GET /api/v1/model: no model is loaded")
        name = str(name)
        if "/" not in name:
            name = f"koboldcpp/{name}"
        context = await self._optional_get("/api/extra/true_max_context_length")
        if not isinstance(context, dict):
            context = await self._optional_get("/api/v1/config/max_context_length")
        self._streams = await self._optional_get("/api/extra/version") is not None
        # No reply limit: `/api/v1/config/max_length` is the amount a request gets when it names
        # none (KoboldCpp's --defaultgenamt, KoboldAI's slider), and any up to the context is
        # honoured. Declaring it would turn away KoboldAI Lite's 768 from a server left at 512.
        return BackendInfo(model=name, max_length=None, max_context_length=_value(context))

    def body(self, request: Request, *, budget: int, genkey: str) -> dict[str, Any]:
        sampling = request.sampling
        self.note_not_honoured(sampling, self.HONOURED)
        # A chat goes as its ChatML rendering: the KoboldAI API takes prompts only.
        body = {**sampling, "prompt": request.prompt, "max_length": request.max_tokens}
        body.update({"max_context_length": budget, "genkey": genkey, "n": 1})
        if request.stop:
            body["stop_sequence"] = request.stop
        if request.seed is not None:
            body["sampler_seed"] = request.seed
        return body

    async def generate(self, request: Request, *, budget: int) -> AsyncIterator[Delta]:
        if self._streams is None:
            await self.describe()
        genkey = f"KCPP{secrets.token_hex(4)}"
        body = self.body(request, budget=budget, genkey=genkey)
        finished = False
        try:
            if self._streams:
                async for delta in self._stream(body):
                    yield delta
            else:
                yield await self._whole(body)
            finished = True
        except httpx.TransportError as exc:
            raise BackendError(f"the KoboldAI API: {type(exc).__name__}") from None
        finally:
            if not finished:
                await self._abort(genkey)

    async def _stream(self, body: dict[str, Any]) -> AsyncIterator[Delta]:
        tokens = 0
        async with self.http.stream("POST", "/api/extra/generate/stream", json=body) as response:
            if response.status_code != 200:
                await response.aread()
                raise BackendError(f"POST /api/extra/generate/stream: HTTP {response.status_code}")
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                try:
                    event = json.loads(line[len("data:") :])
                except ValueError:
                    raise BackendError("POST /api/extra/generate/stream: an event is not JSON") from None
                token = event.get("token")
                if token:
                    tokens += 1
                if token or event.get("finish_reason"):
                    yield Delta(token or "", tokens, event.get("finish_reason"))

    async def _whole(self, body: dict[str, Any]) -> Delta:
        response = await self.http.post("/api/v1/generate", json=body)
        if response.status_code != 200:
            raise BackendError(f"POST /api/v1/generate: HTTP {response.status_code}")
        try:
            result = response.json()["results"][0]
        except (ValueError, KeyError, IndexError, TypeError):
            raise BackendError("POST /api/v1/generate: no result") from None
        text = str(result.get("text") or "")
        return Delta(text, await self.count_tokens(text) if text else 0, result.get("finish_reason"))

    async def _abort(self, genkey: str) -> None:
        """Tell KoboldCpp to stop: it may go on generating after its client left."""
        try:
            await self.http.post("/api/extra/abort", json={"genkey": genkey}, timeout=5)
        except httpx.HTTPError:
            pass  # the server is gone or has no abort route: nothing more to do


def _value(answer: Any) -> int | None:
    value = answer.get("value") if isinstance(answer, dict) else None
    return value if isinstance(value, int) and value > 0 else None
