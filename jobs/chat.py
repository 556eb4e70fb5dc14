"""The relay core of the chat routes: one async flow for every client protocol.

A chat request becomes a chat job; the view then waits on the request's Redis relay stream
(never polling the database) for the worker's output. It waits on the event loop: its
database steps run through `hordeops.asyncdb`, so that an open request holds no thread and
no database connection between them. Streamed, the response is committed to
the first generation that delivers output: from then on an abort ends the stream with the
protocol's error event instead of a restart. A client that goes away cancels its request.
"""

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import TypeVar
from uuid import UUID

import redis.exceptions
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from hordeops import asyncdb, clock, errors, keys
from hordeops.parsers import loads_strict
from jobs import deadlines, relay, services
from jobs.deadlines import Budget
from jobs.models import TextRequest
from jobs.protocols import PROTOCOLS, ChatCall, ChatProtocol, Reply, Usage
from workers.models import Account
from workers.services import authenticate

logger = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class Output:
    """The next thing the requester must be told."""

    kind: str  # delta, done or failed
    text: str = ""
    tokens: int = 0
    finish_reason: str = "stop"
    reason: str = ""


class RequestRelay:
    """Follows one request's relay stream on behalf of one requester.

    Streamed, it commits to the first generation that delivers useful output (text that is
    not only white space). Until then it is in preflight (seed 003): it reads at most
    PREFLIGHT_EVENTS events or PREFLIGHT_BYTES bytes of a generation looking for output, and a
    generation that ends first with none is an invalid upstream stream.
    """

    PREFLIGHT_EVENTS = 32
    PREFLIGHT_BYTES = 65536

    def __init__(self, text_request: TextRequest, *, stream: bool) -> None:
        self.request_id = text_request.id
        self.stream = stream
        self.generation: str | None = None  # the generation the stream is committed to
        self._events: AsyncIterator[relay.Event] = relay.events(text_request.id)
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
                    return Output("delta", text=event.text)
            elif event.type == relay.DONE:
                if self.generation in (None, event.generation):
                    text = event.text
                    if self.generation is None and self.stream:
                        if not text.strip():
                            raise errors.UpstreamStreamInvalid("The job ended before any output.")
                    return Output(
                        "done",
                        text=text,
                        tokens=int(event.fields.get("tokens", 0)),
                        finish_reason=event.fields.get("finish_reason", "stop"),
                    )
            elif event.type == relay.FAILED:
                return Output("failed", reason=event.fields.get("code", ""))
            elif event.type == relay.RESTARTED:
                self._held.pop(event.generation, None)  # its preflight starts again
        raise errors.ServiceUnavailable()

    async def _preflight(self, event: relay.Event) -> Output | None:
        """Hold white space until useful output arrives, then commit; None to read on."""
        held = self._held.setdefault(event.generation, [])
        held.append(event.text)
        if not event.text.strip():
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
        return Output("delta", text="".join(self._held.pop(event.generation)))

    async def close(self) -> None:
        await self._events.aclose()


def _failure(reason: str) -> errors.DomainError:
    if reason == errors.GenerationDeadlineExceeded.code:
        return errors.GenerationDeadlineExceeded()
    return errors.ReplyFailed(reason)


def _abandon(request_id: UUID, reason: str = "cancelled") -> None:
    """The requester went away or ran out of time: cancel its request; nothing restarts it."""
    try:
        services.cancel_request(request_id=request_id, reason=reason)
    except Exception:
        logger.exception("could not cancel an abandoned chat request")


def _start(
    request: HttpRequest, protocol: ChatProtocol, header: Budget | errors.DomainError | None
) -> tuple[ChatCall, TextRequest, Budget | None]:
    """Authenticate, parse and queue: the synchronous first phase of a chat request.

    `header` is the deadline header's budget, or the error that refuses the header: the key
    is checked first, so that a bad key is a 401 whatever the header says.
    """
    api_key = keys.chat_api_key(request.headers)
    if not api_key:
        raise errors.InvalidAPIKey("This route needs an API key: send Authorization: Bearer <key>.")
    account: Account = authenticate(api_key=api_key)
    if isinstance(header, errors.DomainError):
        raise header
    budget = header.within(account.deadline_limit_ms) if header else None
    call = protocol.parse(loads_strict(request.body))
    deadline_at = budget.deadline_at(clock.now()) if budget else None  # auth and parsing spent some
    text_request = services.create_chat_request(
        account=account,
        model=call.model,
        messages=call.messages,
        max_length=call.max_tokens,
        params=call.params,
        deadline_at=deadline_at,
    )
    return call, text_request, budget


async def _within(budget: Budget | None, step: Awaitable[T]) -> T:
    """Await `step`, or raise GenerationDeadlineExceeded when the budget runs out first."""
    if budget is None:
        return await step
    try:
        return await asyncio.wait_for(step, timeout=budget.remaining_seconds())
    except TimeoutError:
        raise errors.GenerationDeadlineExceeded() from None


