"""The workers' gauge on `/metrics`, read from the database at scrape time."""

from datetime import datetime

from hordeops import metrics

CAPACITY_LIMITED_ONLINE = "horde_workers_capacity_limited_online"


def capacity_limited_online(*, now: datetime) -> int:
    """Online chat workers whose capacity is below the max_length they declare, now."""
    from workers.models import Worker

    return Worker.objects.online(now).capacity_limited().count()


def register() -> None:
    """The capacity-limited workers online now: a gauge, beside the counter of their pops
    (`horde_pop_lease_capacity_limited`, the speed gate's), which counts every poll of such a
    worker, so that one slow worker polling idle adds 30 a minute."""
    gauge = metrics.DatabaseGauge(
        CAPACITY_LIMITED_ONLINE,
        "Online chat workers whose capacity (speed x lease window) is below the max_length they declare.",
        lambda now: {(): capacity_limited_online(now=now)},
    )
    metrics.register_gauge(gauge)
