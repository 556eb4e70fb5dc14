from datetime import UTC, datetime, timedelta

from django.contrib import admin, messages
from django.db.models import Count, F
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from hordeops.moderation_forms import with_reason
from jobs import activity, services
from jobs.metrics import ANY_MODEL
from jobs.models import Generation, QueuedModel, SecondsAfter, TextRequest
from kudos.admin import KudosAccountAdmin  # registered first: the accounts list below extends it
from workers.models import Account


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


def _full_moment(when: datetime | None) -> str:
    return "-" if when is None else when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _short_id(pk) -> str:
    """The first 8 characters, the whole id on hover (and on the detail page)."""
    return format_html('<span title="{}">{}</span>', pk, str(pk)[:8])


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

    @admin.display(description="popped")
    def popped(self, generation: Generation) -> str:
        return _full_moment(generation.popped_at)

    @admin.display(description="lease end")
    def lease_end(self, generation: Generation) -> str:
        return _full_moment(generation.lease_expires_at)

    @admin.display(description="outcome")
    def outcome(self, generation: Generation) -> str:
        return _outcome(generation)


def _outcome(generation: Generation) -> str:
    """How a generation ended, in words: its result, or the reason it was cancelled."""
    if generation.state == Generation.State.PROCESSING:
        return "-"
    reason = (generation.settlement_information or {}).get("reason")
    if reason:
        return f"{generation.get_state_display()}: {reason}"
    if generation.result:
        return f"{generation.get_state_display()} ({generation.get_result_display()})"
    return generation.get_state_display()


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


