"""The workers, the horde's modes, address timeouts and messages to workers, as moderators
see and act on them."""

import ipaddress
from datetime import UTC, timedelta

from django import forms
from django.contrib import admin
from django.shortcuts import redirect
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from front.admin.shown import ModeratedFieldsMixin, choice_filter, column
from front.reasons import asks_reason
from hordeops import clock, timeouts
from workers import modes, services
from workers.models import MAX_TIMEOUT_HOURS, AddressTimeout, HordeModes, Worker, WorkerMessage

CapacityFilter = choice_filter(
    "capacity",
    "capacity",
    {"limited": ("Below its max_length (capacity-limited)", lambda q: q.capacity_limited())},
)


def _pausing(paused: bool, **words: str):
    """The action that pauses (or unpauses) the selected workers, once the moderator says why."""

    @asks_reason(**words)
    def act(modeladmin, request, queryset, reason: str) -> list[Worker]:
        workers = list(queryset.exclude(paused=paused))
        services.set_paused(workers=_these(workers), paused=paused)
        return workers

    return act


# What the horde counted of a worker: shown, never edited.
_COUNTED = (
    "speed",
    "completed_jobs",
    "tokens_generated",
    "kudos_rewards",
    "aborted_jobs",
    "aborts_window_start",
    "uncompleted_jobs",
    "given_back",
)


