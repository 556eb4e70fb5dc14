"""Following one chat request's relay stream for its requester: preflight and commitment.

The follower reads the request's Redis relay stream (never polling the database). Its
request wants `n` replies (choices), a job each, which any workers serve; each relay event
names its generation, and the follower gives each generation a choice index, 0 to n-1, in the
order their outputs reach it. Streamed, it commits a generation to its choice when it first
delivers output: the stream's first, only once that output is useful (text that is not only
white space: the preflight); a later one at its first output. From then on that generation's
output is its choice's, and its abort faults the request (no fallback after commit).
"""

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from hordeops import asyncdb, errors
from jobs import relay, relay_hub, services
from jobs.models import Ending


@dataclass(frozen=True)
class Output:
    """The next thing the requester must be told."""

    kind: str  # delta, done or failed
    text: str = ""
    tokens: int = 0
    kudos: float = 0.0
    finish_reason: str = "stop"
    ending: Ending = Ending.NONE  # why a failed request ended
    model: str = ""  # the model that serves it, once known (a fallback's, maybe)
    index: int = 0  # the choice a delta or a done belongs to
    final: bool = False  # nothing follows: every choice is done, or the request failed
    # Done: the reply's tool calls (`jobs.protocols.agents`); a delta: its pieces of them
    # (`{"index", "id", "function": {"name", "arguments"}}`, OpenAI's stream form).
    tool_calls: tuple[dict[str, Any], ...] = ()


def _calls(event: relay.Event) -> tuple[dict[str, Any], ...]:
    """An event's tool calls or pieces of them, written by the horde itself as JSON."""
    raw = event.fields.get("tool_calls")
    return tuple(json.loads(raw)) if raw else ()


class Follower:
    """Follows one request's relay stream on behalf of one requester.

    Until the stream commits it is in preflight: it reads at most PREFLIGHT_EVENTS events or
    PREFLIGHT_BYTES bytes of a generation looking for output, and a generation that ends first
    with none is an invalid upstream stream.
    """

    PREFLIGHT_EVENTS = 32
    PREFLIGHT_BYTES = 65536

    def __init__(
        self, request_id: UUID, *, stream: bool, n: int = 1, on_stall: Callable[[], None] | None = None
    ) -> None:
        self.request_id = request_id
        self.stream = stream
        self.n = n
        # Each generation given a choice (streamed: committed to it), and its index.
        self.choices: dict[str, int] = {}
        self.ended: set[int] = set()  # the choices done
        self._events: AsyncIterator[relay.Event] = relay_hub.events(request_id, on_stall)
        self._held: dict[str, list[str]] = {}  # output read before commitment, per generation

    async def next_output(self) -> Output:
        async for event in self._events:
            if event.type == "delta":
                if not self.stream:
                    continue
                index = self.choices.get(event.generation)
                if index is None:
                    output = await self._preflight(event)
                    if output is None:
                        continue
                    return output
                return Output("delta", text=event.text, index=index, tool_calls=_calls(event))
            elif event.type == relay.DONE:
                index = self.choices.get(event.generation)
                calls = _calls(event)
                if index is None:
                    if len(self.choices) >= self.n:
                        continue  # no choice left for it (not expected: at most n run)
                    if not self.choices and self.stream and not relay.useful(event.text, calls):
                        raise errors.UpstreamStreamInvalid("The job ended before any output.")
                    # Done whole: nothing can take it back, so it needs no commitment.
                    self._held.pop(event.generation, None)
                    index = self.choices[event.generation] = len(self.choices)
                self.ended.add(index)
                return Output(
                    "done",
                    text=event.text,
                    tokens=int(event.fields.get("tokens", 0)),
                    kudos=float(event.fields.get("kudos", 0)),
                    finish_reason=event.fields.get("finish_reason", "stop"),
                    index=index,
                    final=len(self.ended) >= self.n,
                    model=event.fields.get("model", ""),
                    tool_calls=calls,
                )
            elif event.type == relay.FAILED:
                code = event.fields.get("code", "")
                ending = Ending(code) if code in Ending.values else Ending.NONE
                return Output("failed", ending=ending, final=True)
            elif event.type == relay.RESTARTED:
                self._held.pop(event.generation, None)  # its preflight starts again
        raise errors.ServiceUnavailable()

    async def _preflight(self, event: relay.Event) -> Output | None:
        """Hold a generation's output until it may commit, then commit it to the next choice;
        None to read on. The stream's first commitment waits for useful output (white space
        alone is held, within the preflight's bounds); once the stream has begun, a further
        choice commits at its first output."""
        if len(self.choices) >= self.n:
            return None  # not expected: at most n generations run
        held = self._held.setdefault(event.generation, [])
        held.append(event.text)
        calls = _calls(event)  # a piece of a tool call is output too
        if not self.choices and not relay.useful(event.text, calls):
            if (
                len(held) >= self.PREFLIGHT_EVENTS
                or sum(len(t.encode()) for t in held) >= self.PREFLIGHT_BYTES
            ):
                raise errors.UpstreamStreamInvalid()
            return None
        # The post that brought this output committed the stream and says so (`record_progress`);
        # else (white space first, or its commitment failed) it is committed here.
        model = event.fields.get("model") or await asyncdb.run(
            services.commit_stream, request_id=self.request_id, generation_id=UUID(event.generation)
        )
        if model is None:
            self._held.pop(event.generation, None)
            return None  # aborted meanwhile: its job is restarting
        index = self.choices[event.generation] = len(self.choices)
        text = "".join(self._held.pop(event.generation))
        return Output("delta", text=text, index=index, model=model, tool_calls=calls)

    async def close(self) -> None:
        await self._events.aclose()
