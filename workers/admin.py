import ipaddress
from datetime import UTC, timedelta

from django import forms
from django.contrib import admin, messages
from django.db.models import Count, OuterRef, Subquery
from django.db.models.functions import Coalesce
from django.shortcuts import redirect
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from hordeops import clock, timeouts
from hordeops.moderation_forms import with_reason
from workers import services, suspicion
from workers.models import (
    MAX_TIMEOUT_HOURS,
    Account,
    AddressTimeout,
    HordeModes,
    Suspicion,
    Worker,
    WorkerMessage,
)


class ModeratedFieldsMixin:
    """Superusers may change everything; moderators only `moderated_fields`."""

    moderated_fields: tuple[str, ...] = ()

    def get_readonly_fields(self, request, obj=None):
        if request.user.is_superuser:
            return super().get_readonly_fields(request, obj)
        return tuple(f for f in self.fields if f not in self.moderated_fields)


class SuspendedFilter(admin.SimpleListFilter):
    title = "suspended"
    parameter_name = "suspended"

    def lookups(self, request, model_admin):
        return (("yes", "Suspended"), ("no", "Not suspended"))

    def queryset(self, request, queryset):
        if self.value() in ("yes", "no"):
            return queryset.filter(suspended_at__isnull=self.value() == "no")
        return queryset


class FlaggedFilter(admin.SimpleListFilter):
    title = "flagged"
    parameter_name = "flagged"

    def lookups(self, request, model_admin):
        return (("yes", "Flagged"), ("suspected", "Suspected (any suspicion)"))

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.exclude(flagged_at=None)
        if self.value() == "suspected":
            return queryset.filter(suspicions__isnull=False).distinct()
        return queryset


class SuspicionInline(admin.TabularInline):
    """Why the account is suspected, newest first: read only, cleared by the list's action."""

    model = Suspicion
    fields = ("created_at", "reason", "detail", "worker")
    readonly_fields = fields
    extra = 0
    max_num = 0
    can_delete = False
    show_change_link = False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Account)
