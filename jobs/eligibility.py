"""Which workers may be offered which requests: the one rule the pop and the status share.

The speed gate (docs/reference/worker_protocol.md):

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
  named or blocked workers, a validated bridge, slow workers, maintenance, chat, the
  capabilities the job needs)
  and no worker of a better tier that passes them too is online. So the fallback is ordered:
  tier 2 only when no tier 1 is online, tier 3 only when neither is.

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
from workers.declaration import CAPABILITIES
from workers.models import Account, Worker

TEXT = TextRequest.Kind.TEXT.value  # a legacy text job: the gate does not apply
# Below this a worker is slow: a request with `slow_workers: false` is not offered to it (the
# AI Horde's floor for text workers).
SLOW_WORKER_TOKENS_PER_SECOND = 2


def params(now: datetime) -> dict[str, Any]:
    """The values the SQL below refers to."""
    return {
        "now": now,
        "online_since": online_since(now),
        "unmeasured": settings.UNMEASURED_TEXT_WORKER_TOKENS_PER_SECOND,
        "slow_floor": SLOW_WORKER_TOKENS_PER_SECOND,
        "window": lease_window_seconds(),
        "trusted_window": generating_seconds(settings.TRUSTED_TEXT_JOB_LEASE_CAP_SECONDS),
        "untrusted_window": generating_seconds(settings.UNTRUSTED_TEXT_JOB_LEASE_CAP_SECONDS),
        "validated_bridges": settings.VALIDATED_BRIDGE_AGENTS,
    }


def tier_sql(r: str, w: str, wa: str) -> str:
    """1, 2 or 3 as above; always 1 for a legacy text job."""
    speed = f"coalesce({w}.speed, %(unmeasured)s)"
    cap_window = f"(CASE WHEN {wa}.trusted THEN %(trusted_window)s ELSE %(untrusted_window)s END)"
    return (
        f"(CASE WHEN {r}.kind = '{TEXT}' OR {speed} * %(window)s >= {r}.max_length THEN 1"
        f" WHEN {speed} * {cap_window} >= {r}.max_length THEN 2 ELSE 3 END)"
    )


def validated_sql(w: str) -> str:
    """Is worker `w`'s bridge one the horde validates? Its `bridge_agent` is `name:version:url`,
    and its name is in VALIDATED_BRIDGE_AGENTS (`kudos.rates.is_validated`, the same test in
    Python; the AI Horde's `is_backed_validated`)."""
    return (
        f"(split_part({w}.bridge_agent, ':', 1) = ANY(%(validated_bridges)s::varchar[])"
        f" AND {w}.bridge_agent ~ '^[^:]*:[^:]*:')"
    )


def capable_sql(r: str, w: str) -> str:
    """Does worker `w` declare every capability request `r` needs (tools, structured output)?"""
    return " AND ".join(f"(NOT {r}.needs_{name} OR {w}.{name})" for name in CAPABILITIES)


def _filters(r: str, w: str, wa: str, *, shape: str = "") -> list[tuple[str | None, str]]:
    """The plain filters, each with the AI Horde's name for a request it passes over (None:
    one the AI Horde does not report, maintenance, or a kind the worker does not see).

    `shape` ("popper" or "better"): the filters of a shape of requests (`shape_offer_sql`),
    which has no account, named workers or `slow_workers`. The popping worker passes the
    maintenance and speed filters (a request of its own account, or one that welcomes slow
    workers, may have the shape), a worker that would gate it only when it is not in
    maintenance and not slow (so that it gates every request of the shape)."""
    maintenance = {
        "": f"(NOT {w}.maintenance OR {w}.account_id = {r}.account_id)",
        "popper": "true",
        "better": f"NOT {w}.maintenance",
    }[shape]
    fast = f"coalesce({w}.speed, %(unmeasured)s) >= %(slow_floor)s"
    named = f"({w}.id = ANY({r}.allowed_workers))"
    slow = {"": f"({r}.slow_workers OR {fast})", "popper": "true", "better": fast}[shape]
    # A shape does not say what its requests need: the popper may be offered some of them, and
    # a worker gates them all only when it declares every capability.
    capable = {
        "": capable_sql(r, w),
        "popper": "true",
        "better": " AND ".join(f"{w}.{name}" for name in CAPABILITIES),
    }[shape]
    # Nor whether they need a validated bridge: the same reasoning.
    validated = {
        "": f"(NOT {r}.validated_backends OR {validated_sql(w)})",
        "popper": "true",
        "better": validated_sql(w),
    }[shape]
    filters = [
        ("max_length", f"{r}.max_length <= {w}.max_length"),
        ("max_context_length", f"{r}.max_context_length <= {w}.max_context_length"),
        ("models", f"(cardinality({r}.requested_models) = 0 OR {r}.requested_models && {w}.served_models)"),
        ("worker_id", f"(cardinality({r}.allowed_workers) = 0 OR {named} <> {r}.worker_blacklist)"),
        ("untrusted", f"(NOT {r}.trusted_workers OR {wa}.trusted)"),
        ("bridge_version", validated),
        ("performance", slow),
        (None, maintenance),
        (None, f"({r}.kind = '{TEXT}' OR {w}.chat)"),
        (None, capable),
    ]
    return [(reason, condition) for reason, condition in filters if not (shape and reason == "worker_id")]


def filters_sql(r: str, w: str, wa: str, *, shape: str = "") -> str:
    """The plain filters: could this worker serve this request at all?"""
    return " AND ".join(condition for _, condition in _filters(r, w, wa, shape=shape))


# Why a worker that was offered nothing was passed over, in the AI Horde's words (its pop's
# `skipped`): the first plain filter that fails, else the speed gate (a better tier is online),
# a request refusing slow workers, or another pop's lock.
# In this order: a request that fails several filters counts under the first (a model the worker
# does not serve says more than its lengths).
SKIP_REASONS = (
    "models",
    "max_length",
    "max_context_length",
    "worker_id",
    "untrusted",
    "bridge_version",  # the AI Horde's reason for a request that needs a validated bridge
    "performance",
)


def skip_reason_sql(r: str, w: str, wa: str) -> str:
    """Which of SKIP_REASONS passed request `r` over for worker `w`: `filters_sql` taken apart."""
    conditions = {reason: condition for reason, condition in _filters(r, w, wa) if reason}
    whens = " ".join(f"WHEN NOT {conditions[reason]} THEN '{reason}'" for reason in SKIP_REASONS[:-1])
    return f"(CASE {whens} ELSE 'performance' END)"


def offer_sql(r: str = "r", w: str = "w", wa: str = "wa") -> str:
    """May worker `w` be offered request `r` now? Filters, then the tiered speed gate."""
    return _offer_sql(r, w, wa, shape=False)


def shape_offer_sql(s: str, w: str = "w", wa: str = "wa") -> str:
    """Could worker `w` be offered some request of shape `s` that names no workers? The same
    rule over a shape's columns (`jobs.models.QUEUE_SHAPE`, and `requested_models`: the one
    model the shape is queued under): false only where `offer_sql` is false for every such
    request, so that a pop may pass the shape by without reading its requests. Where it is
    true, each request is still decided by `offer_sql`."""
    return _offer_sql(s, w, wa, shape=True)


def _offer_sql(r: str, w: str, wa: str, *, shape: bool) -> str:
    better = (
        f"SELECT 1 FROM {Worker._meta.db_table} AS v JOIN {Account._meta.db_table} AS va"
        f" ON va.id = v.account_id"
        f" WHERE {ONLINE_SQL.format(w='v')} AND {filters_sql(r, 'v', 'va', shape='better' if shape else '')}"
        f" AND {tier_sql(r, 'v', 'va')} < {tier_sql(r, w, wa)}"
    )
    mine = filters_sql(r, w, wa, shape="popper" if shape else "")
    if not shape:  # a shape has no preferred worker: its requests are each decided by this rule
        mine += f" AND {preferred_sql(r, w)}"
    return f"({mine} AND ({tier_sql(r, w, wa)} = 1 OR NOT EXISTS ({better})))"


def preferred_sql(r: str, w: str) -> str:
    """The next turn of a conversation is the warm worker's alone until its time is up
    (`jobs.affinity`). Only the popping worker's test: the speed gate still weighs every
    worker online, as the preference is set only where the warm one passes it."""
    return (
        f"({r}.preferred_worker IS NULL OR {r}.preferred_worker = {w}.id OR {r}.preferred_until <= %(now)s)"
    )
