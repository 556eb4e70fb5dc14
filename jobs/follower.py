"""Following one chat request's relay stream for its requester: preflight and commitment.

The follower reads the request's Redis relay stream (never polling the database). Streamed,
it commits the response to the first generation that delivers useful output (text that is not
only white space); from then on only that generation's output is relayed.
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
    # Done: the reply's tool calls (`jobs.protocols.agents`); a delta: its pieces of them
    # (`{"index", "id", "function": {"name", "arguments"}}`, OpenAI's stream form).
    tool_calls: tuple[dict[str, Any], ...] = ()


def _calls(event: relay.Event) -> tuple[dict[str, Any], ...]:
    """An event's tool calls or pieces of them, written by the horde itself as JSON."""
    raw = event.fields.get("tool_calls")
    return tuple(json.loads(raw)) if raw else ()


class Follower:
    """Follows one request's relay stream on behalf of one requester.

    Until it commits it is in preflight: it reads at most PREFLIGHT_EVENTS events or
    PREFLIGHT_BYTES bytes of a generation looking for output, and a generation that ends first
    with none is an invalid upstream stream.
    """

    PREFLIGHT_EVENTS = 32
    PREFLIGHT_BYTES = 65536

    def __init__(self, request_id: UUID, *, stream: bool, on_stall: Callable[[], None] | None = None) -> None:
        self.request_id = request_id
        self.stream = stream
        self.generation: str | None = None  # the generation the stream is committed to
        self._events: AsyncIterator[relay.Event] = relay_hub.events(request_id, on_stall)
        self._held: dict[str, list[str]] = {}  # white space read in preflight, per generation

    async def next_output(self) -> Output:
        async for event in self._events:
            if event.type == "delta":
                if not self.stream:
                    continue
                if self.generation is None:
                    output = await self._preflight(event)
                    if output is None:
                        continue
                    return output
                if event.generation == self.generation:
                    return Output("delta", text=event.text, tool_calls=_calls(event))
            elif event.type == relay.DONE:
                if self.generation in (None, event.generation):
                    text = event.text
                    calls = _calls(event)
                    if self.generation is None and self.stream and not text.strip() and not calls:
                        raise errors.UpstreamStreamInvalid("The job ended before any output.")
                    return Output(
                        "done",
                        text=text,
                        tokens=int(event.fields.get("tokens", 0)),
                        kudos=float(event.fields.get("kudos", 0)),
                        finish_reason=event.fields.get("finish_reason", "stop"),
                        tool_calls=calls,
                    )
            elif event.type == relay.FAILED:
                code = event.fields.get("code", "")
                return Output("failed", ending=Ending(code) if code in Ending.values else Ending.NONE)
            elif event.type == relay.RESTARTED:
                self._held.pop(event.generation, None)  # its preflight starts again
        raise errors.ServiceUnavailable()

    async def _preflight(self, event: relay.Event) -> Output | None:
        """Hold white space until useful output arrives, then commit; None to read on."""
        held = self._held.setdefault(event.generation, [])
        held.append(event.text)
        calls = _calls(event)  # a piece of a tool call is output too
        if not event.text.strip() and not calls:
            if (
                len(held) >= self.PREFLIGHT_EVENTS
                or sum(len(t.encode()) for t in held) >= self.PREFLIGHT_BYTES
            ):
                raise errors.UpstreamStreamInvalid()
            return None
        committed = await asyncdb.run(
            services.commit_stream, request_id=self.request_id, generation_id=UUID(event.generation)
        )
        if not committed:
            self._held.pop(event.generation, None)
            return None  # aborted meanwhile: its job is restarting
        self.generation = event.generation
        return Output("delta", text="".join(self._held.pop(event.generation)), tool_calls=calls)

    async def close(self) -> None:
        await self._events.aclose()
