"""The chat routes: one async flow for every client protocol.

A chat request becomes a chat job; the answer then waits on the request's Redis relay stream
for the worker's output (`jobs.replies`). It waits on the event loop: its database steps run
through `hordeops.asyncdb`, so that an open request holds no thread and no database
connection between them.
"""

import asyncio
import logging

import redis.exceptions
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from hordeops import asyncdb, clock, errors, keys, ratelimit
from hordeops.parsers import loads_strict
from jobs import cancellations, deadlines, services
from jobs.deadlines import Budget
from jobs.models import Ending, TextRequest
from jobs.protocols import PROTOCOLS, ChatCall, ChatProtocol
from jobs.replies import Exchange, within
from workers import shared_keys
from workers.models import Account

logger = logging.getLogger(__name__)

NOT_QUEUED = "The horde cannot reach its database or Redis right now. Nothing was queued."


def chat_key(request: HttpRequest) -> str:
    """A /v1 request's key (`Authorization: Bearer` or `x-api-key`), refused if missing: no query."""
    api_key = keys.chat_api_key(request.headers)
    if not api_key:
        raise errors.InvalidAPIKey("This route needs an API key: send Authorization: Bearer <key>.")
    return api_key


def chat_caller(request: HttpRequest) -> Account:
    """The account of a /v1 request's key (a shared key's owner, while the key may spend)."""
    return shared_keys.for_requester(api_key=chat_key(request))


def _start(
    request: HttpRequest, protocol: ChatProtocol, header: Budget | errors.DomainError | None
) -> tuple[ChatCall, TextRequest, Budget | None]:
    """Authenticate, parse and queue: the synchronous first phase of a chat request.

    `header` is the deadline header's budget, or the error that refuses the header: the key
    is checked first, so that a bad key is a 401 whatever the header says.
    """
    # A suspended account is refused by the request's admission, with the horde's rules; a
    # shared key is its owner's account, spending through the key.
    account, shared_key = shared_keys.key_holder(api_key=chat_key(request))
    budget = deadlines.for_account(header, account)
    call = protocol.parse(loads_strict(request.body))
    deadline_at = budget.deadline_at(clock.now()) if budget else None  # auth and parsing spent some
    reply = {
        "account": account,
        "address": ratelimit.request_address(request),
        "model": call.model,
        "fallbacks": call.models,
        "max_length": call.max_tokens,
        "max_length_field": call.max_tokens_field,
        "params": call.params,
        "deadline_at": deadline_at,
        "shared_key": shared_key,
        "n": call.n,
        "needs": call.needs,
        "stream": call.stream,
    }
    text_request = services.create_reply_request(prompt=call.prompt, messages=call.messages, **reply)
    return call, text_request, budget


async def _queue(request: HttpRequest, protocol: ChatProtocol) -> tuple[ChatCall, TextRequest, Budget | None]:
    """`_start` on a database thread, the wait for one included in the deadline.

    A request that was being queued when the deadline or the client ran out is cancelled.
    """
    # A missing key is a 401 whatever the deadline: checked here, before a short budget can
    # run out while the step waits for a database thread.
    chat_key(request)
    if deadlines.INTERNAL_HEADER in request.headers:  # checked against Redis: not on the loop
        header = await asyncio.to_thread(deadlines.header_budget, request)
    else:
        header = deadlines.header_budget(request)

    def undo(started: tuple[ChatCall, TextRequest, Budget | None]) -> None:
        _, text_request, budget = started
        expired = budget is not None and budget.expired
        cancellations.cancel_now(text_request.id, Ending.DEADLINE if expired else Ending.CANCELLED)

    budget = header if isinstance(header, Budget) else None
    with deadlines.connection_wait(header):  # the step's wait for a connection included
        return await within(budget, asyncdb.run(_start, request, protocol, header, undo=undo))


async def _serve(request: HttpRequest, protocol: ChatProtocol) -> HttpResponse:
    """A chat request from start to answer: queue it, then answer whole or as a stream. Any
    refusal before a stream starts is the protocol's error answer."""
    if request.method != "POST":
        return protocol.error_response(errors.MethodNotAllowed(allowed=("POST",)))
    try:
        call, text_request, budget = await _queue(request, protocol)
    except errors.DomainError as err:
        return protocol.error_response(err)
    except (DatabaseError, redis.exceptions.RedisError):
        logger.exception("chat request could not be queued")
        return protocol.error_response(errors.ServiceUnavailable(NOT_QUEUED))
    return await Exchange(protocol, call, text_request, budget).answer(call.stream)


@csrf_exempt
def count_tokens(request: HttpRequest) -> HttpResponse:
    """Anthropic's `POST /v1/messages/count_tokens`: the horde's own estimate of the prompt the
    messages become (the AI Horde's count, about four characters a token), not the model's
    tokenizer, which only its workers have."""
    protocol = PROTOCOLS["/v1/messages"]
    if request.method != "POST":
        return protocol.error_response(errors.MethodNotAllowed(allowed=("POST",)))
    try:
        chat_caller(request)
        body = loads_strict(request.body)
        # The count takes no max_tokens; the message's validation wants one.
        call = protocol.parse({**body, "max_tokens": 1} if isinstance(body, dict) else body)
    except errors.DomainError as err:
        return protocol.error_response(err)
    return JsonResponse({"input_tokens": services.prompt_tokens(services.render_chat_prompt(call.messages))})


def _route(path: str):
    """The view of one protocol's route: the flow above, in that protocol's shapes."""
    protocol = PROTOCOLS[path]

    @csrf_exempt
    async def view(request: HttpRequest) -> HttpResponse:
        return await _serve(request, protocol)

    return view


chat_completions = _route("/v1/chat/completions")
completions = _route("/v1/completions")
responses = _route("/v1/responses")
messages = _route("/v1/messages")
