from celery import shared_task


@shared_task
def kudos_pass_task() -> int:
    from kudos.passes import run_kudos_pass

    return run_kudos_pass().uptime_periods