class AgeFilter(admin.SimpleListFilter):
    title = "age"
    parameter_name = "age"
    AGES = {"5m": timedelta(minutes=5), "1h": timedelta(hours=1), "1d": timedelta(days=1)}

    def lookups(self, request, model_admin):
        return (
            ("5m", "Created in the last 5 minutes"),
            ("1h", "In the last hour"),
            ("1d", "In the last day"),
            ("older", "Older than a day"),
        )

    def queryset(self, request, queryset):
        now = timezone.now()
        if self.value() in self.AGES:
            return queryset.filter(created_at__gte=now - self.AGES[self.value()])
        if self.value() == "older":
            return queryset.filter(created_at__lt=now - self.AGES["1d"])
        return queryset


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
        "ending",
        "stream_generation",
        "created_full",
        "expires",
        "deadline",
    )
    fields = (
        "id",
        "account",
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

    @admin.display(description="id", ordering="id")
    def short_id(self, text_request: TextRequest) -> str:
        return _short_id(text_request.pk)

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

    @admin.action(description="Cancel the selected requests", permissions=["cancel"])
    def cancel(self, request, queryset):
        def act(reason: str) -> None:
            # Listed first: a list filtered by state no longer matches them once cancelled.
            chosen = list(queryset.filter(state=TextRequest.State.ACTIVE))
            cancelled = services.cancel_requests(
                requests=TextRequest.objects.filter(pk__in=[r.pk for r in chosen])
            )
            for text_request in chosen:
                self.log_change(request, text_request, f"Cancelled by a moderator: {reason}")
            self.message_user(request, f"Cancelled {cancelled} request(s).", messages.SUCCESS)

        return with_reason(
            self,
            request,
            queryset.filter(state=TextRequest.State.ACTIVE),
            title="Cancel requests",
            consequence="Their queued jobs are dropped and those in workers' hands cancelled; a requester "
            "waiting on a stream gets its error event.",
            act=act,
        )

    @admin.display(description="models")
    def models(self, text_request: TextRequest) -> str:
        return ", ".join(text_request.requested_models) or "(any)"

    @admin.display(description="created (UTC)", ordering="created_at")
    def created(self, text_request: TextRequest) -> str:
        return _moment(text_request.created_at)

    @admin.display(description="created")
    def created_full(self, text_request: TextRequest) -> str:
        return _full_moment(text_request.created_at)

    @admin.display(description="expires")
    def expires(self, text_request: TextRequest) -> str:
        return _full_moment(text_request.expires_at)

    @admin.display(description="deadline")
    def deadline(self, text_request: TextRequest) -> str:
        return _full_moment(text_request.deadline_at)


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
        js = ("jobs/lease_countdown.js",)

    def has_add_permission(self, request) -> bool:
        return False

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(lease_end_at=SecondsAfter(F("popped_at"), F("job_ttl")))

    @admin.display(description="id", ordering="id")
    def short_id(self, generation: Generation) -> str:
        return _short_id(generation.pk)

    @admin.display(description="outcome")
    def outcome(self, generation: Generation) -> str:
        return _outcome(generation)

    @admin.display(description="popped")
    def popped_at_full(self, generation: Generation) -> str:
        return _full_moment(generation.popped_at)

    @admin.display(description="lease end")
    def lease_end_full(self, generation: Generation) -> str:
        return _full_moment(generation.lease_expires_at)

    @admin.display(description="finished")
    def finished_at_full(self, generation: Generation) -> str:
        return _full_moment(generation.finished_at)

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
    @admin.display(description="cap (s)", ordering="cap_seconds")
    def cap(self, generation: Generation) -> int:
        return generation.cap_seconds

    @admin.display(description="trusted", boolean=True, ordering="trusted_at_pop")
    def trusted(self, generation: Generation) -> bool:
        return generation.trusted_at_pop

    @admin.display(description="capacity", ordering="capacity_at_pop")
    def capacity(self, generation: Generation) -> int | None:
        return generation.capacity_at_pop

    @admin.display(description="tier", ordering="fallback_tier")
    def tier(self, generation: Generation) -> int:
        return generation.fallback_tier

    @admin.display(description="limited", boolean=True, ordering="capacity_limited")
    def limited(self, generation: Generation) -> bool:
        return generation.capacity_limited

    @admin.display(description="popped (UTC)", ordering="popped_at")
    def popped(self, generation: Generation) -> str:
        return _moment(generation.popped_at)

    @admin.display(description="lease end (UTC)", ordering="lease_end_at")
    def lease_end(self, generation: Generation) -> str:
        return _moment(generation.lease_expires_at)

    @admin.display(description="left (s)")
    def seconds_left(self, generation: Generation) -> str:
        if generation.state != Generation.State.PROCESSING:
            return "-"
        left = max(0, int((generation.lease_expires_at - timezone.now()).total_seconds()))
        # The script counts down from the server's figure, so the browser's clock never matters.
        return format_html('<span class="lease-seconds-left" data-seconds-left="{}">{}</span>', left, left)


# The accounts list, with what each account has been doing (`jobs.activity`): the kudos app's
# list (itself the workers app's) extended, so that a moderator sorts accounts by their load.
admin.site.unregister(Account)


@admin.register(Account)
class AccountActivityAdmin(KudosAccountAdmin):
    list_display = (
        "name",
        "trusted",
        "suspended",
        "flagged",
        "suspicion_count",
        "requests_hour_shown",
        "requests_day_shown",
        "tokens_hour_shown",
        "tokens_day_shown",
        "given_back_shown",
        "uncompleted_shown",
        "kudos",
        "waiting_requests_bound",
    )

    def get_queryset(self, request):
        return activity.with_activity(super().get_queryset(request), now=timezone.now())

    @admin.display(description="requests 1 h", ordering="requests_hour")
    def requests_hour_shown(self, account: Account) -> str:
        return self._requests_link(account, account.requests_hour, "1h")

    @admin.display(description="requests 24 h", ordering="requests_day")
    def requests_day_shown(self, account: Account) -> str:
        return self._requests_link(account, account.requests_day, "1d")

    @staticmethod
    def _requests_link(account: Account, count: int, age: str) -> str:
        url = reverse("admin:jobs_textrequest_changelist")
        return format_html('<a href="{}?account__id__exact={}&age={}">{}</a>', url, account.pk, age, count)

    @admin.display(description="tokens 1 h", ordering="tokens_hour")
    def tokens_hour_shown(self, account: Account) -> int:
        return account.tokens_hour

    @admin.display(description="tokens 24 h", ordering="tokens_day")
    def tokens_day_shown(self, account: Account) -> int:
        return account.tokens_day

    @admin.display(description="given back", ordering="given_back")
    def given_back_shown(self, account: Account) -> int:
        return account.given_back

    @admin.display(description="uncompleted", ordering="uncompleted")
    def uncompleted_shown(self, account: Account) -> int:
        return account.uncompleted
