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
from collections.abc import AsyncIterator, Awaitable, Iterator
from dataclasses import dataclass
from typing import TypeVar
from uuid import UUID

import redis.exceptions
from django.conf import settings
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from hordeops import asyncdb, clock, dbwait, errors, keys
from hordeops.parsers import loads_strict
from jobs import deadlines, relay, services
from jobs.deadlines import Budget
from jobs.models import TextRequest
from jobs.protocols import PROTOCOLS, ChatCall, ChatProtocol, Reply, Usage
from workers.models import Account
from workers.services import authenticate

logger = logging.getLogger(__name__)
T = TypeVar("T")

# What a 503 says was left behind.
NOT_QUEUED = "The horde cannot reach its database or Redis right now. Nothing was queued."
CANCELLED = "The horde lost its connection to Redis. The request was cancelled: nothing is left queued."


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


def _abandon(request_id: UUID, reason: str = "cancelled") -> bool:
    """The requester went away or ran out of time: cancel its request; nothing restarts it.
    False when the database could not take the cancellation now: it is then deferred."""
    try:
        with dbwait.bounded(None):  # past the deadline too: the cancellation must be made
            services.cancel_request(request_id=request_id, reason=reason)
    except DatabaseError:
        logger.warning("cancellation deferred: the database is unavailable")
        try:  # for the stale pass, should this process not live to make it
            services.defer_cancellations(reasons={request_id: reason})
        except redis.exceptions.RedisError:
            logger.error("a deferred cancellation is held by this process only: Redis is unavailable")
        return False
    except Exception:
        logger.exception("could not cancel an abandoned chat request")
    return True


# This process's cancellations that wait for the database, and the task that makes them.
_deferred: dict[UUID, str] = {}
_deferred_task: asyncio.Task | None = None


def _defer(request_id: UUID, reason: str) -> None:
    """Cancel the request once the database is back: this process retries every
    DATABASE_WATCH_SECONDS, and Redis records it for the stale pass should the process die."""
    global _deferred_task
    _deferred[request_id] = reason
    loop = asyncio.get_running_loop()
    if _deferred_task is None or _deferred_task.done() or _deferred_task.get_loop() is not loop:
        _deferred_task = loop.create_task(_cancel_deferred())


async def _cancel_deferred() -> None:
    recorded: set[UUID] = set()
    while _deferred:
        await asyncio.sleep(settings.DATABASE_WATCH_SECONDS)
        pending = dict(_deferred)
        fresh = {key: value for key, value in pending.items() if key not in recorded}
        try:
            await asyncio.to_thread(services.defer_cancellations, reasons=fresh)
            recorded.update(fresh)
        except redis.exceptions.RedisError:
            pass  # this process still holds them
        try:
            made = await asyncdb.run(services.cancel_deferred, pending=pending)
        except DatabaseError:
            continue  # still away
        for request_id in made:
            _deferred.pop(request_id, None)


def chat_caller(request: HttpRequest) -> Account:
    """The account of a /v1 request's key (`Authorization: Bearer` or `x-api-key`)."""
    api_key = keys.chat_api_key(request.headers)
    if not api_key:
        raise errors.InvalidAPIKey("This route needs an API key: send Authorization: Bearer <key>.")
    return authenticate(api_key=api_key)


def _start(
    request: HttpRequest, protocol: ChatProtocol, header: Budget | errors.DomainError | None
) -> tuple[ChatCall, TextRequest, Budget | None]:
    """Authenticate, parse and queue: the synchronous first phase of a chat request.

    `header` is the deadline header's budget, or the error that refuses the header: the key
    is checked first, so that a bad key is a 401 whatever the header says.
    """
    account = chat_caller(request)
    budget = deadlines.for_account(header, account)
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
    if deadlines.INTERNAL_HEADER in request.headers:  # checked against Redis: not on the loop
        header = await asyncio.to_thread(deadlines.header_budget, request)
    else:
        header = deadlines.header_budget(request)

    def undo(started: tuple[ChatCall, TextRequest, Budget | None]) -> None:
        _, text_request, budget = started
        expired = budget is not None and budget.expired
        _abandon(text_request.id, errors.GenerationDeadlineExceeded.code if expired else "cancelled")

    budget = header if isinstance(header, Budget) else None
    with deadlines.connection_wait(header):  # the step's wait for a connection included
        return await _within(budget, asyncdb.run(_start, request, protocol, header, undo=undo))


async def _next(follower: RequestRelay, budget: Budget | None) -> Output:
    """The next output, or GenerationDeadlineExceeded when the budget runs out first."""
    return await _within(budget, follower.next_output())


async def _end(text_request: TextRequest, reason: str, *, database_lost: bool = False) -> None:
    """Cancel the request, or defer it when the database cannot take it: at once when the
    relay hub found the database gone, so that a crowd of streams does not wait on the pool."""
    if database_lost or not await asyncio.shield(asyncdb.run(_abandon, text_request.id, reason)):
        _defer(text_request.id, reason)


