from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Requests and generations"

    def ready(self) -> None:
        from hordeops import metrics

        metrics.register()
