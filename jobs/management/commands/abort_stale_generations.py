from django.core.management.base import BaseCommand

from jobs.services import abort_stale_generations


class Command(BaseCommand):
    help = "Run one stale pass: expire old requests and abort generations past their lease."

    def handle(self, *args, **options) -> None:
        result = abort_stale_generations()
        if not result.ran:
            self.stdout.write("Another stale pass is running; nothing done.")
            return
        self.stdout.write(
            f"Aborted {result.aborted} stale generations; expired {result.expired_requests} "
            f"requests ({result.cancelled_by_expiry} generations cancelled); "
            f"{len(result.maintenance)} workers in maintenance."
        )
