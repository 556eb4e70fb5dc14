"""What an account may spend, and what a request costs it.

A request's cost (`kudos.rates.request_cost`, for each of its n jobs) is held while it is
active (`TextRequest.kudos_reserved`); its generations are charged as they settle
(`kudos.earning`, `TextRequest.kudos_spent`), and what they did not use is released when it
ends, since only active requests hold. What an account can spend is its balance less its floor
less what its active requests still hold. A request that needs its kudos upfront (the AI
Horde's `require_upfront_kudos`) is admitted only if that covers its cost and the horde tax,
under the lock on the account that queueing takes (`jobs.sql.LOCK_ACCOUNT`).
"""

from datetime import datetime
from decimal import Decimal

from jobs.models import TextRequest
from kudos import rates, sizes
from kudos.sql import WALLETS

REQUESTS = TextRequest._meta.db_table
ACTIVE = TextRequest.State.ACTIVE.value

# What the account's active requests hold (their cost less what their generations were charged).
HELD_SQL = f"""(SELECT COALESCE(sum(GREATEST(h.kudos_reserved - h.kudos_spent, 0)), 0)
               FROM {REQUESTS} AS h WHERE h.account_id = %(account_id)s AND h.state = '{ACTIVE}')"""

# The AI Horde's bounds on the tokens a request may ask for without kudos upfront.
UPFRONT_TOKENS_BASE = 512
UPFRONT_TOKENS_FLOOR = 256


def priority_sql(balance: str) -> str:
    """A request's priority: its account's balance when it was queued, as a whole number."""
    return f"LEAST(GREATEST(round({balance}), -2147483648), 2147483647)::integer"


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
    from jobs import discovery

    load = discovery.performance(now=now)
    tokens = upfront_tokens(queued_requests=load["queued_text_requests"], threads=load["text_thread_count"])
    return (not slow_workers or max_length > tokens), tokens


def available_sql() -> str:
    """What the account (%(account_id)s, its floor %(floor)s) can spend now: its balance less its
    floor less what its active requests hold. Read under `jobs.sql.LOCK_ACCOUNT`."""
    return f"""
        SELECT COALESCE((SELECT w.balance FROM {WALLETS} AS w
                         WHERE w.account_id = %(account_id)s AND NOT w.escrow), 0)
               - %(floor)s - {HELD_SQL}
    """
