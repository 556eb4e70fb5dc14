from django.urls import path, re_path

from jobs import views

urlpatterns = [
    path("generate/text/async", views.TextAsyncView.as_view(), name="text-async"),
    # Any segment, even empty: a malformed id is an unknown request (RequestNotFound).
    re_path(
        r"^generate/text/status/(?P<request_id>[^/]*)$", views.TextStatusView.as_view(), name="text-status"
    ),
    path("generate/text/pop", views.TextPopView.as_view(), name="text-pop"),
    path("generate/text/progress", views.TextProgressView.as_view(), name="text-progress"),
    path("generate/text/submit", views.TextSubmitView.as_view(), name="text-submit"),
    path("status/models", views.ModelsStatusView.as_view(), name="status-models"),
    re_path(r"^status/models/(?P<model_name>.+)$", views.ModelStatusView.as_view(), name="status-model"),
    path("status/performance", views.PerformanceView.as_view(), name="status-performance"),
    path("stats/text/totals", views.TextTotalsView.as_view(), name="stats-text-totals"),
    path("stats/text/models", views.TextModelStatsView.as_view(), name="stats-text-models"),
]
