"""What a request costs its account, and when it must have its kudos upfront.

A request's cost (`kudos.rates.request_cost`, for each of its n jobs) is held while it is
active: the statement that queues it places a hold of it (`kudos.sql.hold`), each generation's
charge draws the hold down as it settles (`kudos.earning`, `kudos.sql.draw_holds`) and the
statement that ends the request releases it (`kudos.sql.release_holds`), so that what an
account may spend (`kudos.holds`) counts only active requests. A request that needs its kudos
upfront (the AI Horde's `require_upfront_kudos`) is admitted only if what its account may
spend covers its cost and the horde tax, under the account's lock (`kudos.sql.LOCK_ACCOUNT`).
`check_holds` holds the holds to the requests (`python manage.py check_kudos`).
"""

from datetime import datetime
from decimal import Decimal

from django.db import connection

from jobs import discovery, sql
from kudos import rates, sizes

# The AI Horde's bounds on the tokens a request may ask for without kudos upfront.
UPFRONT_TOKENS_BASE = 512
UPFRONT_TOKENS_FLOOR = 256


def request_cost(*, models: list[str], max_length: int, max_context_length: int, n: int) -> Decimal:
    """What a request of n jobs is expected to cost, less the horde tax: by its first model."""
    per_job = rates.request_cost(
        max_length=max_length,
        max_context_length=max_context_length,
        billions=sizes.billions(models[0]) if models else None,
        names_model=bool(models),
    )
    return rates.kudos(per_job * n)


def upfront_tokens(*, queued_requests: int, threads: int) -> int:
    """The most tokens a request may ask for without kudos upfront, with `queued_requests`
    waiting and `threads` online: the more load, the fewer, within 256 and 512."""
    tokens = UPFRONT_TOKENS_BASE + threads * 5 - round(queued_requests * 0.9)
    return min(UPFRONT_TOKENS_BASE, max(UPFRONT_TOKENS_FLOOR, tokens))


def needs_upfront(*, max_length: int, slow_workers: bool, now: datetime) -> tuple[bool, int]:
    """Whether a request needs its kudos upfront, and the tokens it may ask for without: one
    that refuses slow workers always does; another if it asks for more than the load allows."""
    if slow_workers and max_length <= UPFRONT_TOKENS_FLOOR:
        return False, UPFRONT_TOKENS_FLOOR  # within the bound whatever the load: no totals read
    load = discovery.performance(now=now)
    tokens = upfront_tokens(queued_requests=load["queued_text_requests"], threads=load["text_thread_count"])
    return (not slow_workers or max_length > tokens), tokens


def check_holds() -> list[str]:
    """A line for each hold that disagrees with its request (`jobs.sql.disagreeing_holds`)."""
    with connection.cursor() as cursor:
        cursor.execute(sql.disagreeing_holds())
        rows = cursor.fetchall()
    return [
        f"request {request_id}: should hold {should} for account {account_id}, "
        f"holds {held} for account {held_by}"
        for request_id, account_id, should, held_by, held in rows
    ]
