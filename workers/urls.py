from django.urls import path, re_path

from workers import views

urlpatterns = [
    path("workers", views.WorkersView.as_view(), name="workers"),
    # Before `workers/{id}`, which would read "goodbye" as an id.
    path("workers/goodbye", views.WorkerGoodbyeView.as_view(), name="worker-goodbye"),
    re_path(r"^workers/name/(?P<worker_name>.*)$", views.WorkerByNameView.as_view(), name="worker-by-name"),
    re_path(r"^workers/(?P<worker_id>[^/]*)$", views.WorkerView.as_view(), name="worker"),
    path("teams", views.TeamsView.as_view(), name="teams"),
    re_path(r"^teams/(?P<team_id>[^/]*)$", views.TeamView.as_view(), name="team"),
    path("sharedkeys", views.SharedKeysView.as_view(), name="sharedkeys"),
    re_path(r"^sharedkeys/(?P<sharedkey_id>[^/]*)$", views.SharedKeyView.as_view(), name="sharedkey"),
    path("operations/ipaddr", views.OperationsIPView.as_view(), name="operations-ipaddr"),
    re_path(
        r"^operations/block_worker_ipaddr/(?P<worker_id>[^/]*)$",
        views.OperationsBlockWorkerIPView.as_view(),
        name="operations-block-worker-ip",
    ),
    re_path(
        r"^operations/ipaddr/(?P<ipaddr>.+)$", views.OperationsIPSingleView.as_view(), name="operations-ip"
    ),
]
