"""The accounts, as moderators see and act on them: one admin class, with each app's part (the
account and its suspicions, its kudos and awards, what it has been doing)."""

from decimal import Decimal, InvalidOperation

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Count, OuterRef, Subquery
from django.db.models.functions import Coalesce
from django.http import HttpRequest, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from front import moderation
from front.admin.shown import ModeratedFieldsMixin, choice_filter, column
from front.reasons import asks_reason
from hordeops import clock
from jobs import activity
from kudos import awards
from kudos.models import Wallet
from workers import proxies, services, suspicion
from workers.models import Account, Suspicion

SuspendedFilter = choice_filter(
    "suspended",
    "suspended",
    {
        "yes": ("Suspended", lambda q: q.filter(suspended_at__isnull=False)),
        "no": ("Not suspended", lambda q: q.filter(suspended_at__isnull=True)),
    },
)
FlaggedFilter = choice_filter(
    "flagged",
    "flagged",
    {
        "yes": ("Flagged", lambda q: q.exclude(flagged_at=None)),
        "suspected": ("Suspected (any suspicion)", lambda q: q.filter(suspicions__isnull=False).distinct()),
    },
)


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


class AwardForm(forms.Form):
    amount = forms.DecimalField(min_value=Decimal("0.01"), max_digits=12, decimal_places=2)
    reason = forms.CharField(max_length=400)


def _is_set(when) -> bool:
    return when is not None


def _kudos(balance: Decimal | None) -> Decimal:
    return balance if balance is not None else Decimal("0.00")


def _balance(escrow: bool) -> Subquery:
    wallets = Wallet.objects.filter(account=OuterRef("pk"), escrow=escrow)
    return Subquery(wallets.values("balance")[:1])


# What the account holds and where its ledger is, on its page.
_KUDOS = ("kudos", "escrow", "reservations", "ledger")


