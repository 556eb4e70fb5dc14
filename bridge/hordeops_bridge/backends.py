"""The model servers the bridge drives: OpenAI-compatible ones and the KoboldAI API.

Each backend streams a reply as `Delta`s. Leaving the stream (the job was cancelled, its lease
lapsed, its deadline passed) closes the HTTP response, which is how an OpenAI-compatible server
learns that nobody reads any more and stops generating; KoboldCpp is also told to abort.
"""

import json
import logging
import os
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx

from hordeops_bridge.job import Request, estimate_tokens

log = logging.getLogger("hordeops_bridge.backend")


class _NoAnswer(Exception):
    """The backend did not answer a token count: no connection, or not in time."""


class BackendError(Exception):
    """The backend failed a job or cannot be reached: the job goes back to the horde."""


@dataclass(frozen=True)
class Delta:
    text: str
    tokens: int  # the backend's running count of generated tokens
    finish_reason: str | None = None


@dataclass(frozen=True)
class BackendInfo:
    model: str  # in the AI Horde's `backend/Model` form
    max_length: int | None  # the longest reply the backend allows, when it says
    max_context_length: int | None  # its context, when it says


# What a knob is when it does nothing: a payload value equal to it needs no honouring.
NEUTRAL = {
    "temperature": None,
    "top_p": 1.0,
    "top_k": 0,
    "top_a": 0.0,
    "tfs": 1.0,
    "typical": 1.0,
    "min_p": 0.0,
    "rep_pen": 1.0,
    "rep_pen_range": None,
    "rep_pen_slope": None,
    "smoothing_factor": 0.0,
    "dynatemp_range": 0.0,
    "dynatemp_exponent": 1.0,
    "sampler_order": None,
    "use_default_badwordsids": False,
    "frmtadsnsp": False,
    "frmtrmblln": False,
    "frmtrmspch": False,
    "frmttriminc": False,
    "singleline": False,
}
# Knobs that only qualify another one: without it (rep_pen at 1), nothing is lost.
QUALIFIERS = {"rep_pen_range": "rep_pen", "rep_pen_slope": "rep_pen", "sampler_order": None}