@admin.register(Worker)
class WorkerAdmin(ModeratedFieldsMixin, admin.ModelAdmin):
    list_display = (
        "name",
        "account",
        "models",
        "speed_shown",
        "capacity_shown",
        "max_length",
        "chat",
        "last_seen",
        "jobs_done",
        "given_back_shown",
        "uncompleted_shown",
        "maintenance",
        "aborts_last_hour",
        "agent",
    )
    list_filter = (
        "maintenance",
        "paused",
        "chat",
        CapacityFilter,
        ("deleted_at", admin.EmptyFieldListFilter),
    )
    list_select_related = ("account",)
    # By address too: a raid's workers come from a few.
    search_fields = ("name", "=address")
    fields = (
        "name",
        "account",
        "address",
        "served_models",
        "bridge_agent",
        "chat",
        "max_length",
        "max_context_length",
        "threads",
        *_COUNTED,
        "maintenance",
        "maintenance_reason",
        "maintenance_by_moderator",
        "paused",
        "info",
        "team",
        "last_pop_at",
        "left_at",
        "deleted_at",
    )
    readonly_fields = (
        "address",
        "bridge_agent",
        *_COUNTED,
        "maintenance_by_moderator",
        "team",
        "last_pop_at",
        "left_at",
        "deleted_at",
    )
    moderated_fields = ("maintenance", "maintenance_reason", "paused")
    raw_id_fields = ("account",)
    actions = ("enter_maintenance", "leave_maintenance", "pause", "unpause")
    show_full_result_count = False

    def has_add_permission(self, request) -> bool:
        return False

    def save_model(self, request, obj: Worker, form, change) -> None:
        # Maintenance set here is a moderator's, and binds as the list's action does.
        if "maintenance" in form.changed_data:
            obj.maintenance_by_moderator = obj.maintenance
            if obj.maintenance and not obj.maintenance_reason:
                obj.maintenance_reason = f"Set by {request.user}."
            if not obj.maintenance:
                obj.maintenance_reason, obj.aborted_jobs = "", 0
        super().save_model(request, obj, form, change)

    @admin.display(description="speed (t/s)", ordering="speed")
    def speed_shown(self, worker: Worker) -> str:
        # "new", in full on hover: the column stays as narrow as its figures.
        if worker.speed is None:
            return format_html('<span title="unmeasured">new</span>')
        return f"{worker.speed:.1f}"

    @admin.display(description="capacity (limited)")
    def capacity_shown(self, worker: Worker) -> str:
        # Capacity-limited: a chat worker declaring more max_length than it can produce.
        return (
            format_html("{} <b>limited</b>", worker.capacity)
            if worker.capacity_limited
            else str(worker.capacity)
        )

    given_back_shown = column("given_back", "given back", ordering="given_back")
    uncompleted_shown = column("uncompleted_jobs", "uncompleted", ordering="uncompleted_jobs")
    jobs_done = column("completed_jobs", "jobs done", ordering="completed_jobs")

    @admin.display(description="models")
    def models(self, worker: Worker) -> str:
        return ", ".join(worker.served_models) or "-"

    @admin.display(description="last seen (UTC), online", ordering="last_pop_at")
    def last_seen(self, worker: Worker) -> str:
        if worker.last_pop_at is None:
            return "-"
        seen = worker.last_pop_at.astimezone(UTC).strftime("%m-%d %H:%M:%S")
        if not worker.is_online(timezone.now()):
            return seen
        return format_html('{} <span title="online">●</span>', seen)

    @admin.display(description="bridge agent", ordering="bridge_agent")
    def agent(self, worker: Worker) -> str:
        # name:version:url: the url is long and the same for most; whole on hover.
        name, _, rest = worker.bridge_agent.partition(":")
        version = rest.partition(":")[0]
        if not version:
            return format_html('<span title="{}">{}</span>', worker.bridge_agent, name)
        # It may wrap after its colon, not inside its name.
        return format_html('<span title="{}">{}:<wbr>{}</span>', worker.bridge_agent, name, version)

    @admin.display(description="aborts (1 h)")
    def aborts_last_hour(self, worker: Worker) -> int:
        return worker.aborts_in_window(timezone.now())

    @asks_reason(
        description="Put the selected workers into maintenance",
        title="Put workers into maintenance",
        consequence="They will serve only their owner's requests, and their pops will say your reason; "
        "their owners cannot lift it.",
        logged="Put into maintenance (its owner cannot lift it)",
        done="{} worker(s) in maintenance.",
    )
    def enter_maintenance(self, request, queryset, reason: str) -> list[Worker]:
        # Listed before the update: a list filtered by maintenance no longer matches them after.
        workers = list(queryset)
        services.set_maintenance(workers=_these(workers), maintenance=True, reason=reason, by_moderator=True)
        return workers

    @asks_reason(
        description="Take the selected workers out of maintenance",
        title="Take workers out of maintenance",
        consequence="They will be offered jobs again, their abort count started afresh.",
        logged="Taken out of maintenance",
        done="{} worker(s) out of maintenance.",
    )
    def leave_maintenance(self, request, queryset, reason: str) -> list[Worker]:
        workers = list(queryset)
        services.set_maintenance(workers=_these(workers), maintenance=False)
        return workers

    pause = _pausing(
        True,
        description="Pause the selected workers (offered no jobs)",
        title="Pause workers",
        consequence="They keep popping and are offered no jobs, until unpaused.",
        logged="Paused (offered no jobs until a moderator unpauses it)",
        done="Paused {} worker(s).",
    )
    unpause = _pausing(
        False,
        description="Unpause the selected workers",
        title="Unpause workers",
        consequence="They will be offered jobs again.",
        logged="Unpaused",
        done="Unpaused {} worker(s).",
    )


def _these(workers: list[Worker]):
    """The listed workers as a queryset a service can update, whatever filtered the list."""
    return Worker.objects.filter(pk__in=[w.pk for w in workers])


@admin.register(HordeModes)
class HordeModesAdmin(admin.ModelAdmin):
    """The one row of modes: the list goes straight to it; every change is logged."""

    fields = ("maintenance", "invite_only", "raid", "updated_at")
    readonly_fields = ("updated_at",)

    def has_add_permission(self, request) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def save_model(self, request, obj, form, change) -> None:
        # The API's way too (`PUT /api/v2/status/modes`): one step sets the modes.
        modes.set_modes(**{name: getattr(obj, name) for name in ("maintenance", "invite_only", "raid")})

    def changelist_view(self, request, extra_context=None):
        row, _ = HordeModes.objects.get_or_create(pk=1)
        return redirect(reverse("admin:workers_hordemodes_change", args=[row.pk]))


