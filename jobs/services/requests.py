"""Queueing requests: the text route's and the chat routes', within the account's bound and in
the fair order; committing a chat stream to one generation."""

import json
import logging
import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import connection, transaction

from hordeops import clock, errors
from hordeops.rows import insert_values, pipelined
from jobs import admission, affinity, eligibility, spending, sql, waits, webhooks
from jobs.models import TextRequest
from jobs.protocols.base import MAX_REPLY_TOKENS
from jobs.status import eligible_workers
from kudos import ledger, rates
from kudos.models import Event, Wallet
from kudos.sql import LOCK_ACCOUNT
from workers import shared_keys
from workers.capacity import online_since
from workers.models import Account, SharedKey, Worker
from workers.sql import spend_shared_key

logger = logging.getLogger(__name__)


def prompt_tokens(text: str) -> int:
    """Tokens in a text, estimated as the AI Horde does: about four characters a token."""
    return math.ceil(len(text) / 4)


def estimate_tokens(text: str, max_length: int) -> int:
    """The AI Horde's count of generated tokens ("things"): at least 20, at most max_length."""
    return min(max_length, max(20, prompt_tokens(text)))


# The AI Horde's words for a request that no worker can serve now: it is queued all the same.
NO_WORKER_WARNING = (
    "Warning: No available workers can fulfill this request. It will expire in 20 minutes. "
    "Consider reducing the amount of tokens to generate."
)


@dataclass(frozen=True)
class QueuedText:
    request: TextRequest | None  # None on a dry run
    kudos: int  # what it is expected to cost, the horde tax included, in whole kudos
    warning: str | None = None  # NO_WORKER_WARNING when no online worker may be offered it


def _reply_length(
    models: list[str],
    prompt: str,
    now: datetime,
    *,
    chat: bool,
    asked: int | None,
    field: str,
    needs: dict[str, str] | None = None,
) -> tuple[int, list[str]]:
    """The reply a /v1 request is queued for, and which of its `models` (the model, then its
    fallbacks, in the client's order) may serve it, decided by their online workers (chat
    workers for a chat, the ones `/v1/models` lists; any worker for a text completion).

    None of them has such a worker: 404 `UnknownModel`. `needs` (capability -> the field that
    needs it, e.g. `{"tools": "tools"}`): only the workers that declare them count, and where
    a model has online workers but none declares them it is left out; none left for that
    reason: 404 `CapabilityNotServed` at once. `asked` None (the client set no limit, which
    OpenAI reads as "as much as the model gives"): the most one worker of the first model left
    accepts with this prompt in its context, within MAX_REPLY_TOKENS. An `asked` above every
    one's `max_length`: refused at once, naming the most accepted, for it would only wait out
    its life. A model whose workers all accept less than the reply is left out. The workers
    are read live, in the one statement a model's check needs anyway: a cached view could
    refuse a request that a worker which just came online would take. All the models in one
    statement (`sql.served_models`), on the path to a chat's first token.
    """
    # The context a request needs, as `create_reply_request` counts it: its prompt and its reply.
    prompt_size = max(20, prompt_tokens(prompt))
    names = tuple(needs or {})
    with connection.cursor() as cursor:
        cursor.execute(
            sql.served_models(chat=chat, needs=names),
            {"models": models, "prompt_size": prompt_size, "online_since": online_since(now)},
        )
        rows = cursor.fetchall()
    served: list[tuple[str, int, int]] = []  # (model, longest reply, longest fitting this prompt)
    incapable: tuple[str, dict[str, Any]] | None = None  # the first model served, but not as needed
    for model, (serving, longest, fitting, *declaring) in zip(models, rows, strict=True):
        limits = {
            "serving": serving,
            "longest": longest,
            "fitting": fitting,
            **dict(zip(names, declaring, strict=True)),
        }
        if limits["longest"] is not None:
            served.append((model, limits["longest"], limits["fitting"]))
        elif limits["serving"] and incapable is None:
            incapable = (model, limits)
    if not served and incapable is not None:
        model, limits = incapable
        # The capability no worker declares (else the first: none declares them all).
        name = next((name for name in needs or {} if not limits[name]), next(iter(needs or {})))
        param = (needs or {})[name]
        what = {"tools": "tool calls", "structured_outputs": "structured output (response_format)"}[name]
        raise errors.CapabilityNotServed(
            f"No online worker of the model {model[:255]} declares {what}: send the request without "
            f"{param}, or to a model whose workers support it.",
            param=param,
        )
    if not served:
        names = ", ".join(model[:255] for model in models)
        raise errors.UnknownModel(f"No online worker serves the model {names}.")
    if asked is None:
        # A prompt no worker's context holds gets the longest reply: its prompt, not its
        # length, keeps it waiting, and a shorter reply would not change that.
        _, longest, fitting = served[0]
        asked = min(fitting if fitting > 0 else longest, MAX_REPLY_TOKENS)
    usable = [model for model, longest, _ in served if longest >= asked]
    if not usable:
        longest = max(longest for _, longest, _ in served)
        names = ", ".join(model[:255] for model, _, _ in served)
        raise errors.ReplyTooLong(
            f"{field} is too large: {asked}. The online workers of the model {names} accept "
            f"at most {longest} tokens of reply: ask for {longest} or fewer, or leave {field} out "
            "to get the most they accept.",
            param=field,
        )
    return asked, usable


