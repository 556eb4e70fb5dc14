"""What the horde tells people: its news (moderators write it) and its documents (the
operator's: terms, privacy, sponsors), served as they are saved by `front/documents.py`."""

from django.contrib import admin

from front.models import HordeDocument, Newspiece


@admin.register(Newspiece)
class NewspieceAdmin(admin.ModelAdmin):
    list_display = ("date_published", "title", "importance")
    list_filter = ("importance",)
    search_fields = ("title", "newspiece")
    date_hierarchy = "date_published"
    fields = ("date_published", "title", "importance", "newspiece", "tags", "more_info_urls")


@admin.register(HordeDocument)
class HordeDocumentAdmin(admin.ModelAdmin):
    """One row per document, written in both formats: a client asks for one of them."""

    list_display = ("kind", "updated_at")
    fields = ("kind", "html", "markdown", "updated_at")
    readonly_fields = ("updated_at",)

    def get_readonly_fields(self, request, obj=None):
        # A saved document keeps its kind: its route reads it by that.
        return ("kind", *self.readonly_fields) if obj is not None else self.readonly_fields
