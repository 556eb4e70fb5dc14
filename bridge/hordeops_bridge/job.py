"""A popped job, and what to ask the backend for it.

The payload is the AI Horde's KoboldAI parameters (`max_length`, `temperature`, `rep_pen`,
`stop_sequence`, ...) plus `prompt`, and for a chat job `messages` as the requester sent them.
"""

import json
from dataclasses import dataclass, field, replace
from typing import Any

# The horde counts a prompt it cannot tokenize at four characters a token; so does the bridge
# when the backend has no tokenizer route.
CHARS_PER_TOKEN = 4
# Fewer reply tokens than this left after the prompt: the job is refused rather than answered
# with a stub.
MIN_REPLY_TOKENS = 16


@dataclass(frozen=True)
class Job:
    id: str
    kind: str  # "chat" or "text"
    model: str
    payload: dict[str, Any]
    deadline_ms: int | None = None
    ttl: float | None = None
    cap_seconds: float | None = None
    streamed: bool = False  # a text job whose requester reads its output as it comes

    @classmethod
    def from_pop(cls, answer: dict[str, Any]) -> "Job":
        lease = answer.get("lease") or {}
        return cls(
            id=str(answer["id"]),
            kind=answer.get("kind") or "text",
            model=str(answer.get("model") or ""),
            payload=dict(answer.get("payload") or {}),
            deadline_ms=answer.get("deadline_ms"),
            ttl=answer.get("ttl"),
            cap_seconds=lease.get("cap_seconds"),
            streamed=answer.get("streamed") is True,
        )

    @property
    def is_chat(self) -> bool:
        return self.kind == "chat" and isinstance(self.payload.get("messages"), list)

    @property
    def posts_progress(self) -> bool:
        """Its output goes to the horde as it comes: a chat's, or a streamed text completion's."""
        return self.is_chat or self.streamed


@dataclass(frozen=True)
class Request:
    """What the backend is asked: a chat (`messages`) or a prompt, and the sampling."""

    max_tokens: int
    prompt: str = ""
    messages: list[dict[str, Any]] | None = None
    sampling: dict[str, Any] = field(default_factory=dict)  # the payload's knobs, as sent
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    fitted: str = ""  # how the context was made to fit, when it had to be ("" when it fitted)
    # An agent's fields, in OpenAI's form as the horde sends them: tools, tool_choice,
    # parallel_tool_calls, response_format (only to a worker that declared them).
    agent: dict[str, Any] = field(default_factory=dict)


class DoesNotFit(Exception):
    """The prompt leaves no room for a reply within the context."""


# The payload keys that are not sampling knobs.
AGENT = ("tools", "tool_choice", "parallel_tool_calls", "response_format")
NOT_SAMPLING = frozenset(
    {
        "prompt",
        "messages",
        "n",
        "max_length",
        "max_context_length",
        "stop_sequence",
        "seed",
        "sampler_seed",
        *AGENT,
    }
)


def request_for(job: Job) -> Request:
    """The backend request for `job`, before fitting: its reply length, chat or prompt, knobs."""
    payload = job.payload
    seed = payload.get("sampler_seed", payload.get("seed"))
    return Request(
        max_tokens=int(payload.get("max_length") or 80),
        prompt=str(payload.get("prompt") or ""),
        messages=[dict(message) for message in payload["messages"]] if job.is_chat else None,
        sampling={key: value for key, value in payload.items() if key not in NOT_SAMPLING},
        stop=list(payload.get("stop_sequence") or []),
        seed=int(seed) if isinstance(seed, int) and not isinstance(seed, bool) else None,
        agent={key: payload[key] for key in AGENT if payload.get(key) is not None} if job.is_chat else {},
    )


def context_budget(job: Job, *, context_limit: int) -> int:
    """Prompt plus reply tokens. A text job's `max_context_length` is the requester's own bound
    (KoboldAI's), kept within the backend's context. A chat job's, and a streamed text
    completion's, is the horde's estimate of the prompt at four characters a token plus the
    reply, not a bound anyone chose: the model's own context is the limit there."""
    if job.is_chat or job.streamed:
        return context_limit
    wanted = int(job.payload.get("max_context_length") or context_limit)
    return min(wanted, context_limit) if context_limit else wanted