class AccountAdmin(ModeratedFieldsMixin, admin.ModelAdmin):
    list_display = (
        "name",
        "trusted",
        "suspended",
        "flagged",
        "suspicion_count",
        "deadline_limit_ms",
        "waiting_requests_bound",
        "created_at",
    )
    list_editable = ("trusted",)
    list_filter = ("trusted", SuspendedFilter, FlaggedFilter)
    search_fields = ("name",)
    inlines = (SuspicionInline,)
    # `moderator` (the key may change any worker through the horde API) is a superuser's to give.
    fields = (
        "name",
        "trusted",
        "moderator",
        "deadline_limit_ms",
        "max_waiting_requests",
        "worker_limit",
        "suspension_reason",
        "suspended_at",
        "flagged_at",
        "created_at",
    )
    readonly_fields = ("suspended_at", "flagged_at", "created_at")
    moderated_fields = (
        "trusted",
        "deadline_limit_ms",
        "max_waiting_requests",
        "worker_limit",
        "suspension_reason",
    )
    actions = ("trust", "untrust", "suspend", "lift_suspension", "reset_key", "clear_suspicion")
    show_full_result_count = False

    def has_add_permission(self, request) -> bool:
        return request.user.is_superuser

    def get_queryset(self, request):
        # A subquery, not a join: the actions lock and update these rows (no GROUP BY allowed).
        counted = Suspicion.objects.filter(account=OuterRef("pk")).values("account").annotate(n=Count("*"))
        return (
            super().get_queryset(request).annotate(suspicion_total=Coalesce(Subquery(counted.values("n")), 0))
        )

    @admin.display(description="suspended", boolean=True, ordering="suspended_at")
    def suspended(self, account: Account) -> bool:
        return account.suspended_at is not None

    @admin.display(description="flagged", boolean=True, ordering="flagged_at")
    def flagged(self, account: Account) -> bool:
        return account.flagged_at is not None

    @admin.display(description="suspicions", ordering="suspicion_total")
    def suspicion_count(self, account: Account) -> int:
        return account.suspicion_total

    @admin.action(
        description="Clear the selected accounts' suspicions (lifts the flag)", permissions=["change"]
    )
    def clear_suspicion(self, request, queryset):
        def act(reason: str) -> None:
            clearing = list(queryset.filter(suspicions__isnull=False).distinct())
            suspicion.clear(accounts=queryset)
            for account in clearing:
                self.log_change(
                    request, account, f"Suspicions cleared (its workers offered jobs again): {reason}"
                )
            self.message_user(request, f"Cleared {len(clearing)} account(s)' suspicions.", messages.SUCCESS)

        return with_reason(
            self,
            request,
            queryset,
            title="Clear suspicions",
            consequence="Their suspicions are forgotten and the flag lifted: their workers are offered "
            "jobs again.",
            act=act,
        )

    def save_model(self, request, obj: Account, form, change) -> None:
        # A reason written here suspends the account (its key refused, its requests cancelled:
        # `services.suspend_accounts`); emptied, the suspension is lifted. Logged with it.
        reason = obj.suspension_reason
        suspending = "suspension_reason" in form.changed_data and reason and obj.suspended_at is None
        if suspending:
            obj.suspension_reason = ""  # written by the suspension itself
        elif not reason:
            obj.suspended_at = None
        super().save_model(request, obj, form, change)
        if suspending:
            services.suspend_accounts(
                accounts=Account.objects.filter(pk=obj.pk), reason=reason, now=timezone.now()
            )
            obj.refresh_from_db()

    @admin.display(description="Max waiting requests", ordering="max_waiting_requests")
    def waiting_requests_bound(self, account: Account) -> str:
        limit = account.waiting_requests_limit
        return str(limit) if account.max_waiting_requests is not None else f"{limit} (default)"

    def _set_trust(self, request, queryset, trusted: bool) -> None:
        changing = list(queryset.exclude(trusted=trusted))
        services.set_trust(accounts=queryset, trusted=trusted)
        word = "Trusted" if trusted else "Untrusted"
        for account in changing:
            self.log_change(
                request, account, f"{word} (their workers' next pops get the matching lease cap)."
            )
        self.message_user(request, f"{word} {len(changing)} account(s).", messages.SUCCESS)

    @admin.action(description="Trust the selected accounts", permissions=["change"])
    def trust(self, request, queryset) -> None:
        self._set_trust(request, queryset, True)

    @admin.action(description="Untrust the selected accounts", permissions=["change"])
    def untrust(self, request, queryset) -> None:
        self._set_trust(request, queryset, False)

    @admin.action(
        description="Suspend the selected accounts (keys refused, open requests cancelled)",
        permissions=["change"],
    )
    def suspend(self, request, queryset):
        def act(reason: str) -> None:
            suspended = services.suspend_accounts(accounts=queryset, reason=reason, now=timezone.now())
            for account in suspended:
                self.log_change(request, account, f"Suspended (open requests cancelled): {reason}")
            self.message_user(request, f"Suspended {len(suspended)} account(s).", messages.SUCCESS)

        return with_reason(
            self,
            request,
            queryset,
            title="Suspend accounts",
            consequence="Their keys will be refused everywhere, with your reason, and their open requests "
            "cancelled.",
            act=act,
        )

    @admin.action(description="Lift the selected accounts' suspension", permissions=["change"])
    def lift_suspension(self, request, queryset):
        def act(reason: str) -> None:
            lifting = list(queryset.exclude(suspended_at=None))
            services.lift_suspensions(accounts=queryset)
            for account in lifting:
                self.log_change(request, account, f"Suspension lifted: {reason}")
            self.message_user(request, f"Lifted {len(lifting)} suspension(s).", messages.SUCCESS)

        return with_reason(
            self,
            request,
            queryset,
            title="Lift suspensions",
            consequence="Their keys will work again.",
            act=act,
        )

    @admin.action(description="Reset the selected accounts' API keys", permissions=["change"])
    def reset_key(self, request, queryset):
        def act(reason: str) -> None:
            for account in list(queryset):
                api_key = services.reset_api_key(account=account)
                self.log_change(request, account, f"API key reset (the old key no longer works): {reason}")
                # Shown once, here: only the hash is stored. Give it to the owner privately.
                self.message_user(request, f"New API key of {account.name}: {api_key}", messages.WARNING)

        return with_reason(
            self,
            request,
            queryset,
            title="Reset API keys",
            consequence="Their keys stop working at once; each new key is shown once, on the next page.",
            act=act,
        )


