from django.apps import AppConfig


class WorkersConfig(AppConfig):
    name = "workers"
    verbose_name = "Accounts and workers"

    def ready(self) -> None:
        from workers import metrics

        metrics.register()