async def _serve(request: HttpRequest, protocol: ChatProtocol) -> HttpResponse:
    """A chat request from start to answer: queue it, wait for its first output, then answer
    whole or as a stream. Any refusal before a stream starts is the protocol's error answer."""
    if request.method != "POST":
        return protocol.error_response(errors.MethodNotAllowed(allowed=("POST",)))
    try:
        call, text_request, budget = await _queue(request, protocol)
    except errors.DomainError as err:
        return protocol.error_response(err)
    except (DatabaseError, redis.exceptions.RedisError):
        logger.exception("chat request could not be queued")
        return protocol.error_response(errors.ServiceUnavailable(NOT_QUEUED))
    exchange = _Exchange(protocol, call, text_request, budget)
    try:
        first = await exchange.first_output()
    except errors.DomainError as err:
        return protocol.error_response(err)
    if not call.stream:
        return await exchange.whole_reply(first)
    return exchange.streamed(first)


class _Exchange:
    """One queued chat request and its requester: the steps of `_serve` after the queueing."""

    def __init__(
        self, protocol: ChatProtocol, call: ChatCall, text_request: TextRequest, budget: Budget | None
    ) -> None:
        self.protocol, self.text_request, self.budget = protocol, text_request, budget
        self.prompt_tokens = services.prompt_tokens(text_request.prompt)
        self.reply = Reply(
            id=protocol.reply_id(str(text_request.id)), model=call.model, prompt_tokens=self.prompt_tokens
        )
        self.follower = RequestRelay(text_request, stream=call.stream)

    async def first_output(self) -> Output:
        """The first thing to tell the requester, or the error that answers it instead.

        Before commitment a deadline or an invalid upstream is a real status, and the job is
        cancelled, never replayed; a requester that goes away cancels it too."""
        try:
            first = await _next(self.follower, self.budget)
        except asyncio.CancelledError:
            await self.follower.close()
            await _end(self.text_request, "cancelled")
            raise
        except (errors.GenerationDeadlineExceeded, errors.UpstreamStreamInvalid) as err:
            await self.follower.close()
            await _end(self.text_request, err.code)
            raise
        except (redis.exceptions.RedisError, errors.ServiceUnavailable) as err:
            # The relay or the database is gone: nobody would read the job's output, so it is
            # cancelled, not left to be served after recovery.
            await self.follower.close()
            lost = isinstance(err, errors.DatabaseLost)
            await _end(self.text_request, errors.ServiceUnavailable.code, database_lost=lost)
            raise (err if lost else errors.ServiceUnavailable(CANCELLED)) from None
        if first.kind == "failed":
            await self.follower.close()
            raise _failure(first.reason)
        return first

    async def whole_reply(self, done: Output) -> HttpResponse:
        await self.follower.close()
        usage = Usage(self.prompt_tokens, done.tokens)
        return JsonResponse(self.protocol.response(self.reply, done.text, done.finish_reason, usage))

    def streamed(self, first: Output) -> StreamingHttpResponse:
        response = StreamingHttpResponse(self._events(first), content_type="text/event-stream")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"
        return response

    async def _events(self, output: Output) -> AsyncIterator[str]:
        """The stream: its start, each delta as it comes, then its end or error event. A
        stream that stops short of its end (the client went away) cancels the request."""
        sent: list[str] = []
        finished = False
        try:
            for chunk in self.protocol.stream_start(self.reply):
                yield chunk
            while output.kind == "delta":
                sent.append(output.text)
                for chunk in self.protocol.stream_delta(self.reply, output.text):
                    yield chunk
                try:
                    output = await _next(self.follower, self.budget)
                except (
                    errors.GenerationDeadlineExceeded,
                    errors.ServiceUnavailable,
                    redis.exceptions.RedisError,
                ) as raised:
                    # After commitment: the protocol's error event, then the stream just
                    # ends (no [DONE] or stop event, no fallback) and the job is cancelled:
                    # past its deadline, or with the relay lost (Redis failed).
                    err = (
                        raised
                        if isinstance(raised, errors.DomainError)
                        else errors.ServiceUnavailable(CANCELLED)
                    )
                    for chunk in self.protocol.stream_error(self.reply, err):
                        yield chunk
                    finished = True
                    lost = isinstance(err, errors.DatabaseLost)
                    await _end(self.text_request, err.code, database_lost=lost)
                    return
            for chunk in self._ending(output, streamed="".join(sent)):
                yield chunk
            finished = True
        finally:
            await self.follower.close()
            if not finished:
                await _end(self.text_request, "cancelled")

    def _ending(self, output: Output, *, streamed: str) -> Iterator[str]:
        """A done stream's last deltas (what the final text holds beyond what was streamed)
        and its end event; a failed one's error event."""
        if output.kind != "done":
            yield from self.protocol.stream_error(self.reply, _failure(output.reason))
            return
        rest = output.text[len(streamed) :] if output.text.startswith(streamed) else ""
        if rest:
            yield from self.protocol.stream_delta(self.reply, rest)
        yield from self.protocol.stream_end(
            self.reply, output.finish_reason, Usage(self.prompt_tokens, output.tokens)
        )


@csrf_exempt
async def chat_completions(request: HttpRequest) -> HttpResponse:
    return await _serve(request, PROTOCOLS["/v1/chat/completions"])


@csrf_exempt
async def responses(request: HttpRequest) -> HttpResponse:
    return await _serve(request, PROTOCOLS["/v1/responses"])


@csrf_exempt
async def messages(request: HttpRequest) -> HttpResponse:
    return await _serve(request, PROTOCOLS["/v1/messages"])
