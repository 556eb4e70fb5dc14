from django.contrib import admin

from jobs.models import Generation, TextRequest


@admin.register(TextRequest)
class TextRequestAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "kind",
        "state",
        "account",
        "max_length",
        "n",
        "queued",
        "finished",
        "restarts",
        "created_at",
    )
    list_filter = ("kind", "state")
    list_select_related = ("account",)
    search_fields = ("=id",)
    # The prompt and messages are the requester's text: not shown to moderators.
    exclude = ("prompt", "messages")
    readonly_fields = ("stream_generation", "deadline_at", "expires_at", "created_at")
    raw_id_fields = ("account",)
    show_full_result_count = False


@admin.register(Generation)
class GenerationAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "state",
        "worker",
        "model",
        "popped_at",
        "job_ttl",
        "cap_seconds",
        "renewals",
        "trusted_at_pop",
        "fallback_tier",
    )
    list_filter = ("state", "fallback_tier", "trusted_at_pop", "capacity_limited")
    list_select_related = ("worker",)
    search_fields = ("=id",)
    # The response text is the requester's: not shown. Settlement information is read-only.
    exclude = ("text",)
    readonly_fields = tuple(
        f.name for f in Generation._meta.get_fields() if f.concrete and f.name not in ("text",)
    )
    show_full_result_count = False

    def has_add_permission(self, request) -> bool:
        return False
