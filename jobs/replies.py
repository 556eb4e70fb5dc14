"""One queued chat request's answer to its requester: whole, or as a stream.

`Exchange._follow` owns the request from its queueing to its answer. Whenever it stops, one
`finally` closes the relay follower and, unless the request ended on its own, cancels it with
the ending that stopped it: the requester went away, its deadline ran out, its stream gave no
output, the relay was lost, or the web process is stopping. Nothing restarts a cancelled
request. Before the stream commits, a failure is the answer's status; after, the protocol's
error event, and the stream just ends.
"""

import asyncio
from collections.abc import AsyncIterator, Awaitable, Iterator
from contextlib import aclosing
from typing import TypeVar

import redis.exceptions
from django.http import HttpResponse, JsonResponse, StreamingHttpResponse

from hordeops import errors, streams
from jobs import cancellations, services
from jobs.deadlines import Budget
from jobs.follower import Follower, Output
from jobs.models import Ending, TextRequest
from jobs.protocols import ChatCall, ChatProtocol, Reply, Usage, agents

T = TypeVar("T")

RELAY_LOST = "The horde lost its connection to Redis. The request was cancelled: nothing is left queued."

# What a requester is told of a request that ended without its reply, by its ending.
FAILURES: dict[Ending, tuple[int, str]] = {
    Ending.ABORTED: (502, "The worker stopped delivering this reply and its lease lapsed."),
    Ending.GIVEN_BACK: (502, "The worker gave this reply up after it had started."),
    Ending.RESTARTS: (502, "Every worker that took this request dropped it."),
    Ending.LIFETIME: (504, "No worker finished this request within its lifetime."),
    Ending.CANCELLED: (409, "This request was cancelled."),
}


def failure(ending: Ending) -> errors.DomainError:
    if ending == Ending.DEADLINE:
        return errors.GenerationDeadlineExceeded()
    status, message = FAILURES.get(ending, (502, "The request failed."))
    return errors.ReplyFailed(message, status=status, openai_code=ending.value)


async def within(budget: Budget | None, step: Awaitable[T]) -> T:
    """Await `step`, or raise GenerationDeadlineExceeded when the budget runs out first."""
    if budget is None:
        return await step
    try:
        return await asyncio.wait_for(step, timeout=budget.remaining_seconds())
    except TimeoutError:
        raise errors.GenerationDeadlineExceeded() from None


class Exchange:
    """A queued chat request and its requester."""

    def __init__(
        self, protocol: ChatProtocol, call: ChatCall, text_request: TextRequest, budget: Budget | None
    ) -> None:
        self.protocol, self.request_id, self.budget = protocol, text_request.id, budget
        self.prompt_tokens = services.prompt_tokens(text_request.prompt)
        self.reply = Reply(
            id=protocol.reply_id(str(text_request.id)), model=call.model, prompt_tokens=self.prompt_tokens
        )
        self.stall = streams.Stall()
        self._outputs = self._follow(Follower(text_request.id, stream=call.stream, on_stall=self.stall.stall))

    async def answer(self, stream: bool) -> HttpResponse:
        """Wait for the first output, then answer whole or as a stream. A failure before
        then is the protocol's error answer."""
        try:
            first = await anext(self._outputs)
            if first.kind == "failed":
                raise failure(first.ending)
        except errors.DomainError as err:
            return self.protocol.error_response(err)
        except errors.StreamStalled:
            # Its follower passed its bound while a database step held it: already cancelled.
            return self.protocol.error_response(failure(Ending.CANCELLED))
        if not stream:
            await self._outputs.aclose()
            self.reply.tool_calls = list(first.tool_calls)
            usage = Usage(self.prompt_tokens, first.tokens, first.kudos)
            return JsonResponse(self.protocol.response(self.reply, first.text, first.finish_reason, usage))
        response = StreamingHttpResponse(self._events(first), content_type="text/event-stream")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"
        response.stall = self.stall  # hordeops/asgi.py wakes a blocked send with it
        return response

    async def _follow(self, follower: Follower) -> AsyncIterator[Output]:
        """Each output for the requester: the deltas (streamed), then one done or failed, which
        comes after the follower is closed. Raises the error that ends the request instead."""
        ending: Ending | None = Ending.CANCELLED  # stopped early: the requester went away
        database_lost = False
        try:
            while True:
                try:
                    output = await within(self.budget, follower.next_output())
                except errors.GenerationDeadlineExceeded:
                    ending = Ending.DEADLINE
                    raise
                except errors.UpstreamStreamInvalid:
                    ending = Ending.UPSTREAM_INVALID
                    raise
                except errors.DatabaseLost:
                    ending, database_lost = Ending.UNAVAILABLE, True
                    raise
                except errors.ServerStopping:
                    ending = Ending.UNAVAILABLE
                    raise
                except (redis.exceptions.RedisError, errors.ServiceUnavailable):
                    # Nobody would read the job's output: it is cancelled, not served after recovery.
                    ending = Ending.UNAVAILABLE
                    raise errors.ServiceUnavailable(RELAY_LOST) from None
                if output.kind != "delta":
                    ending = None
                    break
                yield output
        finally:
            await follower.close()
            if ending is not None:
                await cancellations.cancel(self.request_id, ending, database_lost=database_lost)
        yield output

    async def _events(self, output: Output) -> AsyncIterator[str]:
        """The stream: its start, each delta as it comes, then its end or error event."""
        async with aclosing(self._outputs) as outputs:
            for chunk in self.protocol.stream_start(self.reply):
                yield chunk
            streamed: list[str] = []
            while output.kind == "delta":
                streamed.append(output.text)
                if output.text:  # a delta may hold only pieces of tool calls
                    for chunk in self.protocol.stream_delta(self.reply, output.text):
                        yield chunk
                if output.tool_calls:
                    for chunk in self.protocol.stream_tool_calls(self.reply, list(output.tool_calls)):
                        yield chunk
                try:
                    output = await anext(outputs)
                except (errors.GenerationDeadlineExceeded, errors.ServiceUnavailable) as err:
                    for chunk in self.protocol.stream_error(self.reply, err):
                        yield chunk
                    return
            for chunk in self._ending(output, streamed="".join(streamed)):
                yield chunk

    def _ending(self, output: Output, *, streamed: str) -> Iterator[str]:
        """A done stream's last deltas (what the final text holds beyond what was streamed)
        and its end event; a failed one's error event."""
        if output.kind != "done":
            yield from self.protocol.stream_error(self.reply, failure(output.ending))
            return
        rest = output.text[len(streamed) :] if output.text.startswith(streamed) else ""
        if rest:
            yield from self.protocol.stream_delta(self.reply, rest)
        self.reply.tool_calls = list(output.tool_calls)
        calls = agents.rest_of_calls(self.reply.streamed_calls, self.reply.tool_calls)
        if calls:
            yield from self.protocol.stream_tool_calls(self.reply, calls)
        yield from self.protocol.stream_end(
            self.reply, output.finish_reason, Usage(self.prompt_tokens, output.tokens, output.kudos)
        )