def create_text_request(
    *,
    account: Account,
    address: str,
    prompt: str,
    params: dict[str, Any],
    models: list[str],
    workers: list[UUID],
    trusted_workers: bool,
    slow_workers: bool,
    dry_run: bool,
    worker_blacklist: bool = False,
    allow_downgrade: bool = False,
    deadline_at: datetime | None = None,
    now: datetime | None = None,
    shared_key: SharedKey | None = None,
    webhook: str | None = None,
    validated_backends: bool = False,
    disable_batching: bool = False,
    proxied_account: str = "",
    style_author: int | None = None,
) -> QueuedText:
    """Queue a text request; return it (None on a dry run), its cost, and a warning when no
    online worker may be offered it now.

    As on the AI Horde, a request is accepted whatever models it names, even when no worker
    serves them (yet): one may start, or restart and redeclare its models, within the
    request's life. One that needs its kudos upfront (`jobs.spending`) from an account that
    cannot cover them is refused with KudosUpfront, or asks for fewer tokens if it allows a
    downgrade. `address` is the client's, for its admission (`jobs.admission`).

    Sent with a `shared_key` (its owner's `account`), it is refused when the key is spent or
    expired (a spent one with `allow_downgrade` is the anonymous account's request instead, as
    on the AI Horde), past the key's token cap, or past what is left of its budget: its cost
    is taken off the budget as it is queued (`_queue`).

    A `webhook` is refused (BadWebhook) unless a call to it now would be allowed
    (`jobs.webhooks.checked`), a dry run's too, as on the AI Horde.

    The AI Horde's request fields of its own: `proxied_account` only from a service account
    (`workers.proxies`), `disable_batching` with n above 1 only from a trusted one, and
    `validated_backends` refused at once only where no bridge is validated at all.

    Run under another account's style (`jobs.styles`), it pays the style fee with its horde
    tax, and the style's account, `style_author`, receives it (`horde_tax`)."""
    now = now or clock.now()
    admission.admit(account=account, address=address, now=now)
    if proxied_account and not account.service:
        raise errors.OnlyServiceAccountProxy()
    webhook = webhooks.checked(webhook)
    account, shared_key = shared_keys.spender(account, shared_key, now=now, allow_downgrade=allow_downgrade)
    n = params.pop("n", 1)
    max_length = params.get("max_length", 80)
    max_context_length = params.get("max_context_length", 2048)
    if max_context_length < max_length:
        raise errors.TokenOverflow()
    shared_keys.within_cap(shared_key, tokens=max_length)
    cost = spending.request_cost(
        models=models, max_length=max_length, max_context_length=max_context_length, n=n
    )
    fee = rates.STYLE_FEE if style_author is not None else 0
    shared_keys.covers(shared_key, cost=cost + rates.HORDE_TAX + fee)
    if workers and not worker_blacklist:  # blocking a worker that is gone blocks nothing
        known = set(Worker.objects.filter(pk__in=workers).values_list("pk", flat=True))
        missing = [str(w) for w in workers if w not in known]
        if missing:
            raise errors.WorkerNotFound(f"No worker with id {missing[0]}.")
    if disable_batching and n > 1 and not account.trusted:
        raise errors.RequiresTrust()
    if validated_backends and not settings.VALIDATED_BRIDGE_AGENTS:
        raise errors.NoValidatedBackends()
    if dry_run:
        return QueuedText(request=None, kudos=_whole(cost) + fee)
    fields = {
        "kind": TextRequest.Kind.TEXT,
        "prompt": prompt,
        "params": params,
        "max_length": max_length,
        "max_context_length": max_context_length,
        "requested_models": models,
        "allowed_workers": workers,
        "worker_blacklist": worker_blacklist and bool(workers),
        "trusted_workers": trusted_workers,
        "slow_workers": slow_workers,
        "validated_backends": validated_backends,
        "disable_batching": disable_batching,
        "proxied_account": proxied_account,
        "n": n,
        "queued": n,
        "webhook": webhook,
    }
    upfront, tokens = spending.needs_upfront(max_length=max_length, slow_workers=slow_workers, now=now)
    try:
        request = _queue(
            account,
            now=now,
            deadline_at=deadline_at,
            upfront=upfront,
            shared_key=shared_key,
            style_author=style_author,
            **fields,
        )
    except errors.KudosUpfront:
        if not allow_downgrade:
            raise
        # The AI Horde's downgrade: as many tokens as need no kudos upfront, slow workers welcome.
        max_length = min(max_length, tokens)
        fields.update(max_length=max_length, params={**params, "max_length": max_length}, slow_workers=True)
        request = _queue(
            account,
            now=now,
            deadline_at=deadline_at,
            shared_key=shared_key,
            style_author=style_author,
            **fields,
        )
    waits.publish_queued(request)
    warning = None if eligible_workers(request, now=now)["workers"] else NO_WORKER_WARNING
    return QueuedText(request=request, kudos=_whole(request.kudos_reserved) + fee, warning=warning)


