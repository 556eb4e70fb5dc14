from django.apps import AppConfig


class WorkersConfig(AppConfig):
    name = "workers"
    verbose_name = "Accounts and workers"

    def ready(self) -> None:
        from django.db.models.signals import post_delete, post_save

        from workers import messages, metrics, modes
        from workers.models import HordeModes, WorkerMessage

        metrics.register()
        post_save.connect(modes.forget, sender=HordeModes, dispatch_uid="workers-modes-forget")
        post_save.connect(messages.forget, sender=WorkerMessage, dispatch_uid="workers-messages-saved")
        post_delete.connect(messages.forget, sender=WorkerMessage, dispatch_uid="workers-messages-deleted")