@admin.register(Account)
class AccountAdmin(ModeratedFieldsMixin, admin.ModelAdmin):
    # Sortable by load (`jobs.activity`), so that a moderator finds the abuser first.
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
    list_editable = ("trusted",)
    list_filter = ("trusted", "customizer", "service", SuspendedFilter, FlaggedFilter)
    search_fields = ("name",)
    inlines = (SuspicionInline,)
    # `moderator` (the key may change any worker through the horde API) is a superuser's to give.
    fields = (
        "name",
        "trusted",
        "customizer",
        "moderator",
        "service",
        "deadline_limit_ms",
        "max_waiting_requests",
        "worker_limit",
        "public_workers",
        "contact",
        "admin_comment",
        "suspension_reason",
        "suspended_at",
        "flagged_at",
        "created_at",
        *_KUDOS,
        "shared_keys",
    )
    readonly_fields = ("suspended_at", "flagged_at", "created_at", *_KUDOS, "shared_keys")
    # `customizer` (makes styles without trust) is a moderator's to give, as on the AI Horde.
    moderated_fields = (
        "trusted",
        "service",
        "customizer",
        "deadline_limit_ms",
        "max_waiting_requests",
        "worker_limit",
        "public_workers",
        "contact",
        "admin_comment",
        "suspension_reason",
    )
    actions = (
        "trust",
        "untrust",
        "suspend",
        "lift_suspension",
        "reset_key",
        "make_proxy_passkey",
        "flag",
        "clear_suspicion",
    )
    show_full_result_count = False

    def has_add_permission(self, request) -> bool:
        return request.user.is_superuser

    def get_queryset(self, request):
        # Subqueries, not joins: the actions lock and update these rows (no GROUP BY allowed).
        counted = Suspicion.objects.filter(account=OuterRef("pk")).values("account").annotate(n=Count("*"))
        accounts = (
            super()
            .get_queryset(request)
            .annotate(
                suspicion_total=Coalesce(Subquery(counted.values("n")), 0),
                balance=_balance(False),
                escrowed=_balance(True),
            )
        )
        return activity.with_activity(accounts, now=clock.now())

    def save_model(self, request, obj: Account, form, change) -> None:
        # A reason written here suspends the account (its key refused, its requests cancelled:
        # `moderation.suspend_accounts`); emptied, the suspension is lifted. Logged with it.
        if not obj.service:
            obj.proxy_passkey_hash = None  # no longer a service account: its passkey goes with it
        reason = obj.suspension_reason
        suspending = "suspension_reason" in form.changed_data and reason and obj.suspended_at is None
        if suspending:
            obj.suspension_reason = ""  # written by the suspension itself
        elif not reason:
            obj.suspended_at = None
        super().save_model(request, obj, form, change)
        if suspending:
            moderation.suspend_accounts(
                accounts=Account.objects.filter(pk=obj.pk), reason=reason, now=clock.now()
            )
            obj.refresh_from_db()

    # -- Columns -------------------------------------------------------------------------------

    suspended = column("suspended_at", "suspended", shown=_is_set, boolean=True, ordering="suspended_at")
    flagged = column("flagged_at", "flagged", shown=_is_set, boolean=True, ordering="flagged_at")

    suspicion_count = column("suspicion_total", "suspicions", ordering="suspicion_total")

    @admin.display(description="Max waiting requests", ordering="max_waiting_requests")
    def waiting_requests_bound(self, account: Account) -> str:
        limit = account.waiting_requests_limit
        return str(limit) if account.max_waiting_requests is not None else f"{limit} (default)"

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

    tokens_hour_shown = column("tokens_hour", "tokens 1 h", ordering="tokens_hour")
    tokens_day_shown = column("tokens_day", "tokens 24 h", ordering="tokens_day")
    given_back_shown = column("given_back", "given back", ordering="given_back")
    uncompleted_shown = column("uncompleted", "uncompleted", ordering="uncompleted")

    kudos = column("balance", "kudos", shown=_kudos, ordering="balance")
    escrow = column("escrowed", "escrow (untrusted earnings)", shown=_kudos)

    @admin.display(description="reservations")
    def reservations(self, account: Account) -> str:
        url = reverse("admin:jobs_textrequest_changelist")
        return format_html(
            '<a href="{}?account__id__exact={}&state__exact=active">its active requests</a> '
            "(each holds its cost until it ends)",
            url,
            account.pk,
        )

    @admin.display(description="ledger")
    def ledger(self, account: Account) -> str:
        url = reverse("admin:kudos_posting_changelist")
        award = reverse("admin:workers_account_award", args=[account.pk])
        return format_html(
            '<a href="{}?wallet__account__id__exact={}">its postings, newest first</a> · '
            '<a href="{}">award kudos</a>',
            url,
            account.pk,
            award,
        )

    @admin.display(description="shared keys")
    def shared_keys(self, account: Account) -> str:
        url = reverse("admin:workers_sharedkey_changelist")
        return format_html(
            '<a href="{}?account__id__exact={}">its shared keys ({})</a>',
            url,
            account.pk,
            account.shared_keys.count(),
        )

    # -- Actions -------------------------------------------------------------------------------

    def _set_trust(self, request, queryset, trusted: bool) -> None:
        # The API's way too (`PUT /api/v2/users/{id}` `trusted`): one step, the same words.
        changing = moderation.trust_accounts(accounts=queryset, trusted=trusted)
        for account in changing:
            self.log_change(request, account, f"{moderation.TRUST_WORDS[trusted]}.")
        word = "Trusted" if trusted else "Untrusted"
        self.message_user(request, f"{word} {len(changing)} account(s).", messages.SUCCESS)

    @admin.action(description="Trust the selected accounts", permissions=["change"])
    def trust(self, request, queryset) -> None:
        self._set_trust(request, queryset, True)

    @admin.action(description="Untrust the selected accounts", permissions=["change"])
    def untrust(self, request, queryset) -> None:
        self._set_trust(request, queryset, False)

    @asks_reason(
        description="Suspend the selected accounts (keys refused, open requests cancelled)",
        title="Suspend accounts",
        consequence="Their keys will be refused everywhere, with your reason, and their open requests "
        "cancelled.",
        logged="Suspended (open requests cancelled)",
        done="Suspended {} account(s).",
    )
    def suspend(self, request, queryset, reason: str) -> list[Account]:
        return moderation.suspend_accounts(accounts=queryset, reason=reason, now=clock.now())

    @asks_reason(
        description="Lift the selected accounts' suspension",
        title="Lift suspensions",
        consequence="Their keys will work again.",
        logged="Suspension lifted",
        done="Lifted {} suspension(s).",
    )
    def lift_suspension(self, request, queryset, reason: str) -> list[Account]:
        lifting = list(queryset.exclude(suspended_at=None))
        services.lift_suspensions(accounts=queryset)
        return lifting

    @asks_reason(
        description="Reset the selected accounts' API keys",
        title="Reset API keys",
        consequence="Their keys stop working at once; each new key is shown once, on the next page.",
        logged="API key reset (the old key no longer works)",
        done=None,
    )
    def reset_key(self, request, queryset, reason: str) -> list[Account]:
        accounts = list(queryset)
        for account in accounts:
            api_key = services.reset_api_key(account=account)
            # Shown once, here: only the hash is stored. Give it to the owner privately.
            self.message_user(request, f"New API key of {account.name}: {api_key}", messages.WARNING)
        return accounts

    @asks_reason(
        description="Make the selected service accounts' proxy passkeys",
        title="Make proxy passkeys",
        consequence="Each service account gets a new passkey for its Proxy-Authorization header (any "
        "older one stops working); with it, its Proxied-For header is taken as the client's address. "
        "Each is shown once, on the next page. Accounts that are not service accounts are left out.",
        logged=moderation.PASSKEY_MADE,
        done=None,
        among=lambda accounts: accounts.filter(service=True),
    )
    def make_proxy_passkey(self, request, queryset, reason: str) -> list[Account]:
        accounts = list(queryset)
        for account in accounts:
            passkey = proxies.make_passkey(account=account)
            # Shown once, here: only the hash is stored. Give it to the service's operator privately.
            self.message_user(request, f"New proxy passkey of {account.name}: {passkey}", messages.WARNING)
        return accounts

    @asks_reason(
        description="Clear the selected accounts' suspicions (lifts the flag)",
        title="Clear suspicions",
        consequence="Their suspicions are forgotten and the flag lifted: their workers are offered "
        "jobs again.",
        logged=moderation.SUSPICIONS_CLEARED,
        done="Cleared {} account(s)' suspicions.",
    )
    def clear_suspicion(self, request, queryset, reason: str) -> list[Account]:
        return moderation.clear_suspicions(accounts=queryset)

    @asks_reason(
        description="Flag the selected accounts (their workers offered no jobs)",
        title="Flag accounts",
        consequence="Their workers will be offered no jobs and they will not be trusted by their kudos, "
        "until their suspicions are cleared.",
        logged=moderation.FLAGGED,
        done="Flagged {} account(s).",
    )
    def flag(self, request, queryset, reason: str) -> list[Account]:
        return suspicion.flag(accounts=queryset, now=clock.now())

    # -- Awards --------------------------------------------------------------------------------

    def get_urls(self):
        award = self.admin_site.admin_view(self.award_view)
        return [path("<int:account_id>/award/", award, name="workers_account_award"), *super().get_urls()]

    def award_view(self, request: HttpRequest, account_id: int):
        """Award kudos to one account, with a reason: posted as an `award` event, logged."""
        if not request.user.has_perm("kudos.award_kudos"):
            raise PermissionDenied
        account = get_object_or_404(Account, pk=account_id)
        form = AwardForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            amount, reason = form.cleaned_data["amount"], form.cleaned_data["reason"]
            try:
                awards.award_kudos(
                    account_id=account.pk, amount=amount, reason=reason, by=request.user.username
                )
            except (awards.InvalidAward, InvalidOperation) as exc:
                form.add_error(None, str(exc))
            else:
                self.log_change(request, account, f"{moderation.awarded(amount)}: {reason}")
                self.message_user(request, f"Awarded {amount} kudos to {account}.", messages.SUCCESS)
                return HttpResponseRedirect(reverse("admin:workers_account_change", args=[account.pk]))
        context = {
            **self.admin_site.each_context(request),
            "title": f"Award kudos to {account}",
            "form": form,
            "opts": self.model._meta,
            "original": account,
        }
        return TemplateResponse(request, "admin/front/award.html", context)
