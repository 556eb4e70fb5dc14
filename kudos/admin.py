"""The kudos admin: the model table, the ledger (read-only, newest first, by account and kind),
and on each account its balance, escrow, reservations, ledger and the moderators' awards."""

from decimal import Decimal, InvalidOperation

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import OuterRef, Subquery
from django.http import HttpRequest, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from kudos import awards, sizes
from kudos.models import Posting, TextModel, Wallet
from workers.admin import AccountAdmin
from workers.models import Account


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


class AwardForm(forms.Form):
    amount = forms.DecimalField(min_value=Decimal("0.01"), max_digits=12, decimal_places=2)
    reason = forms.CharField(max_length=400)


def _balance(escrow: bool) -> Subquery:
    wallets = Wallet.objects.filter(account=OuterRef("pk"), escrow=escrow)
    return Subquery(wallets.values("balance")[:1])


admin.site.unregister(Account)


@admin.register(Account)
class KudosAccountAdmin(AccountAdmin):
    """The account admin, with its kudos."""

    list_display = (*AccountAdmin.list_display[:-1], "kudos", AccountAdmin.list_display[-1])
    fields = (*AccountAdmin.fields, "kudos", "escrow", "reservations", "ledger")
    readonly_fields = (*AccountAdmin.readonly_fields, "kudos", "escrow", "reservations", "ledger")

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(balance=_balance(False), escrowed=_balance(True))

    @admin.display(description="kudos", ordering="balance")
    def kudos(self, account: Account) -> Decimal:
        return account.balance if account.balance is not None else Decimal("0.00")

    @admin.display(description="escrow (untrusted earnings)")
    def escrow(self, account: Account) -> Decimal:
        return account.escrowed if account.escrowed is not None else Decimal("0.00")

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
                self.log_change(request, account, f"Awarded {amount} kudos: {reason}")
                self.message_user(request, f"Awarded {amount} kudos to {account}.", messages.SUCCESS)
                return HttpResponseRedirect(reverse("admin:workers_account_change", args=[account.pk]))
        context = {
            **self.admin_site.each_context(request),
            "title": f"Award kudos to {account}",
            "form": form,
        }
        context.update(opts=self.model._meta, original=account)
        return TemplateResponse(request, "admin/kudos/award.html", context)
