"""What the operations page shows: the horde right now and its last hour, minute by minute.

Counts of rows come from PostgreSQL (each over an index); the last hour's renewals, stale
aborts and capacity-limited pops come from the per-minute counters in Redis that every web
and Celery process adds to (`hordeops.metrics`). Reads only: nothing here changes a row.
"""

from dataclasses import dataclass
from datetime import UTC, datetime

from django.db.models import Count, Sum

from hordeops import metrics
from jobs.models import Generation, TextRequest
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
class Operations:
    now: datetime
    processing: int
    lapsed: int
    queue: list[QueueDepth]
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


def snapshot(*, now: datetime) -> Operations:
    queued = {
        row["kind"]: row
        for row in TextRequest.objects.queued()
        .order_by()
        .values("kind")
        .annotate(requests=Count("pk"), jobs=Sum("queued"))
    }
    counts = metrics.per_minute(now=now, minutes=MINUTES)
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
        workers_online=Worker.objects.online(now).count(),
        capacity_limited_online=capacity_limited_online(now=now),
        series=[
            _series("Lease renewals granted", metrics.LEASE_RENEWALS, counts, outcome="granted"),
            _series("Progress held at the cap", metrics.LEASE_RENEWALS, counts, outcome="at_cap"),
            _series("Stale aborts", metrics.STALE_ABORTS, counts),
            _series("Capacity-limited pops", metrics.POP_LEASE_CAPACITY_LIMITED, counts),
        ],
        counting_since=datetime.fromtimestamp(metrics.counting_since(now=now), tz=UTC),
    )
