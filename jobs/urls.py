from django.urls import path, re_path

from jobs import style_views, views

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
    path("styles/text", style_views.TextStylesView.as_view(), name="styles-text"),
    re_path(r"^styles/text/(?P<style_id>[^/]*)$", style_views.TextStyleView.as_view(), name="style-text"),
    re_path(
        r"^styles/text_by_name/(?P<style_name>.+)$",
        style_views.TextStyleByNameView.as_view(),
        name="style-text-by-name",
    ),
    path("collections", style_views.CollectionsView.as_view(), name="collections"),
    re_path(
        r"^collections/(?P<collection_id>[^/]*)$", style_views.CollectionView.as_view(), name="collection"
    ),
    re_path(
        r"^collection_by_name/(?P<collection_name>.+)$",
        style_views.CollectionByNameView.as_view(),
        name="collection-by-name",
    ),
]
