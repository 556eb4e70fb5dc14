"""The accounts' shared keys, as moderators see them: read only (budgets and caps are their
owners' to set, through the routes or the account page, under those rules), deleted through
the service that deletes an owner's, so a deleted key is refused on every route at once."""

from uuid import UUID

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html

from front.admin.shown import full_moment, short_id
from workers import shared_keys
from workers.models import SharedKey

_UNLIMITED = {SharedKey.UNLIMITED: "unlimited"}


def _amount(value) -> str:
    return _UNLIMITED.get(value, f"{value:,.2f}")


@admin.register(SharedKey)
class SharedKeyAdmin(admin.ModelAdmin):
    list_display = ("key", "name", "owner", "kudos_left", "used", "expires", "max_tokens", "created")
    list_display_links = ("key",)
    list_select_related = ("account",)
    # By the owner's name or the key's name; a whole key id finds its key (`get_search_results`).
    search_fields = ("account__name", "name")
    ordering = ("-created_at",)
    fields = ("id", "name", "owner", "kudos_left", "used", "expires", "max_tokens", "created")
    readonly_fields = fields
    show_full_result_count = False

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def get_search_results(self, request, queryset, search_term):
        try:
            key_id = UUID(search_term.strip())
        except ValueError:
            return super().get_search_results(request, queryset, search_term)
        return queryset.filter(pk=key_id), False

    def delete_model(self, request, obj: SharedKey) -> None:
        shared_keys.delete_shared_keys(key_ids=[obj.pk])

    def delete_queryset(self, request, queryset) -> None:
        shared_keys.delete_shared_keys(key_ids=list(queryset.values_list("pk", flat=True)))

    @admin.display(description="key", ordering="id")
    def key(self, key: SharedKey) -> str:
        return short_id(key.pk)

    @admin.display(description="owner", ordering="account__name")
    def owner(self, key: SharedKey) -> str:
        url = reverse("admin:workers_account_change", args=[key.account_id])
        return format_html('<a href="{}">{}#{}</a>', url, key.account.name, key.account_id)

    @admin.display(description="kudos left", ordering="kudos")
    def kudos_left(self, key: SharedKey) -> str:
        return _amount(key.kudos)

    @admin.display(description="used", ordering="utilized")
    def used(self, key: SharedKey) -> str:
        return _amount(key.utilized)

    @admin.display(description="expires (UTC)", ordering="expiry")
    def expires(self, key: SharedKey) -> str:
        return "never" if key.expiry is None else full_moment(key.expiry)

    @admin.display(description="max tokens", ordering="max_text_tokens")
    def max_tokens(self, key: SharedKey) -> str:
        return _UNLIMITED.get(key.max_text_tokens, str(key.max_text_tokens))

    @admin.display(description="created (UTC)", ordering="created_at")
    def created(self, key: SharedKey) -> str:
        return full_moment(key.created_at)