def _whole(cost: Decimal) -> int:
    """A request's cost with the horde tax, in whole kudos as the AI Horde answers it."""
    return round(cost + rates.HORDE_TAX)


def _queue(
    account: Account,
    *,
    now: datetime,
    deadline_at: datetime | None,
    upfront: bool = False,
    shared_key: SharedKey | None = None,
    style_author: int | None = None,
    **fields: Any,
) -> TextRequest:
    """Admit the request within the account's bound (and, where `upfront`, what it may spend)
    and queue it at its fair rank, its cost held (`kudos.sql.hold`) and the horde tax paid; it
    lives until its lifetime or its deadline, whichever is sooner.

    Refused past the account's bound of waiting or running requests, or, where `upfront`, past
    what it may spend; else its `fair_rank` is how many the account has, and its priority the
    account's balance. The account's lock, the count and the INSERT (`sql.queue_request`) go in
    one round trip with the transaction's start, its commit in a second.

    Through a `shared_key`, its cost and the horde tax are taken off the key's budget first,
    under the same lock (`workers.sql.spend_shared_key`, a round trip more), and the request is
    refused if the key has run out, expired or been deleted meanwhile, or cannot cover it; a
    request refused after that gives it back, with the transaction. What a request costs in
    the end is not given back to the budget: it is spent once, as the request is queued.
    """
    request = TextRequest(
        account=account,
        created_at=now,
        expires_at=_expiry(now, deadline_at),
        deadline_at=deadline_at,
        prompt_tokens=prompt_tokens(fields["prompt"]),
        **fields,
    )
    request.kudos_reserved = spending.request_cost(
        models=request.requested_models,
        max_length=request.max_length,
        max_context_length=request.max_context_length,
        n=request.n,
    )
    limit = account.waiting_requests_limit
    upfront_cost = request.kudos_reserved + rates.HORDE_TAX + (rates.STYLE_FEE if style_author else 0)
    warm = affinity.warm_worker(account_id=account.pk, prompt=request.prompt)
    params = {
        **insert_values(request, exclude=("fair_rank", "priority")),
        "limit": limit,
        "upfront": upfront,
        "upfront_cost": upfront_cost,
        "floor": rates.floor(anonymous=account.is_anonymous, pseudonymous=account.pseudonymous),
        **horde_tax(account_id=account.pk, request_id=request.pk, now=now, style_author=style_author),
    }
    with transaction.atomic(), pipelined() as cursor:
        cursor.execute(LOCK_ACCOUNT, {"account_id": account.pk})
        if shared_key is not None:
            _spend(cursor, shared_key, cost=upfront_cost, now=now)
        cursor.execute(sql.queue_request(), params)
        rank, active, available = cursor.fetchone()
        if rank is None and shared_key is not None:
            transaction.set_rollback(True)  # refused: what was taken off the key's budget is back
    if rank is None and active >= limit:
        # Counted to the limit: an account refused has exactly as many as it may.
        raise errors.TooManyPrompts(count=limit, limit=limit)
    if rank is None:
        tokens = spending.needs_upfront(
            max_length=request.max_length, slow_workers=request.slow_workers, now=now
        )[1]
        logger.info("refused a request needing %s kudos upfront: %s could be spent", upfront_cost, available)
        raise errors.KudosUpfront(tokens=tokens, required=upfront_cost)
    request.fair_rank = rank
    request._state.adding, request._state.db = False, connection.alias
    if warm is not None:
        _prefer(request, worker_id=warm, now=now)
    return request