def _root(url: str) -> str:
    """The server's root, whether the volunteer gave it with `/v1` or without."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def _short_name(model_id: str) -> str:
    """A served file's or repository's name, as the horde lists models: no folders, no `.gguf`."""
    name = os.path.basename(model_id.rstrip("/")) or model_id
    return name[: -len(".gguf")] if name.lower().endswith(".gguf") else name


# Seconds a short request (a model listing) may take: a backend that answers
# nothing in that time is down, and a health check must not hang on a half-dead connection.
QUICK_SECONDS = 10.0
# A token count may wait behind generation on a server that does one thing at a time
# (llama-cpp-python's): longer than that, and the job goes on with the estimate.
COUNT_SECONDS = 30.0


class Backend:
    kind = ""

    def __init__(
        self,
        url: str,
        *,
        api_key: str = "",
        wanted: str = "",
        transport: httpx.AsyncBaseTransport | None = None,
    ):
        # The model the volunteer asked for (`--model`), where a server offers several.
        self.wanted = wanted
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # No read timeout: a big model may take minutes to process a long prompt before its first
        # token; the job's own bounds (lease, deadline) end a stream that waits too long.
        self.http = httpx.AsyncClient(
            base_url=_root(url),
            headers=headers,
            timeout=httpx.Timeout(None, connect=10.0),
            transport=transport,
        )
        self._tokenizer: str | None = None  # the tokenizer route found, "" when none
        self._not_honoured: set[str] = set()

    async def aclose(self) -> None:
        await self.http.aclose()

    async def describe(self) -> BackendInfo:
        raise NotImplementedError

    def generate(self, request: Request, *, budget: int) -> AsyncIterator[Delta]:
        """Stream the reply; `budget` is the context (prompt and reply tokens) the job may use."""
        raise NotImplementedError

    async def healthy(self) -> bool:
        try:
            await self.describe()
        except BackendError:
            return False
        return True

    async def _get(self, path: str) -> Any:
        try:
            response = await self.http.get(path, timeout=QUICK_SECONDS)
        except httpx.TransportError as exc:
            raise BackendError(f"GET {path}: {type(exc).__name__}") from None
        if response.status_code != 200:
            raise BackendError(f"GET {path}: HTTP {response.status_code}")
        try:
            return response.json()
        except ValueError:
            raise BackendError(f"GET {path}: not JSON") from None

    async def _optional_get(self, path: str) -> Any:
        try:
            return await self._get(path)
        except BackendError:
            return None

    def note_not_honoured(self, sampling: dict[str, Any], honoured: set[str]) -> None:
        """Log, once per knob, a payload knob set to something this backend cannot do."""
        for key, value in sampling.items():
            if key in honoured or key in self._not_honoured or value is None:
                continue
            if key in NEUTRAL and value == NEUTRAL[key]:
                continue
            if key in QUALIFIERS:
                base = QUALIFIERS[key]
                if base is None or base in honoured or sampling.get(base) in (None, NEUTRAL[base]):
                    continue
            self._not_honoured.add(key)
            log.warning(
                "the %s backend cannot honour %s; jobs that set it are generated without it", self.kind, key
            )

    async def count_tokens(self, text: str) -> int:
        """The backend's own token count of `text`, or the horde's estimate when it has no
        tokenizer route or does not answer in time (a busy server may queue the count)."""
        try:
            if self._tokenizer is None:
                self._tokenizer = await self._find_tokenizer()
            if self._tokenizer:
                counted = await self._tokenize(self._tokenizer, text)
                if counted is not None:
                    return counted
        except _NoAnswer:
            pass
        return estimate_tokens(text)

    async def _find_tokenizer(self) -> str:
        """The first tokenizer route that counts; "" when none does (a server that does not
        answer raises _NoAnswer, and is asked again next time)."""
        for path in self.TOKENIZERS:
            if await self._tokenize(path, "hello") is not None:
                return path
        log.info(
            "the %s backend has no tokenizer route; prompts are counted at 4 characters a token", self.kind
        )
        return ""

    TOKENIZERS: tuple[str, ...] = ()

    async def _tokenize(self, path: str, text: str) -> int | None:
        """The count `path` gives for `text`, None if it gives none (no such route)."""
        try:
            response = await self.http.post(
                path, json={"content": text, "prompt": text, "input": text}, timeout=COUNT_SECONDS
            )
        except httpx.TransportError:
            raise _NoAnswer() from None
        try:
            body = response.json() if response.status_code == 200 else None
        except ValueError:
            return None
        if not isinstance(body, dict):
            return None
        for key in ("count", "value"):
            if isinstance(body.get(key), int):
                return body[key]
        return len(body["tokens"]) if isinstance(body.get("tokens"), list) else None


class OpenAIBackend(Backend):
    """An OpenAI-compatible server: `/v1/chat/completions` for chats, `/v1/completions` for prompts."""

    kind = "openai"
    # llama-server and vLLM, then llama-cpp-python's server.
    TOKENIZERS = ("/tokenize", "/extras/tokenize")
    # Engines whose name `/v1/models` gives as `owned_by`, used as the model name's backend part.
    ENGINES = frozenset({"llamacpp", "vllm", "sglang", "tabbyapi", "aphrodite", "koboldcpp"})
    HONOURED = {"temperature", "top_p", "top_k", "min_p", "typical", "rep_pen", "singleline"}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.served = ""  # the model id the server itself uses, sent back in each request

    async def describe(self) -> BackendInfo:
        listing = await self._get("/v1/models")
        models = listing.get("data") if isinstance(listing, dict) else None
        if not models or not isinstance(models[0], dict) or not models[0].get("id"):
            raise BackendError("GET /v1/models: no model is served")
        first = self._pick([model for model in models if isinstance(model, dict) and model.get("id")])
        self.served = str(first["id"])
        owner = str(first.get("owned_by") or "")
        engine = owner if owner in self.ENGINES else "openai"
        context = first.get("max_model_len")  # vLLM, SGLang
        if not isinstance(context, int):
            props = await self._optional_get("/props")  # llama-server
            settings = props.get("default_generation_settings") if isinstance(props, dict) else None
            context = settings.get("n_ctx") if isinstance(settings, dict) else None
        return BackendInfo(
            model=f"{engine}/{_short_name(str(first['id']))}",
            max_length=None,
            max_context_length=context if isinstance(context, int) and context > 0 else None,
        )

    def _pick(self, models: list[dict[str, Any]]) -> dict[str, Any]:
        """The listed model named like `--model` (Ollama, LM Studio and TabbyAPI list all they
        have), else the first: a server that loads one model lists that one."""
        name = self.wanted.split("/", 1)[-1]
        for model in models:
            if name and name in (model["id"], _short_name(str(model["id"]))):
                return model
        return models[0]

    def body(self, request: Request, *, model: str) -> dict[str, Any]:
        sampling = request.sampling
        self.note_not_honoured(sampling, self.HONOURED)
        body: dict[str, Any] = {"model": model, "max_tokens": request.max_tokens, "stream": True}
        body["stream_options"] = {"include_usage": True}
        if sampling.get("temperature") is not None:
            body["temperature"] = sampling["temperature"]
        if sampling.get("top_p") is not None:
            body["top_p"] = sampling["top_p"]
        if sampling.get("top_k"):
            body["top_k"] = sampling["top_k"]
        if sampling.get("min_p"):
            body["min_p"] = sampling["min_p"]
        if sampling.get("typical") not in (None, 1.0):
            body["typical_p"] = sampling["typical"]
        if sampling.get("rep_pen") not in (None, 1.0):
            # vLLM, SGLang and TabbyAPI read the first, the llama.cpp servers the second.
            body["repetition_penalty"] = body["repeat_penalty"] = sampling["rep_pen"]
        stop = list(request.stop)
        if sampling.get("singleline") and "\n" not in stop:
            stop.append("\n")
        if stop:
            body["stop"] = stop
        if request.seed is not None:
            body["seed"] = request.seed
        if request.messages is not None:
            body["messages"] = request.messages
        else:
            body["prompt"] = request.prompt
        return body

    async def generate(self, request: Request, *, budget: int) -> AsyncIterator[Delta]:
        path = "/v1/chat/completions" if request.messages is not None else "/v1/completions"
        body = self.body(request, model=self.served or "default")
        tokens = 0
        finished = False
        try:
            async with self.http.stream("POST", path, json=body) as response:
                if response.status_code != 200:
                    await response.aread()
                    raise BackendError(f"POST {path}: HTTP {response.status_code}")
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[len("data:") :].strip()
                    if data == "[DONE]":
                        break
                    try:
                        chunk = json.loads(data)
                    except ValueError:
                        raise BackendError(f"POST {path}: a stream chunk is not JSON") from None
                    if chunk.get("error"):
                        raise BackendError(f"POST {path}: the stream ended with an error")
                    usage = chunk.get("usage")
                    choices = chunk.get("choices") or []
                    if not choices:
                        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
                            yield Delta("", usage["completion_tokens"])
                        continue
                    choice = choices[0]
                    text = (
                        (choice.get("delta") or {}).get("content")
                        if "delta" in choice
                        else choice.get("text")
                    )
                    # One chunk a token, as these servers stream (an empty one holds part of a
                    # character); the closing chunk that only says why it finished is none.
                    if text or (text is not None and not choice.get("finish_reason")):
                        tokens += 1
                    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
                        tokens = usage["completion_tokens"]
                    finished = finished or bool(choice.get("finish_reason"))
                    if text or choice.get("finish_reason"):
                        yield Delta(text or "", tokens, choice.get("finish_reason"))
        except httpx.TransportError as exc:
            raise BackendError(f"POST {path}: {type(exc).__name__}") from None
        if not finished:
            # Every OpenAI-compatible server ends a reply with a reason; a stream without one
            # was cut short (a server that drops a request for a newer one, for example).
            raise BackendError(f"POST {path}: the stream ended before the reply was finished")


class KoboldBackend(Backend):
    """The KoboldAI API: `/api/v1/generate`, and KoboldCpp's `/api/extra/generate/stream`."""

    kind = "kobold"
    TOKENIZERS = ("/api/extra/tokencount",)
    # The payload is KoboldAI's own: every knob goes as it came.
    HONOURED = set(NEUTRAL) - {"frmtadsnsp", "frmtrmblln", "frmtrmspch", "frmttriminc", "singleline"}

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
        length = await self._optional_get("/api/v1/config/max_length")
        self._streams = await self._optional_get("/api/extra/version") is not None
        return BackendInfo(
            model=name,
            max_length=_value(length),
            max_context_length=_value(context),
        )

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


def backend_for(
    kind: str,
    url: str,
    *,
    api_key: str = "",
    wanted: str = "",
    transport: httpx.AsyncBaseTransport | None = None,
) -> Backend:
    cls = {"openai": OpenAIBackend, "kobold": KoboldBackend}[kind]
    return cls(url, api_key=api_key, wanted=wanted, transport=transport)
