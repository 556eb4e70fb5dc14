from django.apps import AppConfig


class WorkersConfig(AppConfig):
    name = "workers"
    verbose_name = "Accounts and workers"

    def ready(self) -> None:
        from django.db.models.signals import post_delete, post_save

        from hordeops import ratelimit
        from workers import messages, metrics, modes, proxies
        from workers.models import Account, HordeModes, WorkerMessage

        metrics.register()
        ratelimit.register_proxy_passkeys(proxies.is_known_passkey)
        post_save.connect(proxies.forget, sender=Account, dispatch_uid="workers-proxies-forget")
        post_save.connect(modes.forget, sender=HordeModes, dispatch_uid="workers-modes-forget")
        post_save.connect(messages.forget, sender=WorkerMessage, dispatch_uid="workers-messages-saved")
        post_delete.connect(messages.forget, sender=WorkerMessage, dispatch_uid="workers-messages-deleted")
