"""The kudos model table, and the ledger: read-only, newest first, by account and kind."""

from django.contrib import admin

from kudos import sizes
from kudos.models import Posting, TextModel


@admin.register(TextModel)
class TextModelAdmin(admin.ModelAdmin):
    list_display = ("name", "billions")
    search_fields = ("name",)
    fields = ("name", "parameters")

    @admin.display(description="billions of parameters", ordering="parameters")
    def billions(self, model: TextModel) -> str:
        return f"{model.parameters / 1e9:g}"

    def save_model(self, request, obj, form, change) -> None:
        super().save_model(request, obj, form, change)
        sizes.forget()


@admin.register(Posting)
class LedgerAdmin(admin.ModelAdmin):
    """Every posting, newest first; `?wallet__account__id__exact=N` for one account's."""

    list_display = ("id", "when", "kind", "key", "wallet", "amount", "reason")
    list_filter = ("event__kind", "wallet__escrow", "wallet__system")
    list_select_related = ("event", "wallet")
    search_fields = ("=wallet__account__name", "=event__key")
    ordering = ("-id",)
    show_full_result_count = False

    def lookup_allowed(self, lookup, value, request=None) -> bool:
        return lookup == "wallet__account__id__exact" or super().lookup_allowed(lookup, value, request)

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # append-only: a correction is a new event

    @admin.display(description="when (UTC)", ordering="event__created_at")
    def when(self, posting: Posting) -> str:
        return posting.event.created_at.strftime("%Y-%m-%d %H:%M:%S")

    @admin.display(description="kind", ordering="event__kind")
    def kind(self, posting: Posting) -> str:
        return posting.event.get_kind_display()

    @admin.display(description="key")
    def key(self, posting: Posting) -> str:
        return posting.event.key

    @admin.display(description="reason")
    def reason(self, posting: Posting) -> str:
        return posting.event.reason
