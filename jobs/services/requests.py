"""Queueing requests: the text route's and the chat routes', within the account's bound and in
the fair order; committing a chat stream to one generation."""

import logging
import math
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import transaction

from hordeops import clock, errors
from jobs.models import Generation, TextRequest
from workers.models import Account, Worker

logger = logging.getLogger(__name__)


def prompt_tokens(text: str) -> int:
    """Tokens in a text, estimated as the AI Horde does: about four characters a token."""
    return math.ceil(len(text) / 4)


def estimate_tokens(text: str, max_length: int) -> int:
    """The AI Horde's count of generated tokens ("things"): at least 20, at most max_length."""
    return min(max_length, max(20, prompt_tokens(text)))


def _require_known_models(models: list[str]) -> None:
    """A model is known while some registered worker declares it."""
    if models and not Worker.objects.filter(served_models__overlap=models).exists():
        raise errors.UnknownModel("No worker serves any of the requested models: " + ", ".join(models[:5]))


def create_text_request(
    *,
    account: Account,
    prompt: str,
    params: dict[str, Any],
    models: list[str],
    workers: list[UUID],
    trusted_workers: bool,
    slow_workers: bool,
    dry_run: bool,
    deadline_at: datetime | None = None,
    now: datetime | None = None,
) -> tuple[TextRequest | None, float]:
    """Queue a text request; return it (None on a dry run) and its kudos estimate."""
    now = now or clock.now()
    n = params.pop("n", 1)
    max_length = params.get("max_length", 80)
    max_context_length = params.get("max_context_length", 2048)
    if max_context_length < max_length:
        raise errors.TokenOverflow()
    kudos = round(max_length * n / 10, 2)
    _require_known_models(models)
    if workers:
        known = set(Worker.objects.filter(pk__in=workers).values_list("pk", flat=True))
        missing = [str(w) for w in workers if w not in known]
        if missing:
            raise errors.WorkerNotFound(f"No worker with id {missing[0]}.")
    if dry_run:
        return None, kudos
    with transaction.atomic():
        fair_rank = _admit(account)
        request = TextRequest.objects.create(
            account=account,
            kind=TextRequest.Kind.TEXT,
            fair_rank=fair_rank,
            prompt=prompt,
            params=params,
            max_length=max_length,
            max_context_length=max_context_length,
            requested_models=models,
            allowed_workers=workers,
            trusted_workers=trusted_workers,
            slow_workers=slow_workers,
            n=n,
            queued=n,
            created_at=now,
            expires_at=_expiry(now, deadline_at),
            deadline_at=deadline_at,
        )
    return request, kudos


def _admit(account: Account) -> int:
    """Refuse a request past the account's bound of waiting or running requests, or return
    how many the account has: the new request's `fair_rank`.

    The account's row is locked until the caller's transaction ends, so two requests at once
    cannot both take its last place (nor the same rank); the count reads the
    `request_active_by_account` index.
    """
    Account.objects.select_for_update().filter(pk=account.pk).values_list("pk", flat=True).first()
    limit = account.waiting_requests_limit
    active = TextRequest.objects.filter(account_id=account.pk, state=TextRequest.State.ACTIVE)[:limit].count()
    if active >= limit:
        raise errors.TooManyPrompts(count=active, limit=limit)
    return active


def _expiry(now: datetime, deadline_at: datetime | None) -> datetime:
    """A request lives TEXT_REQUEST_LIFETIME_SECONDS, or until its deadline if sooner."""
    lifetime = now + timedelta(seconds=settings.TEXT_REQUEST_LIFETIME_SECONDS)
    return min(lifetime, deadline_at) if deadline_at else lifetime


def render_chat_prompt(messages: list[dict[str, str]]) -> str:
    """The chat as one ChatML prompt, for workers that take a prompt rather than messages."""
    turns = [f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages]
    return "".join(turns) + "<|im_start|>assistant\n"


def create_chat_request(
    *,
    account: Account,
    model: str,
    messages: list[dict[str, str]],
    max_length: int,
    params: dict[str, Any],
    deadline_at: datetime | None = None,
    now: datetime | None = None,
) -> TextRequest:
    """Queue a chat job for one reply of at most `max_length` tokens from `model`."""
    now = now or clock.now()
    _require_known_models([model])
    prompt = render_chat_prompt(messages)
    with transaction.atomic():
        fair_rank = _admit(account)
        return TextRequest.objects.create(
            account=account,
            kind=TextRequest.Kind.CHAT,
            fair_rank=fair_rank,
            prompt=prompt,
            messages=messages,
            params=params,
            max_length=max_length,
            # The worker must hold the prompt and the whole reply in its context.
            max_context_length=max(20, prompt_tokens(prompt)) + max_length,
            requested_models=[model],
            n=1,
            queued=1,
            created_at=now,
            expires_at=_expiry(now, deadline_at),
            deadline_at=deadline_at,
        )


def commit_stream(*, request_id: UUID, generation_id: UUID) -> bool:
    """Commit the request's stream to one generation's output, if it is still running.

    From here on an abort faults the request instead of restarting it. The generation row
    is locked first, in the order the stale pass and the submit lock (generation, then
    request): either the pass aborted it before, and nothing is committed, or it aborts it
    after and sees the commitment.
    """
    with transaction.atomic():
        running = list(
            Generation.objects.select_for_update(no_key=True)
            .filter(pk=generation_id, request_id=request_id, state=Generation.State.PROCESSING)
            .values_list("pk", flat=True)
        )
        if not running:
            return False
        committed = TextRequest.objects.filter(
            pk=request_id, state=TextRequest.State.ACTIVE, stream_generation=None
        ).update(stream_generation=generation_id)
    return committed == 1
