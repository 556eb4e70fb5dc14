"""Requests and generations, as moderators see and act on them: who had each job, its lease
and how it ended; never the requester's text."""

from datetime import timedelta

from django.contrib import admin
from django.db.models import Count, F
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from front.admin.shown import choice_filter, column, full_moment, moment, short_id
from front.reasons import asks_reason
from jobs import services
from jobs.metrics import ANY_MODEL
from jobs.models import Generation, QueuedModel, SecondsAfter, TextRequest


def _stale(generations):
    return generations.filter(pk__in=Generation.objects.stale(timezone.now()).values("pk"))


LeaseFilter = choice_filter(
    "lease",
    "lease",
    {
        "live": ("Live", lambda q: q.processing().exclude(pk__in=_stale(Generation.objects).values("pk"))),
        "lapsed": ("Lapsed, not yet aborted", _stale),
        "aborted": ("Aborted as stale", lambda q: q.filter(state=Generation.State.ABORTED)),
    },
)
# The speed gate's exceptions: jobs given beyond a worker's capacity, and pops by workers that
# declare more than they can produce; the generation's state is the outcome.
CapacityFilter = choice_filter(
    "capacity",
    "capacity",
    {
        "over": ("Over-capacity assignment (tier 2 or 3)", lambda q: q.over_capacity()),
        "limited": ("Capacity-limited pop", lambda q: q.filter(capacity_limited=True)),
    },
)


@admin.display(description="outcome")
def outcome(modeladmin, generation: Generation) -> str:
    """How a generation ended, in words: its result, or the reason it was cancelled."""
    if generation.state == Generation.State.PROCESSING:
        return "-"
    reason = (generation.settlement_information or {}).get("reason")
    if reason:
        return f"{generation.get_state_display()}: {reason}"
    if generation.result:
        return f"{generation.get_state_display()} ({generation.get_result_display()})"
    return generation.get_state_display()


class GenerationInline(admin.TabularInline):
    """A request's generations on its page: who had each, its lease and how it ended."""

    model = Generation
    fields = ("generation", "state", "worker", "model", "popped", "lease_end", "outcome")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = False

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    @admin.display(description="generation")
    def generation(self, generation: Generation) -> str:
        url = reverse("admin:jobs_generation_change", args=[generation.pk])
        return format_html('<a href="{}" title="{}">{}</a>', url, generation.pk, str(generation.pk)[:8])

    popped = column("popped_at", "popped", shown=full_moment)
    lease_end = column("lease_expires_at", "lease end", shown=full_moment)

    outcome = outcome


class ModelFilter(admin.SimpleListFilter):
    """The models waiting requests name most (a request names any model it likes: the list
    offers the busiest), and requests that name none."""

    title = "model"
    parameter_name = "model"
    SHOWN = 15

    def lookups(self, request, model_admin):
        busiest = (
            QueuedModel.objects.exclude(model="")
            .values("model")
            .annotate(waiting=Count("*"))
            .order_by("-waiting", "model")[: self.SHOWN]
        )
        return [(ANY_MODEL, "(any model)")] + [(row["model"], row["model"]) for row in busiest]

    def queryset(self, request, queryset):
        if self.value() == ANY_MODEL:
            return queryset.filter(requested_models=[])
        if self.value():
            return queryset.filter(requested_models__contains=[self.value()])
        return queryset


def _created_within(age: timedelta):
    return lambda q: q.filter(created_at__gte=timezone.now() - age)


AgeFilter = choice_filter(
    "age",
    "age",
    {
        "5m": ("Created in the last 5 minutes", _created_within(timedelta(minutes=5))),
        "1h": ("In the last hour", _created_within(timedelta(hours=1))),
        "1d": ("In the last day", _created_within(timedelta(days=1))),
        "older": ("Older than a day", lambda q: q.filter(created_at__lt=timezone.now() - timedelta(days=1))),
    },
)


@admin.register(TextRequest)
class TextRequestAdmin(admin.ModelAdmin):
    list_display = (
        "short_id",
        "kind",
        "state",
        "ending",
        "models",
        "account_link",
        "max_length",
        "n",
        "queued",
        "finished",
        "restarts",
        "created",
    )
    list_filter = ("kind", "state", ModelFilter, AgeFilter, "ending")
    list_select_related = ("account",)
    # An id, or an account's name (exactly, as in its list): a spammer's requests at once.
    search_fields = ("=id", "=account__name")
    search_help_text = "A request's id, or an account's name."
    actions = ("cancel",)
    # The prompt and messages are the requester's text: not shown to moderators.
    exclude = ("prompt", "messages")
    readonly_fields = (
        "id",
        "proxied_account",
        "ending",
        "stream_generation",
        "created_full",
        "expires",
        "deadline",
    )
    fields = (
        "id",
        "account",
        "proxied_account",
        "kind",
        "state",
        "ending",
        "requested_models",
        "params",
        "max_length",
        "max_context_length",
        "allowed_workers",
        "trusted_workers",
        "slow_workers",
        "validated_backends",
        "disable_batching",
        "priority",
        "fair_rank",
        "n",
        "queued",
        "finished",
        "restarts",
        "stream_generation",
        "created_full",
        "expires",
        "deadline",
    )
    raw_id_fields = ("account",)
    inlines = (GenerationInline,)
    show_full_result_count = False

    short_id = column("pk", "id", shown=short_id, ordering="id")

    @admin.display(description="account", ordering="account__name")
    def account_link(self, text_request: TextRequest) -> str:
        # This list narrowed to the account's requests; its page is one click from there.
        return format_html(
            '<a href="?account__id__exact={}" title="Its requests only">{}</a>',
            text_request.account_id,
            text_request.account.name,
        )

    def has_cancel_permission(self, request) -> bool:
        return request.user.has_perm("jobs.cancel_textrequest")

    @asks_reason(
        description="Cancel the selected requests",
        permission="cancel",
        title="Cancel requests",
        consequence="Their queued jobs are dropped and those in workers' hands cancelled; a requester "
        "waiting on a stream gets its error event.",
        logged="Cancelled by a moderator",
        done="Cancelled {} request(s).",
        among=lambda requests: requests.filter(state=TextRequest.State.ACTIVE),
    )
    def cancel(self, request, queryset, reason: str) -> list[TextRequest]:
        # Listed first: a list filtered by state no longer matches them once cancelled.
        chosen = list(queryset)
        services.cancel_requests(requests=TextRequest.objects.filter(pk__in=[r.pk for r in chosen]))
        return chosen

    @admin.display(description="models")
    def models(self, text_request: TextRequest) -> str:
        return ", ".join(text_request.requested_models) or "(any)"

    created = column("created_at", "created (UTC)", shown=moment, ordering="created_at")
    created_full = column("created_at", "created", shown=full_moment)
    expires = column("expires_at", "expires", shown=full_moment)
    deadline = column("deadline_at", "deadline", shown=full_moment)