class CapacityFilter(admin.SimpleListFilter):
    title = "capacity"
    parameter_name = "capacity"

    def lookups(self, request, model_admin):
        return (("limited", "Below its max_length (capacity-limited)"),)

    def queryset(self, request, queryset):
        if self.value() == "limited":
            return queryset.capacity_limited()
        return queryset


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
        "speed",
        "completed_jobs",
        "tokens_generated",
        "kudos_rewards",
        "aborted_jobs",
        "aborts_window_start",
        "uncompleted_jobs",
        "given_back",
        "maintenance",
        "maintenance_reason",
        "maintenance_by_moderator",
        "paused",
        "info",
        "last_pop_at",
        "left_at",
        "deleted_at",
    )
    readonly_fields = (
        "address",
        "bridge_agent",
        "speed",
        "completed_jobs",
        "tokens_generated",
        "kudos_rewards",
        "aborted_jobs",
        "aborts_window_start",
        "uncompleted_jobs",
        "given_back",
        "maintenance_by_moderator",
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

    @admin.display(description="given back", ordering="given_back")
    def given_back_shown(self, worker: Worker) -> int:
        return worker.given_back

    @admin.display(description="uncompleted", ordering="uncompleted_jobs")
    def uncompleted_shown(self, worker: Worker) -> int:
        return worker.uncompleted_jobs

    @admin.display(description="jobs done", ordering="completed_jobs")
    def jobs_done(self, worker: Worker) -> int:
        return worker.completed_jobs

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

    @admin.action(description="Put the selected workers into maintenance", permissions=["change"])
    def enter_maintenance(self, request, queryset):
        def act(reason: str) -> None:
            # Listed before the update: a list filtered by maintenance no longer matches them after.
            workers = list(queryset)
            changed = services.set_maintenance(
                workers=Worker.objects.filter(pk__in=[w.pk for w in workers]),
                maintenance=True,
                reason=reason,
                by_moderator=True,
            )
            for worker in workers:
                self.log_change(request, worker, f"Put into maintenance (its owner cannot lift it): {reason}")
            self.message_user(request, f"{changed} worker(s) in maintenance.", messages.SUCCESS)

        return with_reason(
            self,
            request,
            queryset,
            title="Put workers into maintenance",
            consequence="They will serve only their owner's requests, and their pops will say your reason; "
            "their owners cannot lift it.",
            act=act,
        )

    @admin.action(description="Take the selected workers out of maintenance", permissions=["change"])
    def leave_maintenance(self, request, queryset):
        def act(reason: str) -> None:
            workers = list(queryset)
            changed = services.set_maintenance(
                workers=Worker.objects.filter(pk__in=[w.pk for w in workers]), maintenance=False
            )
            for worker in workers:
                self.log_change(request, worker, f"Taken out of maintenance: {reason}")
            self.message_user(request, f"{changed} worker(s) out of maintenance.", messages.SUCCESS)

        return with_reason(
            self,
            request,
            queryset,
            title="Take workers out of maintenance",
            consequence="They will be offered jobs again, their abort count started afresh.",
            act=act,
        )

    def _set_paused(self, request, queryset, paused: bool):
        def act(reason: str) -> None:
            workers = list(queryset.exclude(paused=paused))
            services.set_paused(workers=Worker.objects.filter(pk__in=[w.pk for w in workers]), paused=paused)
            word = "Paused (offered no jobs until a moderator unpauses it)" if paused else "Unpaused"
            for worker in workers:
                self.log_change(request, worker, f"{word}: {reason}")
            self.message_user(request, f"{word.split(' ')[0]} {len(workers)} worker(s).", messages.SUCCESS)

        if paused:
            title, consequence = "Pause workers", "They keep popping and are offered no jobs, until unpaused."
        else:
            title, consequence = "Unpause workers", "They will be offered jobs again."
        return with_reason(self, request, queryset, title=title, consequence=consequence, act=act)

    @admin.action(description="Pause the selected workers (offered no jobs)", permissions=["change"])
    def pause(self, request, queryset):
        return self._set_paused(request, queryset, True)

    @admin.action(description="Unpause the selected workers", permissions=["change"])
    def unpause(self, request, queryset):
        return self._set_paused(request, queryset, False)


@admin.register(HordeModes)
class HordeModesAdmin(admin.ModelAdmin):
    """The one row of modes: the list goes straight to it; every change is logged."""

    fields = ("maintenance", "invite_only", "raid", "updated_at")
    readonly_fields = ("updated_at",)

    def has_add_permission(self, request) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def changelist_view(self, request, extra_context=None):
        modes, _ = HordeModes.objects.get_or_create(pk=1)
        return redirect(reverse("admin:workers_hordemodes_change", args=[modes.pk]))


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


class TimeoutInForceFilter(admin.SimpleListFilter):
    title = "in force"
    parameter_name = "in_force"

    def lookups(self, request, model_admin):
        return (("yes", "In force"), ("no", "Ended"))

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.active(timezone.now())
        if self.value() == "no":
            return queryset.exclude(pk__in=queryset.active(timezone.now()))
        return queryset


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
