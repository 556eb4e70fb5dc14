"""What every backend shares: the stream of `Delta`s, what a server says of itself, and
which sampling knobs it honours."""

import logging
import os
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
    # Pieces of tool calls, OpenAI's stream form: `{"index", "id", "function": {"name", "arguments"}}`.
    tool_calls: tuple[dict[str, Any], ...] = ()


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
    # OpenAI's penalties and token biases, which the horde carries under OpenAI's names.
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "logit_bias": {},
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


def short_name(model_id: str) -> str:
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
