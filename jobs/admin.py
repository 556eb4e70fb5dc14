from datetime import UTC, datetime

from django.contrib import admin
from django.db.models import F
from django.utils import timezone
from django.utils.html import format_html

from jobs.models import Generation, SecondsAfter, TextRequest


class LeaseFilter(admin.SimpleListFilter):
    title = "lease"
    parameter_name = "lease"

    def lookups(self, request, model_admin):
        return (("live", "Live"), ("lapsed", "Lapsed, not yet aborted"), ("aborted", "Aborted as stale"))

    def queryset(self, request, queryset):
        now = timezone.now()
        if self.value() == "live":
            return queryset.processing().exclude(pk__in=Generation.objects.stale(now).values("pk"))
        if self.value() == "lapsed":
            return queryset.filter(pk__in=Generation.objects.stale(now).values("pk"))
        if self.value() == "aborted":
            return queryset.filter(state=Generation.State.ABORTED)
        return queryset


def _moment(when: datetime) -> str:
    # To the second, as leases are counted; the year is noise in a list of live jobs.
    return when.astimezone(UTC).strftime("%m-%d %H:%M:%S")


class CapacityFilter(admin.SimpleListFilter):
    """The speed gate's exceptions: jobs given beyond a worker's capacity, and pops by workers
    that declare more than they can produce; the generation's state is the outcome."""

    title = "capacity"
    parameter_name = "capacity"

    def lookups(self, request, model_admin):
        return (
            ("over", "Over-capacity assignment (tier 2 or 3)"),
            ("limited", "Capacity-limited pop"),
        )

    def queryset(self, request, queryset):
        if self.value() == "over":
            return queryset.over_capacity()
        if self.value() == "limited":
            return queryset.filter(capacity_limited=True)
        return queryset


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
        "short_id",
        "state",
        "worker",
        "seconds_left",
        "lease_end",
        "cap_seconds",
        "renewals",
        "trusted_at_pop",
        "popped",
        "model",
        "capacity_at_pop",
        "fallback_tier",
        "capacity_limited",
    )
    list_filter = (LeaseFilter, CapacityFilter, "state", "fallback_tier", "trusted_at_pop")
    list_select_related = ("worker",)
    search_fields = ("=id",)
    # The response text is the requester's: not shown. Settlement information is read-only.
    exclude = ("text",)
    readonly_fields = tuple(
        f.name for f in Generation._meta.get_fields() if f.concrete and f.name not in ("text",)
    )
    show_full_result_count = False

    class Media:
        # Counts the seconds-left column down between page loads.
        js = ("jobs/lease_countdown.js",)

    def has_add_permission(self, request) -> bool:
        return False

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(lease_end_at=SecondsAfter(F("popped_at"), F("job_ttl")))

    @admin.display(description="id", ordering="id")
    def short_id(self, generation: Generation) -> str:
        return str(generation.id)[:8]

    @admin.display(description="popped (UTC)", ordering="popped_at")
    def popped(self, generation: Generation) -> str:
        return _moment(generation.popped_at)

    @admin.display(description="lease end (UTC)", ordering="lease_end_at")
    def lease_end(self, generation: Generation) -> str:
        return _moment(generation.lease_expires_at)

    @admin.display(description="seconds left")
    def seconds_left(self, generation: Generation) -> str:
        if generation.state != Generation.State.PROCESSING:
            return "-"
        left = max(0, int((generation.lease_expires_at - timezone.now()).total_seconds()))
        # The script counts down from the server's figure, so the browser's clock never matters.
        return format_html('<span class="lease-seconds-left" data-seconds-left="{}">{}</span>', left, left)
