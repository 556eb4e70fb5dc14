"""OpenAI-compatible model servers: llama.cpp's, vLLM, Ollama, LM Studio and the like."""

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx

from hordeops_bridge.backends.base import (
    Backend,
    BackendError,
    BackendInfo,
    Delta,
    short_name,
)
from hordeops_bridge.job import Request


class OpenAIBackend(Backend):
    """An OpenAI-compatible server: `/v1/chat/completions` for chats, `/v1/completions` for prompts."""

    kind = "openai"
    # llama-server and vLLM, then llama-cpp-python's server.
    TOKENIZERS = ("/tokenize", "/extras/tokenize")
    # Engines whose name `/v1/models` gives as `owned_by`, used as the model name's backend part.
    ENGINES = frozenset({"llamacpp", "vllm", "sglang", "tabbyapi", "aphrodite", "koboldcpp"})
    HONOURED = {
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "typical",
        "rep_pen",
        "frequency_penalty",
        "presence_penalty",
        "logit_bias",
        "singleline",
    }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.served = ""  # the model id the server itself uses, sent back in each request
        # How this server takes a JSON schema: OpenAI's `json_schema` (llama-server, vLLM,
        # Ollama), or `json_object` with a `schema` (llama-cpp-python's server, which refuses
        # the other). Found by the first job that asks: tried the first way, then the second.
        self.schema_style = ""

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
        length = None
        if not isinstance(context, int):
            # llama-server: the slot's context, and its reply limit when one was set (`-n`;
            # -1, unlimited, is none). llama-cpp-python's server says neither: it has no /props.
            props = await self._optional_get("/props")
            settings = props.get("default_generation_settings") if isinstance(props, dict) else None
            settings = settings if isinstance(settings, dict) else {}
            context = settings.get("n_ctx")
            params = settings.get("params") if isinstance(settings.get("params"), dict) else settings
            length = params.get("n_predict")  # under `params` in newer servers, beside n_ctx in older
        return BackendInfo(
            model=f"{engine}/{short_name(str(first['id']))}",
            max_length=_positive(length),
            max_context_length=_positive(context),
        )

    def _pick(self, models: list[dict[str, Any]]) -> dict[str, Any]:
        """The listed model named like `--model` (Ollama, LM Studio and TabbyAPI list all they
        have), else the first: a server that loads one model lists that one."""
        name = self.wanted.split("/", 1)[-1]
        for model in models:
            if name and name in (model["id"], short_name(str(model["id"]))):
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
        for name in ("frequency_penalty", "presence_penalty"):
            if sampling.get(name):
                body[name] = sampling[name]
        if sampling.get("logit_bias"):
            body["logit_bias"] = sampling["logit_bias"]  # token ids as strings, OpenAI's form
        stop = list(request.stop)
        if sampling.get("singleline") and "\n" not in stop:
            stop.append("\n")
        if stop:
            body["stop"] = stop
        if request.seed is not None:
            body["seed"] = request.seed
        if request.messages is not None:
            body["messages"] = [_content_given(message) for message in request.messages]
            body.update(self._agent(request.agent))
        else:
            body["prompt"] = request.prompt
        return body

    def _agent(self, agent: dict[str, Any]) -> dict[str, Any]:
        """An agent's fields as this server takes them: as sent, but for a JSON schema where
        the server wants the other form (`schema_style`), and `tool_choice` said: OpenAI's
        default with tools is `auto`, some servers' is `none`."""
        fields = dict(agent)
        if fields.get("tools") and "tool_choice" not in fields:
            fields["tool_choice"] = "auto"
        response_format = fields.get("response_format")
        if self.schema_style == "object" and response_format and response_format["type"] == "json_schema":
            schema = response_format["json_schema"].get("schema")
            fields["response_format"] = {"type": "json_object", **({"schema": schema} if schema else {})}
        return fields

    async def generate(self, request: Request, *, budget: int) -> AsyncIterator[Delta]:
        path = "/v1/chat/completions" if request.messages is not None else "/v1/completions"
        body = self.body(request, model=self.served or "default")
        tokens = 0
        finished = False
        try:
            async with self.http.stream("POST", path, json=body) as response:
                # llama-cpp-python's server answers 500 to a form it does not take.
                if response.status_code != 200 and self._other_schema_style(request):
                    await response.aread()
                    async for delta in self.generate(request, budget=budget):
                        yield delta
                    return
                if response.status_code != 200:
                    await response.aread()
                    raise BackendError(f"POST {path}: HTTP {response.status_code}")
                if (request.agent.get("response_format") or {}).get("type") == "json_schema":
                    self.schema_style = self.schema_style or "schema"
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
                    calls = _pieces((choice.get("delta") or {}).get("tool_calls"))
                    # One chunk a token, as these servers stream (an empty one holds part of a
                    # character); the closing chunk that only says why it finished is none.
                    if text or calls or (text is not None and not choice.get("finish_reason")):
                        tokens += 1
                    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
                        tokens = usage["completion_tokens"]
                    finished = finished or bool(choice.get("finish_reason"))
                    if text or calls or choice.get("finish_reason"):
                        yield Delta(text or "", tokens, choice.get("finish_reason"), calls)
        except httpx.TransportError as exc:
            raise BackendError(f"POST {path}: {type(exc).__name__}") from None
        if not finished:
            # Every OpenAI-compatible server ends a reply with a reason; a stream without one
            # was cut short (a server that drops a request for a newer one, for example).
            raise BackendError(f"POST {path}: the stream ended before the reply was finished")

    def _other_schema_style(self, request: Request) -> bool:
        """Whether a refused request asked for a JSON schema in the form this server has not
        been found to take: then the other form is the one (`schema_style`), tried again."""
        response_format = request.agent.get("response_format") or {}
        if self.schema_style or response_format.get("type") != "json_schema":
            return False
        self.schema_style = "object"
        return True


def _content_given(message: dict[str, Any]) -> dict[str, Any]:
    """An assistant's tool calls with "" for their null content: OpenAI takes either, and some
    servers (llama-cpp-python's) refuse null."""
    if message.get("content") is None and message.get("tool_calls"):
        return {**message, "content": ""}
    return message


def _pieces(value: Any) -> tuple[dict[str, Any], ...]:
    """A stream chunk's tool-call pieces, in the form the horde takes (`index`, and any of
    `id`, `function.name`, `function.arguments`)."""
    if not isinstance(value, list):
        return ()
    pieces = []
    for position, piece in enumerate(value):
        if not isinstance(piece, dict):
            continue
        index = piece.get("index")
        function = piece.get("function") if isinstance(piece.get("function"), dict) else {}
        out: dict[str, Any] = {"index": index if isinstance(index, int) and index >= 0 else position}
        if isinstance(piece.get("id"), str) and piece["id"]:
            out["id"] = piece["id"]
        named = {key: function[key] for key in ("name", "arguments") if isinstance(function.get(key), str)}
        if named:
            out["function"] = named
        pieces.append(out)
    return tuple(pieces)


def _positive(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