def _prefer(request: TextRequest, *, worker_id: UUID, now: datetime) -> None:
    """Offer a conversation's next turn to the worker that served the last, if it is free and
    the speed gate would offer it the request (`sql.prefer_worker`), for WARM_WORKER_SECONDS."""
    until = now + timedelta(seconds=settings.WARM_WORKER_SECONDS)
    params = {**eligibility.params(now), "request": request.pk, "worker": worker_id, "until": until}
    with connection.cursor() as cursor:
        cursor.execute(sql.prefer_worker(), params)
        if cursor.fetchone() is not None:
            request.preferred_worker, request.preferred_until = worker_id, until


def _spend(cursor, key: SharedKey, *, cost: Decimal, now: datetime) -> None:
    """Take `cost` off the key's budget, or refuse the request with why it cannot be."""
    cursor.execute(spend_shared_key(), {"id": key.pk, "cost": cost, "now": now})
    spent, kudos, expiry = cursor.fetchone()
    if spent:
        return
    if kudos is None:
        raise errors.SharedKeyNotFound()
    if expiry is not None and expiry <= now:
        raise errors.SharedKeyExpired()
    if kudos == 0:
        raise errors.SharedKeyEmpty()
    raise errors.SharedKeyInsufficientKudos(remaining=shared_keys.whole(kudos), required=cost)


def horde_tax(
    *, account_id: int, request_id: UUID, now: datetime, style_author: int | None = None
) -> dict[str, Any]:
    """The event that pays a queued request's horde tax, burned; under another account's
    style, also the style fee, to the style's author (its `styled` kudos and `style` record),
    where the AI Horde raises the tax and mints the author's kudos apart."""
    entries = [
        ledger.to_account(account_id, -Decimal(rates.HORDE_TAX)),
        ledger.to_system(Wallet.System.SINK, Decimal(rates.HORDE_TAX)),
    ]
    records = None
    if style_author is not None:
        entries += [
            ledger.to_account(account_id, -Decimal(rates.STYLE_FEE)),
            ledger.to_account(style_author, Decimal(rates.STYLE_FEE)),
        ]
        records = {style_author: {"style_text": 1}}
    return ledger.event_params(
        kind=Event.Kind.TAX, key=f"tax:{request_id}", entries=entries, now=now, records=records
    )


def _expiry(now: datetime, deadline_at: datetime | None) -> datetime:
    """A request lives TEXT_REQUEST_LIFETIME_SECONDS, or until its deadline if sooner."""
    lifetime = now + timedelta(seconds=settings.TEXT_REQUEST_LIFETIME_SECONDS)
    return min(lifetime, deadline_at) if deadline_at else lifetime


def render_chat_prompt(messages: list[dict[str, Any]]) -> str:
    """The chat as one ChatML prompt, for workers that take a prompt rather than messages (and
    the horde's count of its tokens): an assistant's tool calls written as their JSON."""
    turns = [
        f"<|im_start|>{m['role']}\n{m.get('content') or ''}"
        + (json.dumps(m["tool_calls"], separators=(",", ":")) if m.get("tool_calls") else "")
        + "<|im_end|>\n"
        for m in messages
    ]
    return "".join(turns) + "<|im_start|>assistant\n"


