from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Requests and generations"

    def ready(self) -> None:
        from hordeops import api, metrics, stopping
        from jobs import metrics as queue_metrics
        from jobs import relay_hub, spending, waits
        from jobs.protocols import protocol_for_path
        from kudos import holds

        metrics.register()
        # The holds this app places are checked against its requests by `check_kudos`.
        holds.register_check(spending.check_holds)
        queue_metrics.register()
        # A web process that stops ends its open chat streams with their error event first.
        stopping.on_stop(relay_hub.stop_following)
        # ... and answers its waiting pops at once.
        stopping.on_stop(waits.stop_waiting)
        # The /v1 routes answer errors in their protocol's shape, wherever the error is raised
        # (the body limits, the rate limits, a 404 under /v1/).
        api.register_error_shape("/v1/", lambda path, err: protocol_for_path(path).error_response(err))
