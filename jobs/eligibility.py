"""Which workers may be offered which requests: the one rule the pop and the status share.

Seed 000 and the decisions it cites (contract section 7):

- A worker's capacity is `speed x (TEXT_JOB_LEASE_SECONDS - TEXT_JOB_PREPARATION_SECONDS)`
  tokens, its speed taken as UNMEASURED_TEXT_WORKER_TOKENS_PER_SECOND until measured
  (`workers.capacity`, the worker's half of the rule).
- For a chat job a worker is in one of three tiers:
    1. its capacity covers the job's max_length (it can finish inside the base lease);
    2. it cannot, but its capacity within its own cap, `speed x (cap - preparation)`, does
       (a fast enough worker that streams progress finishes before its cap);
    3. it cannot finish even within its cap.
  A legacy text job puts every worker in tier 1: the gate does not apply to it.
- A worker is offered a job when it passes the job's plain filters (model, lengths, trust,
  named workers, maintenance, chat) and no worker of a better tier that passes them too is
  online. So the fallback is ordered: tier 2 only when no tier 1 is online, tier 3 only when
  neither is.

The rule is written once, as SQL over a request row `r` and a worker row `w` with its account
`wa`. The pop evaluates it for one worker across the queue; the status evaluates it for one
request across the fleet (both statements are in `jobs.sql`); neither has a copy of its own.
It lives in `jobs`, the app that owns the pop, because it reads requests as much as workers;
`workers` knows nothing of it.
"""

from datetime import datetime
from typing import Any

from django.conf import settings

from jobs.models import TextRequest
from workers.capacity import ONLINE_SQL, generating_seconds, lease_window_seconds, online_since
from workers.models import Account, Worker

TEXT = TextRequest.Kind.TEXT.value  # a legacy text job: the gate does not apply


def params(now: datetime) -> dict[str, Any]:
    """The values the SQL below refers to."""
    return {
        "online_since": online_since(now),
        "unmeasured": settings.UNMEASURED_TEXT_WORKER_TOKENS_PER_SECOND,
        "window": lease_window_seconds(),
        "trusted_window": generating_seconds(settings.TRUSTED_TEXT_JOB_LEASE_CAP_SECONDS),
        "untrusted_window": generating_seconds(settings.UNTRUSTED_TEXT_JOB_LEASE_CAP_SECONDS),
    }


def tier_sql(r: str, w: str, wa: str) -> str:
    """1, 2 or 3 as above; always 1 for a legacy text job."""
    speed = f"coalesce({w}.speed, %(unmeasured)s)"
    cap_window = f"(CASE WHEN {wa}.trusted THEN %(trusted_window)s ELSE %(untrusted_window)s END)"
    return (
        f"(CASE WHEN {r}.kind = '{TEXT}' OR {speed} * %(window)s >= {r}.max_length THEN 1"
        f" WHEN {speed} * {cap_window} >= {r}.max_length THEN 2 ELSE 3 END)"
    )


def filters_sql(r: str, w: str, wa: str) -> str:
    """The plain filters: could this worker serve this request at all?"""
    return (
        f"{r}.max_length <= {w}.max_length"
        f" AND {r}.max_context_length <= {w}.max_context_length"
        f" AND (cardinality({r}.requested_models) = 0 OR {r}.requested_models && {w}.served_models)"
        f" AND (cardinality({r}.allowed_workers) = 0 OR {w}.id = ANY({r}.allowed_workers))"
        f" AND (NOT {r}.trusted_workers OR {wa}.trusted)"
        f" AND (NOT {w}.maintenance OR {w}.account_id = {r}.account_id)"
        f" AND ({r}.kind = '{TEXT}' OR {w}.chat)"
    )


# Why a worker that passes no offer was passed over, in the AI Horde's words (its pop's
# `skipped`): the first of the plain filters above it fails, else the speed gate (a better
# tier is online) or another pop's lock.
SKIP_REASONS = ("models", "max_length", "max_context_length", "worker_id", "untrusted", "performance")


def skip_reason_sql(r: str, w: str, wa: str) -> str:
    """Which of SKIP_REASONS passed request `r` over for worker `w`: `filters_sql` taken apart."""
    return (
        f"(CASE WHEN NOT (cardinality({r}.requested_models) = 0 OR {r}.requested_models && {w}.served_models)"
        f" THEN 'models' WHEN {r}.max_length > {w}.max_length THEN 'max_length'"
        f" WHEN {r}.max_context_length > {w}.max_context_length THEN 'max_context_length'"
        f" WHEN NOT (cardinality({r}.allowed_workers) = 0 OR {w}.id = ANY({r}.allowed_workers))"
        f" THEN 'worker_id'"
        f" WHEN {r}.trusted_workers AND NOT {wa}.trusted THEN 'untrusted' ELSE 'performance' END)"
    )


def offer_sql(r: str = "r", w: str = "w", wa: str = "wa") -> str:
    """May worker `w` be offered request `r` now? Filters, then the tiered speed gate."""
    better = (
        f"SELECT 1 FROM {Worker._meta.db_table} AS v JOIN {Account._meta.db_table} AS va"
        f" ON va.id = v.account_id"
        f" WHERE {ONLINE_SQL.format(w='v')} AND {filters_sql(r, 'v', 'va')}"
        f" AND {tier_sql(r, 'v', 'va')} < {tier_sql(r, w, wa)}"
    )
    return f"({filters_sql(r, w, wa)} AND ({tier_sql(r, w, wa)} = 1 OR NOT EXISTS ({better})))"