async def _queue(request: HttpRequest, protocol: ChatProtocol) -> tuple[ChatCall, TextRequest, Budget | None]:
    """`_start` on a database thread, the wait for one included in the deadline.

    A request that was being queued when the deadline or the client ran out is cancelled.
    """
    try:
        if deadlines.INTERNAL_HEADER in request.headers:  # checked against Redis: not on the loop
            header = await asyncio.to_thread(deadlines.budget_for, request)
        else:
            header = deadlines.budget_for(request)
    except errors.DomainError as err:
        header = err

    def undo(started: tuple[ChatCall, TextRequest, Budget | None]) -> None:
        _, text_request, budget = started
        expired = budget is not None and budget.expired
        _abandon(text_request.id, errors.GenerationDeadlineExceeded.code if expired else "cancelled")

    budget = header if isinstance(header, Budget) else None
    return await _within(budget, asyncdb.run(_start, request, protocol, header, undo=undo))


async def _next(follower: RequestRelay, budget: Budget | None) -> Output:
    """The next output, or GenerationDeadlineExceeded when the budget runs out first."""
    return await _within(budget, follower.next_output())


async def _end(text_request: TextRequest, reason: str) -> None:
    await asyncio.shield(asyncdb.run(_abandon, text_request.id, reason))


async def _serve(request: HttpRequest, protocol: ChatProtocol) -> HttpResponse:
    if request.method != "POST":
        return protocol.error_response(errors.MethodNotAllowed())
    try:
        call, text_request, budget = await _queue(request, protocol)
    except errors.DomainError as err:
        return protocol.error_response(err)
    except (DatabaseError, redis.exceptions.RedisError):
        logger.exception("chat request could not be queued")
        return protocol.error_response(errors.ServiceUnavailable())

    usage_prompt = services.prompt_tokens(text_request.prompt)
    reply = Reply(id=protocol.reply_id(str(text_request.id)), model=call.model, prompt_tokens=usage_prompt)
    follower = RequestRelay(text_request, stream=call.stream)
    try:
        first = await _next(follower, budget)
    except asyncio.CancelledError:
        await follower.close()
        await _end(text_request, "cancelled")
        raise
    except (errors.GenerationDeadlineExceeded, errors.UpstreamStreamInvalid) as err:
        # Before commitment: a real status, and the job is cancelled, never replayed.
        await follower.close()
        await _end(text_request, err.code)
        return protocol.error_response(err)
    except (redis.exceptions.RedisError, errors.ServiceUnavailable):
        await follower.close()
        return protocol.error_response(errors.ServiceUnavailable())

    if first.kind == "failed":
        await follower.close()
        return protocol.error_response(_failure(first.reason))
    if not call.stream:
        await follower.close()
        usage = Usage(usage_prompt, first.tokens)
        return JsonResponse(protocol.response(reply, first.text, first.finish_reason, usage))

    async def events() -> AsyncIterator[str]:
        sent: list[str] = []
        output = first
        finished = False
        try:
            for chunk in protocol.stream_start(reply):
                yield chunk
            while True:
                if output.kind == "delta":
                    sent.append(output.text)
                    for chunk in protocol.stream_delta(reply, output.text):
                        yield chunk
                elif output.kind == "done":
                    streamed = "".join(sent)
                    rest = output.text[len(streamed) :] if output.text.startswith(streamed) else ""
                    if rest:
                        for chunk in protocol.stream_delta(reply, rest):
                            yield chunk
                    usage = Usage(usage_prompt, output.tokens)
                    for chunk in protocol.stream_end(reply, output.finish_reason, usage):
                        yield chunk
                    finished = True
                    return
                else:
                    for chunk in protocol.stream_error(reply, _failure(output.reason)):
                        yield chunk
                    finished = True
                    return
                try:
                    output = await _next(follower, budget)
                except errors.GenerationDeadlineExceeded as err:
                    # After commitment: the protocol's error event, then the stream just
                    # ends (no [DONE] or stop event, no fallback) and the job is cancelled.
                    for chunk in protocol.stream_error(reply, err):
                        yield chunk
                    finished = True
                    await _end(text_request, err.code)
                    return
        finally:
            await follower.close()
            if not finished:
                await _end(text_request, "cancelled")

    response = StreamingHttpResponse(events(), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


@csrf_exempt
async def chat_completions(request: HttpRequest) -> HttpResponse:
    return await _serve(request, PROTOCOLS["/v1/chat/completions"])


@csrf_exempt
async def responses(request: HttpRequest) -> HttpResponse:
    return await _serve(request, PROTOCOLS["/v1/responses"])


@csrf_exempt
async def messages(request: HttpRequest) -> HttpResponse:
    return await _serve(request, PROTOCOLS["/v1/messages"])