class AddressTimeoutForm(forms.ModelForm):
    hours = forms.IntegerField(
        min_value=1,
        max_value=MAX_TIMEOUT_HOURS,
        initial=24,
        help_text="From now; at most 720 (30 days), as the AI Horde allows.",
    )

    class Meta:
        model = AddressTimeout
        fields = ("network", "reason")

    def clean_network(self) -> str:
        # The route's check too (`services.time_out_address`): one rule for both ways in.
        text = self.cleaned_data["network"]
        try:
            return timeouts.shown(timeouts.network_to_time_out(text))
        except timeouts.RefusedNetwork as refused:
            raise forms.ValidationError(str(refused)) from None
        except ValueError:
            raise forms.ValidationError("Not an IP address or a CIDR network.") from None


TimeoutInForceFilter = choice_filter(
    "in force",
    "in_force",
    {
        "yes": ("In force", lambda q: q.active(timezone.now())),
        "no": ("Ended", lambda q: q.exclude(pk__in=q.active(timezone.now()))),
    },
)


@admin.register(AddressTimeout)
class AddressTimeoutAdmin(admin.ModelAdmin):
    """Address and network timeouts: set (or extended) for some hours from now, lifted by
    deleting them; each through `services`, which has every web process refuse them at once."""

    form = AddressTimeoutForm
    list_display = ("network", "until", "left", "reason", "created_by")
    list_filter = (TimeoutInForceFilter,)
    search_fields = ("network", "reason")
    fields = ("network", "hours", "reason", "until", "created_by", "created_at")
    readonly_fields = ("until", "created_by", "created_at")

    def get_readonly_fields(self, request, obj=None):
        # A timeout's network is what it is: another one is another timeout.
        return (*self.readonly_fields, "network") if obj else self.readonly_fields

    def get_search_results(self, request, queryset, search_term):
        # An address finds the timeouts that hold it, networks included.
        try:
            ipaddress.ip_address(search_term.strip())
        except ValueError:
            return super().get_search_results(request, queryset, search_term)
        holding = queryset.holding(search_term)
        return queryset.filter(pk__in=[row.pk for row in holding]), False

    @admin.display(description="left")
    def left(self, row: AddressTimeout) -> str:
        seconds = int((row.until - timezone.now()).total_seconds())
        if seconds <= 0:
            return "ended"
        return f"{seconds // 3600} h {seconds % 3600 // 60} min"

    def save_model(self, request, obj: AddressTimeout, form, change) -> None:
        now = clock.now()
        row = services.time_out_address(
            network=obj.network,
            until=now + timedelta(hours=form.cleaned_data["hours"]),
            reason=obj.reason,
            by=str(request.user),
            now=now,
        )
        obj.pk, obj.until, obj.created_by, obj.created_at = row.pk, row.until, row.created_by, row.created_at

    def delete_model(self, request, obj: AddressTimeout) -> None:
        services.lift_address_timeouts(networks=[obj.network], by=str(request.user), now=clock.now())

    def delete_queryset(self, request, queryset) -> None:
        networks = list(queryset.values_list("network", flat=True))
        services.lift_address_timeouts(networks=networks, by=str(request.user), now=clock.now())


class WorkerMessageForm(forms.ModelForm):
    hours = forms.IntegerField(
        min_value=1, max_value=MAX_TIMEOUT_HOURS, initial=12, help_text="Delivered for this long, from now."
    )

    class Meta:
        model = WorkerMessage
        fields = ("worker", "message", "origin")


@admin.register(WorkerMessage)
class WorkerMessageAdmin(admin.ModelAdmin):
    """Messages to workers: each of the worker's pops carries it (`messages`) until it expires;
    deleting it stops it at once."""

    form = WorkerMessageForm
    list_display = ("worker", "excerpt", "origin", "expiry", "created_by")
    list_select_related = ("worker",)
    search_fields = ("worker__name", "message")
    raw_id_fields = ("worker",)
    fields = ("worker", "message", "origin", "hours", "expiry", "created_by", "created_at")
    readonly_fields = ("expiry", "created_by", "created_at")

    @admin.display(description="message")
    def excerpt(self, row: WorkerMessage) -> str:
        return row.message if len(row.message) <= 80 else row.message[:79] + "…"

    def save_model(self, request, obj: WorkerMessage, form, change) -> None:
        now = clock.now()
        obj.expiry = now + timedelta(hours=form.cleaned_data["hours"])
        if not change:
            obj.created_by, obj.created_at = str(request.user), now
        super().save_model(request, obj, form, change)
