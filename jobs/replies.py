"""One queued chat request's answer to its requester: whole, or as a stream.

`Exchange._follow` owns the request from its queueing to its answer. Whenever it stops, one
`finally` closes the relay follower and, unless the request ended on its own, cancels it with
the ending that stopped it: the requester went away, its deadline ran out, its stream gave no
output, the relay was lost, or the web process is stopping. Nothing restarts a cancelled
request. Before the stream commits, a failure is the answer's status; after, the protocol's
error event, and the stream just ends.

A request of `n` choices (OpenAI's `n`) is answered once all n are done: whole, their choices
in index order; streamed, each choice's deltas as they come, interleaved, each choice ended by
its own finish_reason, then one usage for all. A failure of the request before then (a
committed choice's worker stopped, its deadline, a cancellation) fails the whole answer: the
error answer, or, streamed, the error event after whatever was sent.
"""

import asyncio
from collections.abc import AsyncIterator, Awaitable, Iterator
from contextlib import aclosing
from decimal import Decimal
from typing import TypeVar

import redis.exceptions
from django.db import DatabaseError
from django.http import HttpResponse, JsonResponse, StreamingHttpResponse

from hordeops import errors, streams
from jobs import cancellations, services
from jobs.deadlines import Budget
from jobs.follower import Follower, Output
from jobs.models import Ending, TextRequest
from jobs.protocols import ChatCall, ChatProtocol, Choice, Reply, Usage, agents

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
            id=protocol.reply_id(str(text_request.id)),
            model=call.model,
            prompt_tokens=self.prompt_tokens,
            n=call.n,
        )
        self.stall = streams.Stall()
        self._outputs = self._follow(
            Follower(text_request.id, stream=call.stream, n=call.n, on_stall=self.stall.stall)
        )

    async def answer(self, stream: bool) -> HttpResponse:
        """Wait for the first output, then answer whole or as a stream. A failure before
        then is the protocol's error answer."""
        try:
            first = await anext(self._outputs)
            if first.kind == "failed":
                raise failure(first.ending)
            if first.model:  # the model that serves it, which may be one of its fallbacks
                self.reply.model = first.model
            done = [first]
            while not stream and not done[-1].final:  # whole: every choice's
                done.append(await anext(self._outputs))
                if done[-1].kind == "failed":
                    raise failure(done[-1].ending)
        except errors.DomainError as err:
            return self.protocol.error_response(err)
        except errors.StreamStalled:
            # Its follower passed its bound while a database step held it: already cancelled.
            return self.protocol.error_response(failure(Ending.CANCELLED))
        if not stream:
            await self._outputs.aclose()
            usage = self._usage(done)
            if self.reply.n == 1:
                self.reply.tool_calls = list(first.tool_calls)
                whole = self.protocol.response(self.reply, first.text, first.finish_reason, usage)
                return JsonResponse(whole)
            choices = [Choice(o.text, o.finish_reason) for o in sorted(done, key=lambda o: o.index)]
            return JsonResponse(self.protocol.response_choices(self.reply, choices, usage))
        response = StreamingHttpResponse(self._events(first), content_type="text/event-stream")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"
        response.stall = self.stall  # hordeops/asgi.py wakes a blocked send with it
        return response

    async def _follow(self, follower: Follower) -> AsyncIterator[Output]:
        """Each output for the requester: the deltas (streamed) and each choice's done, until the
        final one (the last done, or a failed), which comes after the follower is closed. Raises
        the error that ends the request instead."""
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
                except DatabaseError:
                    # A step of the follower's own (committing the stream) found no database: a
                    # primary gone, or failing over. Its cancellation waits for the database.
                    ending, database_lost = Ending.UNAVAILABLE, True
                    raise errors.DatabaseLost() from None
                except errors.ServerStopping:
                    ending = Ending.UNAVAILABLE
                    raise
                except (redis.exceptions.RedisError, errors.ServiceUnavailable):
                    # Nobody would read the job's output: it is cancelled, not served after recovery.
                    ending = Ending.UNAVAILABLE
                    raise errors.ServiceUnavailable(RELAY_LOST) from None
                if output.final:
                    ending = None
                    break
                yield output
        finally:
            await follower.close()
            if ending is not None:
                await cancellations.cancel(self.request_id, ending, database_lost=database_lost)
        yield output

    def _usage(self, done: list[Output]) -> Usage:
        """The usage of the done choices together: the prompt once, their tokens and kudos summed."""
        kudos = sum((Decimal(str(o.kudos)) for o in done), Decimal(0))
        return Usage(self.prompt_tokens, sum(o.tokens for o in done), float(kudos))

    async def _events(self, output: Output) -> AsyncIterator[str]:
        """The stream: its start, each delta as it comes (of any choice), each choice's end,
        then the stream's end; or an error event, after which the stream just ends."""
        async with aclosing(self._outputs) as outputs:
            for chunk in self.protocol.stream_start(self.reply):
                yield chunk
            streamed: dict[int, list[str]] = {}
            done: list[Output] = []
            while True:
                if output.kind == "delta":
                    streamed.setdefault(output.index, []).append(output.text)
                    if output.text:  # a delta may hold only pieces of tool calls
                        for chunk in self.protocol.stream_delta(self.reply, output.text, output.index):
                            yield chunk
                    if output.tool_calls:
                        for chunk in self.protocol.stream_tool_calls(self.reply, list(output.tool_calls)):
                            yield chunk
                elif output.kind == "done":
                    done.append(output)
                    for chunk in self._choice_end(output, streamed="".join(streamed.get(output.index, ()))):
                        yield chunk
                else:
                    for chunk in self.protocol.stream_error(self.reply, failure(output.ending)):
                        yield chunk
                    return
                if output.final:
                    break
                try:
                    output = await anext(outputs)
                except (errors.GenerationDeadlineExceeded, errors.ServiceUnavailable) as err:
                    for chunk in self.protocol.stream_error(self.reply, err):
                        yield chunk
                    return
            if self.reply.n == 1:  # one choice's end is the stream's, its usage with it
                end = self.protocol.stream_end(self.reply, output.finish_reason, self._usage(done))
            else:
                end = self.protocol.stream_usage_end(self.reply, self._usage(done))
            for chunk in end:
                yield chunk

    def _choice_end(self, output: Output, *, streamed: str) -> Iterator[str]:
        """A done choice's last deltas (what its final text holds beyond what was streamed)
        and, of several choices, its end event (one choice's end is the stream's)."""
        rest = output.text[len(streamed) :] if output.text.startswith(streamed) else ""
        if rest:
            yield from self.protocol.stream_delta(self.reply, rest, output.index)
        if output.tool_calls:  # tools are served with one choice only (the protocols' parse)
            self.reply.tool_calls = list(output.tool_calls)
            calls = agents.rest_of_calls(self.reply.streamed_calls, self.reply.tool_calls)
            if calls:
                yield from self.protocol.stream_tool_calls(self.reply, calls)
        if self.reply.n > 1:
            yield from self.protocol.stream_choice_end(self.reply, output.index, output.finish_reason)
