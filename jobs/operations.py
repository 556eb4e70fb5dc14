"""What the operations page shows: the horde right now and its last hour, minute by minute.

Counts of rows come from PostgreSQL (each over an index); the last hour's renewals, stale
aborts and capacity-limited pops come from the per-minute counters in Redis that every web
and Celery process adds to (`hordeops.metrics`). Reads only: nothing here changes a row.
"""

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from urllib.parse import quote

from django.db.models import Count, Min, Q, Sum

from hordeops import metrics
from jobs.metrics import ANY_MODEL
from jobs.models import Generation, QueuedModel, TextRequest
from workers.metrics import capacity_limited_online
from workers.models import Worker

MINUTES = 60
CHART_WIDTH = 240
CHART_HEIGHT = 48


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    minute: int  # minutes ago
    count: int


@dataclass(frozen=True)
class Series:
    """One counter over the last hour, oldest minute first."""

    label: str
    counts: list[int]
    by_trust: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.counts)

    @property
    def peak(self) -> int:
        return max(self.counts, default=0)

    def bars(self) -> list[Bar]:
        """Bar geometry for a small SVG chart, scaled to the busiest minute."""
        step = CHART_WIDTH / max(len(self.counts), 1)
        scale = CHART_HEIGHT / self.peak if self.peak else 0
        bars = []
        for i, count in enumerate(self.counts):
            height = count * scale
            bars.append(
                Bar(
                    x=round(i * step, 2),
                    y=round(CHART_HEIGHT - height, 2),
                    width=round(step * 0.8, 2),
                    height=round(height, 2),
                    minute=len(self.counts) - 1 - i,
                    count=count,
                )
            )
        return bars


@dataclass(frozen=True)
class QueueDepth:
    kind: str
    requests: int
    jobs: int


@dataclass(frozen=True)
class QueueShare:
    """Waiting requests of one account, one model or one age: how many, their jobs, the oldest."""

    label: str
    requests: int
    jobs: int
    oldest_seconds: int
    link: str  # the requests list's query string that shows them


@dataclass(frozen=True)
class Operations:
    now: datetime
    processing: int
    lapsed: int
    queue: list[QueueDepth]
    by_account: list[QueueShare]
    by_model: list[QueueShare]
    by_age: list[QueueShare]
    workers_online: int
    capacity_limited_online: int
    series: list[Series]
    counting_since: datetime  # when Redis's totals started: a Redis restart starts them again


def _series(label: str, counter: metrics.HordeCounter, counts: dict[str, list[int]], **fixed: str) -> Series:
    """Sum a counter's label sets (those matching `fixed`) minute by minute, and by trust."""
    chosen = [
        labels
        for labels in counter.label_sets
        if all(dict(zip(counter.labels, labels, strict=True))[k] == v for k, v in fixed.items())
    ]
    rows = [counts[counter.field(*labels)] for labels in chosen]
    per_minute = [sum(column) for column in zip(*rows, strict=True)]
    by_trust: dict[str, int] = {}
    if "trust" in counter.labels:
        at = counter.labels.index("trust")
        for labels in chosen:
            by_trust[labels[at]] = by_trust.get(labels[at], 0) + sum(counts[counter.field(*labels)])
    return Series(label=label, counts=per_minute, by_trust=by_trust)


# How many accounts and models the breakdown names: the busiest.
BREAKDOWN_ROWS = 10
# Ages a waiting request falls in (upper bounds, seconds), the last open.
AGE_BUCKETS = (
    (60, "under a minute"),
    (300, "1 to 5 minutes"),
    (1200, "5 to 20 minutes"),
    (None, "over 20 minutes"),
)


def _waited(now: datetime, oldest: datetime | None) -> int:
    return 0 if oldest is None else max(0, int((now - oldest).total_seconds()))


