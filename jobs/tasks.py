from uuid import UUID

from celery import shared_task


@shared_task
def abort_stale_generations_task() -> int:
    from jobs.services import abort_stale_generations

    return abort_stale_generations().aborted


@shared_task
def deliver_webhook_task(generation_id: str, attempt: int = 1) -> str:
    """One try of a done generation's webhook, queued on WEBHOOK_QUEUE (`jobs.webhooks`)."""
    from jobs import webhooks

    return webhooks.deliver(generation_id=UUID(generation_id), attempt=attempt).value