@admin.register(Generation)
class GenerationAdmin(admin.ModelAdmin):
    list_display = (
        "short_id",
        "state",
        "worker",
        "seconds_left",
        "lease_end",
        "cap",
        "renewals",
        "trusted",
        "popped",
        "model",
        "capacity",
        "tier",
        "limited",
    )
    list_filter = (LeaseFilter, CapacityFilter, "state", "fallback_tier", "trusted_at_pop")
    list_select_related = ("worker",)
    search_fields = ("=id",)
    # The response text is the requester's: not shown. Everything is read-only; times to the
    # second, the lease as its end (not the raw `job_ttl`), settlement information in words.
    exclude = ("text",)
    fields = (
        "id",
        "request",
        "proxied_for",
        "worker",
        "model",
        "state",
        "outcome",
        "popped_at_full",
        "lease_end_full",
        "cap_seconds",
        "renewals",
        "trusted_at_pop",
        "capacity_at_pop",
        "fallback_tier",
        "capacity_limited",
        "tokens_shown",
        "reward",
        "finished_at_full",
        "seed",
        "settlement",
    )
    readonly_fields = fields
    show_full_result_count = False

    class Media:
        # Counts the seconds-left column down between page loads.
        js = ("front/lease_countdown.js",)

    def has_add_permission(self, request) -> bool:
        return False

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(lease_end_at=SecondsAfter(F("popped_at"), F("job_ttl")))

    short_id = column("pk", "id", shown=short_id, ordering="id")

    outcome = outcome

    @admin.display(description="proxied account")
    def proxied_for(self, generation: Generation) -> str:
        # Who a service account sent the request for: the user behind a censored or CSAM
        # result, as the AI Horde records it with its problem jobs.
        return generation.request.proxied_account or "-"

    popped_at_full = column("popped_at", "popped", shown=full_moment)
    lease_end_full = column("lease_expires_at", "lease end", shown=full_moment)
    finished_at_full = column("finished_at", "finished", shown=full_moment)

    @admin.display(description="tokens")
    def tokens_shown(self, generation: Generation) -> str:
        if generation.tokens is not None:
            return str(generation.tokens)
        relayed = (generation.settlement_information or {}).get("tokens_relayed")
        return f"{relayed} relayed, not confirmed" if relayed is not None else "-"

    @admin.display(description="settlement information")
    def settlement(self, generation: Generation) -> str:
        info = generation.settlement_information
        if not info:
            return "-"
        usage = "confirmed" if info.get("usage") == "confirmed" else "unknown (no final count)"
        reservation = info.get("reservation") or "none"
        return (
            f"reason: {info.get('reason', '-')}; usage: {usage}; "
            f"tokens relayed: {info.get('tokens_relayed', '-')}; reservation: {reservation}"
        )

    # Short headers: the list must fit 1,440 px beside its filters (the detail page says it all).
    cap = column("cap_seconds", "cap (s)", ordering="cap_seconds")
    trusted = column("trusted_at_pop", "trusted", boolean=True, ordering="trusted_at_pop")
    capacity = column("capacity_at_pop", "capacity", ordering="capacity_at_pop")
    tier = column("fallback_tier", "tier", ordering="fallback_tier")
    limited = column("capacity_limited", "limited", boolean=True, ordering="capacity_limited")
    popped = column("popped_at", "popped (UTC)", shown=moment, ordering="popped_at")
    lease_end = column("lease_expires_at", "lease end (UTC)", shown=moment, ordering="lease_end_at")

    @admin.display(description="left (s)")
    def seconds_left(self, generation: Generation) -> str:
        if generation.state != Generation.State.PROCESSING:
            return "-"
        left = max(0, int((generation.lease_expires_at - timezone.now()).total_seconds()))
        # The script counts down from the server's figure, so the browser's clock never matters.
        return format_html('<span class="lease-seconds-left" data-seconds-left="{}">{}</span>', left, left)