# What a chat template adds around each message, in tokens, roughly (ChatML's markers).
TEMPLATE_TOKENS_PER_MESSAGE = 5
# Bounds no tokenizer passes: byte fallback spells an unknown byte as one token, and a space as
# the three bytes of SentencePiece's word mark; a template's markers, spelled out byte by byte.
MOST_TOKENS_PER_BYTE = 3
MOST_TEMPLATE_TOKENS_PER_MESSAGE = 64
MOST_FRAME_TOKENS = 64  # the start of text, the generation prompt


def surely_fits(request: Request, *, budget: int) -> bool:
    """Whether `request` fits in `budget` tokens whatever the tokenizer: then it needs no count,
    which costs a call to the backend (one that serves a request at a time queues it behind
    the replies it is generating)."""
    if request.messages is not None:
        # The whole of it, tool calls and tools too, which a template writes into the prompt.
        text = json.dumps([request.messages, request.sampling, request.agent], ensure_ascii=False)
        frames = len(request.messages)
    else:
        text, frames = request.prompt, 0
    most = MOST_TOKENS_PER_BYTE * len(text.encode()) + MOST_TEMPLATE_TOKENS_PER_MESSAGE * frames
    return most + MOST_FRAME_TOKENS + request.max_tokens <= budget


def _chat_text(messages: list[dict[str, Any]]) -> str:
    return "\n".join(str(message.get("content") or "") for message in messages)


async def _count_chat(messages: list[dict[str, Any]], count) -> int:
    return await count(_chat_text(messages)) + TEMPLATE_TOKENS_PER_MESSAGE * len(messages)


async def fit(request: Request, *, budget: int, count) -> Request:
    """`request` within `budget` tokens of prompt and reply, or DoesNotFit.

    A text prompt loses its start (as KoboldAI trims a story: the end is what the reply
    continues). A chat loses its oldest turns after any system or developer messages, never
    the last one. If the reply still does not fit, it is shortened, down to MIN_REPLY_TOKENS.
    `count(text)` is the backend's token count of a text, not asked when it surely fits.
    """
    if surely_fits(request, budget=budget):
        return request
    notes = []
    if request.messages is not None:
        messages = list(request.messages)
        used = await _count_chat(messages, count)
        dropped = 0
        while used + request.max_tokens > budget:
            droppable = [
                index
                for index, message in enumerate(messages[:-1])
                if message.get("role") not in ("system", "developer")
            ]
            if not droppable:
                break
            del messages[droppable[0]]
            dropped += 1
            used = await _count_chat(messages, count)
        if dropped:
            notes.append(f"dropped the {dropped} oldest messages")
        request = replace(request, messages=messages)
    else:
        used = await count(request.prompt)
        room = budget - request.max_tokens
        if used > room > 0:
            prompt, used = await _longest_end(request.prompt, room, count)
            notes.append(f"trimmed the prompt's start to {used} tokens")
            request = replace(request, prompt=prompt)
    max_tokens = request.max_tokens
    if used + max_tokens > budget:
        max_tokens = budget - used
        if max_tokens < MIN_REPLY_TOKENS:
            raise DoesNotFit(f"the prompt takes {used} of the {budget} tokens of context")
        notes.append(f"shortened the reply to {max_tokens} tokens")
    return replace(request, max_tokens=max_tokens, fitted="; ".join(notes))


async def _longest_end(prompt: str, room: int, count) -> tuple[str, int]:
    """The longest end of `prompt` that counts at most `room` tokens, and its count."""
    low, high, best = 0, len(prompt), ("", 0)
    while low <= high:
        middle = (low + high) // 2
        candidate = prompt[len(prompt) - middle :]
        used = await count(candidate) if middle else 0
        if used <= room:
            best, low = (candidate, used), middle + 1
        else:
            high = middle - 1
    return best


def estimate_tokens(text: str) -> int:
    return max(1, len(text) // CHARS_PER_TOKEN)
