from django.contrib import admin
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from front import documents, moderator_routes, worker_messages
from hordeops import api
from hordeops.views import HeartbeatView
from jobs import chat, chat_models

urlpatterns = [
    path("admin/", admin.site.urls),
    # The routes where a moderator's act is logged in the admin's history (`front`): before the
    # apps', which serve the rest.
    path("api/v2/status/modes", moderator_routes.ModesView.as_view(), name="status-modes"),
    re_path(r"^api/v2/users/(?P<user_id>[^/]*)$", moderator_routes.UserView.as_view(), name="user"),
    path("api/v2/kudos/award", moderator_routes.KudosAwardView.as_view(), name="kudos-award"),
    path("api/v2/", include("jobs.urls")),
    # Before `workers/{id}`, which would read "messages" as a worker's id.
    path("api/v2/workers/messages", worker_messages.WorkerMessagesView.as_view(), name="worker-messages"),
    re_path(
        r"^api/v2/workers/messages/(?P<message_id>[^/]*)$",
        worker_messages.WorkerMessageView.as_view(),
        name="worker-message",
    ),
    path("api/v2/", include("workers.urls")),
    path("api/v2/", include("kudos.urls")),
    path("api/v2/status/heartbeat", HeartbeatView.as_view(), name="heartbeat"),
    path("api/v2/status/news", documents.NewsView.as_view(), name="status-news"),
    path("api/v2/documents/terms", documents.TermsView.as_view(), name="documents-terms"),
    path("api/v2/documents/privacy", documents.PrivacyView.as_view(), name="documents-privacy"),
    path("api/v2/documents/sponsors", documents.SponsorsView.as_view(), name="documents-sponsors"),
    path(".well-known/serviceinfo", documents.serviceinfo, name="serviceinfo"),
    path("v1/chat/completions", chat.chat_completions, name="chat-completions"),
    path("v1/completions", chat.completions, name="completions"),
    path("v1/responses", chat.responses, name="responses"),
    path("v1/messages", chat.messages, name="messages"),
    path("v1/messages/count_tokens", chat.count_tokens, name="count-tokens"),
    path("v1/models", chat_models.models, name="models"),
    path("v1/models/<path:model_id>", chat_models.model, name="model"),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    # The schema to read and try, where the AI Horde serves its own (Swagger UI).
    path("api/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("", include("django_prometheus.urls")),
    path("oauth/", include("front.oauth_urls")),
    path("", include("front.urls")),
]

handler400 = api.bad_request
handler404 = api.not_found
handler500 = api.server_error
