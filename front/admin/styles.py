"""Text styles and their collections, as moderators see them: unlisted (`public`), marked NSFW
or deleted, as an AI Horde moderator deletes any (a deleted style leaves its collections).
Their owners make and change them through the routes (`workers.styles`), not here; a superuser
may change anything."""

from django.contrib import admin

from front.admin.shown import ModeratedFieldsMixin
from workers.models import Style, StyleCollection


class _Owned(ModeratedFieldsMixin, admin.ModelAdmin):
    list_select_related = ("owner",)
    search_fields = ("name", "owner__name")
    list_filter = ("public",)
    ordering = ("name",)
    show_full_result_count = False

    def has_add_permission(self, request) -> bool:
        return False


@admin.register(Style)
class StyleAdmin(_Owned):
    list_display = ("name", "owner", "public", "nsfw", "use_count", "created_at")
    list_filter = ("public", "nsfw")
    fields = (
        "id",
        "name",
        "owner",
        "info",
        "prompt",
        "params",
        "model_names",
        "tags",
        "public",
        "nsfw",
        "use_count",
        "created_at",
    )
    readonly_fields = ("id", "owner", "use_count", "created_at")
    moderated_fields = ("public", "nsfw")


@admin.register(StyleCollection)
class StyleCollectionAdmin(_Owned):
    list_display = ("name", "owner", "public", "use_count", "created_at")
    fields = ("id", "name", "owner", "info", "public", "styles", "use_count", "created_at")
    readonly_fields = ("id", "owner", "use_count", "created_at")
    moderated_fields = ("public",)
    raw_id_fields = ("styles",)