def queue_breakdown(*, now: datetime) -> tuple[list[QueueShare], list[QueueShare], list[QueueShare]]:
    """The waiting requests by account and by model (the busiest, most requests first), and by
    age: who and what fills the queue, and how long it has waited."""
    waiting = TextRequest.objects.queued().order_by()
    accounts = (
        waiting.values("account_id", "account__name")
        .annotate(requests=Count("pk"), jobs=Sum("queued"), oldest=Min("created_at"))
        .order_by("-requests", "account__name")[:BREAKDOWN_ROWS]
    )
    by_account = [
        QueueShare(
            label=row["account__name"],
            requests=row["requests"],
            jobs=row["jobs"],
            oldest_seconds=_waited(now, row["oldest"]),
            link=f"account__id__exact={row['account_id']}&state__exact=active",
        )
        for row in accounts
    ]
    models = (
        QueuedModel.objects.values("model")
        .annotate(requests=Count("*"), oldest=Min("created_at"))
        .order_by("-requests", "model")[:BREAKDOWN_ROWS]
    )
    by_model = [
        QueueShare(
            label=row["model"] or "(any model)",
            requests=row["requests"],
            jobs=0,
            oldest_seconds=_waited(now, row["oldest"]),
            link=f"model={quote(row['model'] or ANY_MODEL)}&state__exact=active",
        )
        for row in models
    ]
    # Every age in one statement: a count, the jobs and the oldest of each bucket.
    buckets, younger_than = {}, None
    for n, (bound, _) in enumerate(AGE_BUCKETS):
        within = Q()
        if bound is not None:
            within &= Q(created_at__gt=now - timedelta(seconds=bound))
        if younger_than is not None:
            within &= Q(created_at__lte=now - timedelta(seconds=younger_than))
        buckets |= {
            f"requests_{n}": Count("pk", filter=within),
            f"jobs_{n}": Sum("queued", filter=within),
            f"oldest_{n}": Min("created_at", filter=within),
        }
        younger_than = bound
    totals = waiting.aggregate(**buckets)
    by_age = [
        QueueShare(
            label=label,
            requests=totals[f"requests_{n}"],
            jobs=totals[f"jobs_{n}"] or 0,
            oldest_seconds=_waited(now, totals[f"oldest_{n}"]),
            link="state__exact=active",
        )
        for n, (_, label) in enumerate(AGE_BUCKETS)
    ]
    return by_account, by_model, by_age


def snapshot(*, now: datetime) -> Operations:
    queued = {
        row["kind"]: row
        for row in TextRequest.objects.queued()
        .order_by()
        .values("kind")
        .annotate(requests=Count("pk"), jobs=Sum("queued"))
    }
    counts = metrics.per_minute(now=now, minutes=MINUTES)
    by_account, by_model, by_age = queue_breakdown(now=now)
    return Operations(
        now=now,
        processing=Generation.objects.processing().count(),
        lapsed=Generation.objects.stale(now).count(),
        queue=[
            QueueDepth(
                kind=label,
                requests=queued.get(kind, {}).get("requests", 0),
                jobs=queued.get(kind, {}).get("jobs", 0),
            )
            for kind, label in TextRequest.Kind.choices
        ],
        by_account=by_account,
        by_model=by_model,
        by_age=by_age,
        workers_online=Worker.objects.online(now).count(),
        capacity_limited_online=capacity_limited_online(now=now),
        series=[
            _series("Lease renewals granted", metrics.LEASE_RENEWALS, counts, outcome="granted"),
            _series("Progress held at the cap", metrics.LEASE_RENEWALS, counts, outcome="at_cap"),
            _series("Stale aborts", metrics.STALE_ABORTS, counts),
            _series("Capacity-limited pops", metrics.POP_LEASE_CAPACITY_LIMITED, counts),
            _series("Give-backs", metrics.GIVE_BACKS, counts),
            _series("429s (every reason)", metrics.REFUSALS_429, counts),
            _series("Timed-out addresses refused", metrics.TIMED_OUT_REFUSALS, counts),
        ],
        counting_since=datetime.fromtimestamp(metrics.counting_since(now=now), tz=UTC),
    )
