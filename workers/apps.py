from django.apps import AppConfig


class WorkersConfig(AppConfig):
    name = "workers"
    verbose_name = "Accounts and workers"

    def ready(self) -> None:
        from django.db.models.signals import post_save

        from workers import metrics, modes
        from workers.models import HordeModes

        metrics.register()
        post_save.connect(modes.forget, sender=HordeModes, dispatch_uid="workers-modes-forget")
