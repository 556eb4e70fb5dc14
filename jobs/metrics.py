"""The queue's gauge on `/metrics`, read from the database at scrape time: how long the oldest
waiting request of each model has waited.

A request may name any model, so the models are labelled only where an online worker serves
them; the oldest request for a model no online worker serves is `unserved`, and one that names
no model is `any` (0 while none waits, so that the gauge is never empty). Read from the queue's
own table (`QueuedModel`, one row per waiting request and model it names): one aggregate
statement per scrape.
"""

from datetime import datetime

from django.db.models import Min

from hordeops import metrics

QUEUE_OLDEST = "horde_text_queue_oldest_seconds"
ANY_MODEL, UNSERVED = "any", "unserved"


def oldest_waiting(*, now: datetime) -> dict[str, float]:
    """Seconds the oldest waiting request of each model has waited (see the module)."""
    from jobs.models import QueuedModel
    from workers.models import Worker

    served = {
        m for models in Worker.objects.online(now).values_list("served_models", flat=True) for m in models
    }
    oldest: dict[str, float] = {ANY_MODEL: 0.0}  # always exported: 0 while nothing waits
    for model, created_at in (
        QueuedModel.objects.values("model").annotate(first=Min("created_at")).values_list("model", "first")
    ):
        label = ANY_MODEL if model == "" else model if model in served else UNSERVED
        waited = max(0.0, (now - created_at).total_seconds())
        oldest[label] = max(oldest.get(label, 0.0), waited)
    return oldest


def register() -> None:
    gauge = metrics.DatabaseGauge(
        QUEUE_OLDEST,
        "Seconds the oldest waiting text request of each model has waited (models served by an "
        "online worker; 'any': names none; 'unserved': no online worker serves it).",
        lambda now: {(model,): seconds for model, seconds in oldest_waiting(now=now).items()},
        labels=["model"],
    )
    metrics.register_gauge(gauge)
