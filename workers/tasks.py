from celery import shared_task


@shared_task
def publish_address_timeouts_task() -> int:
    from hordeops import clock
    from workers.services import publish_address_timeouts

    return publish_address_timeouts(now=clock.now())
