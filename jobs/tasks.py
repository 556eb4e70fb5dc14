from celery import shared_task


@shared_task
def abort_stale_generations_task() -> int:
    from jobs.services import abort_stale_generations

    return abort_stale_generations().aborted