def create_reply_request(
    *,
    account: Account,
    address: str,
    model: str,
    max_length: int | None,
    params: dict[str, Any],
    prompt: str | None = None,
    messages: list[dict[str, str]] | None = None,
    deadline_at: datetime | None = None,
    now: datetime | None = None,
    max_length_field: str = "max_tokens",
    shared_key: SharedKey | None = None,
    fallbacks: tuple[str, ...] = (),
    n: int = 1,
    needs: dict[str, str] | None = None,
    stream: bool = False,
) -> TextRequest:
    """Admit and queue one /v1 reply from `model`: a text completion of `prompt` when there is
    one (a text job any of its workers may take, a legacy worker too, followed by its requester
    on the relay), else a chat job of `messages`. `max_length` None: the most its online
    workers accept (`_reply_length`), within a `shared_key`'s cap; `max_length_field` names it
    as the client did. A shared key is refused spent or expired, or past its cap or budget, as
    on the horde's route (`create_text_request`), with no fallback: the /v1 protocols have no
    allow_downgrade. `n` replies of one request are `n` jobs, held for and charged as the
    horde's route holds `params.n` (`spending.request_cost`). `needs` (a chat's capabilities,
    each with the field that needs it): offered only to workers that declare them, refused at
    once where no online worker of its models does. `stream`: its requester reads the reply as a
    stream (`TextRequest.stream`).

    `fallbacks` (OpenRouter's `models`) are models that may serve it too: the request names
    every one of `model` and its fallbacks that has an online worker able to give the reply,
    in the client's order, and the first of them is preferred (`_prefer_model`)."""
    now = now or clock.now()
    admission.admit(account=account, address=address, now=now)
    account, shared_key = shared_keys.spender(account, shared_key, now=now, allow_downgrade=False)
    if max_length is not None:
        shared_keys.within_cap(shared_key, tokens=max_length)
    chat = prompt is None
    if chat:
        prompt = render_chat_prompt(messages or [])
    choices = list(dict.fromkeys((model, *fallbacks)))
    max_length, models = _reply_length(
        choices, prompt, now, chat=chat, asked=max_length, field=max_length_field, needs=needs
    )
    if shared_key is not None and shared_key.max_text_tokens != SharedKey.UNLIMITED:
        max_length = min(max_length, shared_key.max_text_tokens)
    if chat:
        fields: dict[str, Any] = {"kind": TextRequest.Kind.CHAT, "messages": messages, "params": params}
        fields.update({f"needs_{name}": True for name in needs or {}})
    else:  # a text job's worker, a legacy one too, reads its length from the params
        params = {**params, "max_length": max_length}
        fields = {"kind": TextRequest.Kind.TEXT, "followed": True, "params": params}
    request = _queue(
        account,
        now=now,
        deadline_at=deadline_at,
        prompt=prompt,
        max_length=max_length,
        stream=stream,
        # The worker must hold the prompt and the whole reply in its context.
        max_context_length=max(20, prompt_tokens(prompt)) + max_length,
        requested_models=models,
        n=n,
        queued=n,
        shared_key=shared_key,
        **fields,
    )
    if len(models) > 1 and request.preferred_worker is None:
        _prefer_model(request, model=models[0], now=now)
    waits.publish_queued(request)
    return request


def _prefer_model(request: TextRequest, *, model: str, now: datetime) -> None:
    """Offer a request that several models may serve to a free worker of the first of them, for
    WARM_WORKER_SECONDS (`sql.prefer_model_worker`): the workers of its fallbacks take it when
    none is free, or once the window is over."""
    until = now + timedelta(seconds=settings.WARM_WORKER_SECONDS)
    params = {**eligibility.params(now), "request": request.pk, "model": model, "until": until}
    with connection.cursor() as cursor:
        cursor.execute(sql.prefer_model_worker(), params)
        row = cursor.fetchone()
    if row is not None:
        request.preferred_worker, request.preferred_until = row[0], until


def commit_stream(*, request_id: UUID, generation_id: UUID) -> str | None:
    """Commit one generation's output to the request's stream (one of its `n` choices), if the
    generation is still running and the request active; the model that generation is served
    by, or None when nothing was committed.

    From here on this generation's abort faults the request instead of restarting it
    (`Generation.streamed`); the request's `stream_generation` keeps the first committed. The
    generation row is locked first, in the order the stale pass and the submit lock
    (generation, then request): either the pass aborted it before, and nothing is committed,
    or it aborts it after and sees the commitment. One statement (`sql.commit_stream`): it
    stands between the first output and the requester.
    """
    with connection.cursor() as cursor:
        cursor.execute(sql.commit_stream(), {"generation": generation_id, "request": request_id})
        row = cursor.fetchone()
    return None if row is None else row[0]
