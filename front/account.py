"""The account page, `/account`: a person signs in with their API key and sees their kudos,
their last 30 days, their ledger, their workers and their shared keys; transfers kudos, toggles
their workers' maintenance, resets their key and signs out (the shared keys' forms post to
`front.shared_keys`).

The session holds the account's id and its key's hash, never the key: each request loads the
account and ends the session when the hash no longer matches (the key was reset, here or by a
moderator) or the account is suspended, on every web process at once. Sign-ins are bounded as
the admin's logins are (`hordeops.logins`), the key's hash standing as the name. Every change
is a POST under Django's CSRF check. Another way in (OAuth) only has to call `start_session`.
"""

import logging
from datetime import timedelta
from uuid import UUID, uuid4

from django import forms
from django.contrib import messages
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST

from front import charts
from front.shared_key_forms import Section, section
from hordeops import clock, errors, logins
from jobs.activity import daily_tokens
from kudos import holds, transfers
from kudos.details import user_details
from kudos.models import Posting
from workers import services
from workers.details import unique_alias
from workers.models import Account, hash_api_key

logger = logging.getLogger(__name__)

ACCOUNT_ID, KEY_HASH = "account_id", "account_key_hash"  # what the session holds
CHART_DAYS = 30
LEDGER_PAGE = 25


class SignInForm(forms.Form):
    apikey = forms.CharField(label="API key", max_length=200, strip=True, widget=forms.PasswordInput)


class TransferForm(forms.Form):
    username = forms.CharField(label="To (name#id)", max_length=255)
    amount = forms.IntegerField(label="Kudos", min_value=1, max_value=2**31 - 1)
    # Made with the form: the same form sent twice (a double click, a reload) moves kudos once.
    idempotency_key = forms.CharField(widget=forms.HiddenInput, max_length=64, required=False)


def start_session(request: HttpRequest, account: Account) -> None:
    """Sign `account` in on this browser (a new session id, so that none chosen before is kept)."""
    request.session.cycle_key()
    request.session[ACCOUNT_ID] = account.pk
    request.session[KEY_HASH] = account.api_key_hash


def signed_in(request: HttpRequest) -> tuple[Account | None, str]:
    """The session's account, or None and why a session there was has ended."""
    account_id = request.session.get(ACCOUNT_ID)
    if account_id is None:
        return None, ""
    account = Account.objects.filter(pk=account_id).first()
    ended = ""
    if account is None or account.api_key_hash != request.session.get(KEY_HASH):
        ended = "Your API key was reset: sign in with the new one."
    elif account.suspended_at is not None:
        ended = _suspended(account)
    if ended:
        request.session.flush()
        return None, ended
    return account, ""


def _suspended(account: Account) -> str:
    return f"This account is suspended: {account.suspension_reason or 'by a moderator'}."


def _login_name(api_key: str) -> str:
    # What the failed-login counts and the log name a key by: a part of its hash, never the key.
    return f"apikey:{hash_api_key(api_key)[:16]}"


@never_cache
@require_http_methods(["GET", "HEAD", "POST"])
def account_page(request: HttpRequest) -> HttpResponse:
    """The page for a signed-in account, else the sign-in form (a POST signs in)."""
    if request.method == "POST":
        return _sign_in(request)
    account, ended = signed_in(request)
    if account is None:
        return _sign_in_form(request, SignInForm(), refused=ended)
    return render_page(request, account)


def _sign_in_form(request: HttpRequest, form: SignInForm, *, refused: str = "", status: int = 200):
    context = {"title": "Sign in", "form": form, "refused": refused}
    return TemplateResponse(request, "front/account_sign_in.html", context, status=status)


def _sign_in(request: HttpRequest) -> HttpResponse:
    form = SignInForm(request.POST)
    if not form.is_valid():
        return _sign_in_form(request, form)
    api_key = form.cleaned_data["apikey"]
    name = _login_name(api_key)
    if (locked := logins.lockout(request=request, username=name)) is not None:
        refused = f"Too many wrong keys {locked.reason}: {locked.wait}."
        return _sign_in_form(request, SignInForm(), refused=refused, status=429)
    try:
        account = services.key_account(api_key=api_key)
    except errors.InvalidAPIKey:
        logins.record_failure(request=request, username=name, what="account sign-in")
        form.add_error("apikey", "No account has this key.")
        return _sign_in_form(request, form)
    if account.suspended_at is not None:
        return _sign_in_form(request, SignInForm(), refused=_suspended(account), status=403)
    logins.clear_user(username=name, request=request)
    start_session(request, account)
    return HttpResponseRedirect(reverse("front:account"))


@require_POST
def sign_out(request: HttpRequest) -> HttpResponse:
    request.session.flush()
    return HttpResponseRedirect(reverse("front:account"))


def signed_in_or_form(view):
    """Run `view` with the session's account; else the sign-in form, and why."""

    def run(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        account, ended = signed_in(request)
        if account is None:
            return _sign_in_form(request, SignInForm(), refused=ended or "Sign in first.", status=403)
        return view(request, account, *args, **kwargs)

    run.__name__ = view.__name__
    run.__doc__ = view.__doc__
    return never_cache(require_POST(run))


@signed_in_or_form
def reset_key(request: HttpRequest, account: Account) -> HttpResponse:
    """A new key, shown once in this answer; the old one refused at once everywhere (the key is
    looked up in the database on every call; no process keeps a key it saw good)."""
    api_key = services.reset_api_key(account=account)
    request.session[KEY_HASH] = hash_api_key(api_key)
    logger.info("account %s reset its key on the account page", account.pk)
    account.api_key_hash = hash_api_key(api_key)
    return render_page(request, account, new_key=api_key)


@signed_in_or_form
def transfer(request: HttpRequest, account: Account) -> HttpResponse:
    """Kudos sent with `kudos.transfers`, the route's service, its refusals the form's errors."""
    form = TransferForm(request.POST)
    if not form.is_valid():
        return render_page(request, account, transfer_form=form)
    data = form.cleaned_data
    try:
        key = transfers.idempotency_key(header=data["idempotency_key"])
        transfers.take_rate(account_id=account.pk)
        moved = transfers.transfer_kudos(
            source=account, username=data["username"], amount=data["amount"], idempotency_key=key
        )
    except errors.DomainError as refused:
        form.add_error(None, refused.message)
        return render_page(request, account, transfer_form=form)
    messages.success(request, f"Sent {moved} kudos to {data['username']}.")
    return HttpResponseRedirect(reverse("front:account"))


@signed_in_or_form
def worker_maintenance(request: HttpRequest, account: Account, worker_id: UUID) -> HttpResponse:
    """The owner's maintenance toggle, by `workers.services.change_worker`'s rules (a
    moderator's maintenance the owner cannot lift)."""
    wanted = request.POST.get("maintenance") == "on"
    if account.workers.live().filter(pk=worker_id).exists():
        try:
            services.change_worker(caller=account, worker_id=worker_id, maintenance=wanted)
        except errors.DomainError as refused:
            messages.error(request, refused.message)
        else:
            messages.success(request, "Maintenance on." if wanted else "Maintenance off.")
    else:
        # Only the account's own workers: a moderator's account changes others in the admin.
        messages.error(request, "No worker of yours has this id.")
    return HttpResponseRedirect(reverse("front:account") + "#workers")


def _days(now) -> list:
    today = now.date()
    return [today - timedelta(days=n) for n in range(CHART_DAYS - 1, -1, -1)]


def render_page(
    request: HttpRequest,
    account: Account,
    *,
    transfer_form: TransferForm | None = None,
    new_key: str = "",
    first_key: bool = False,
    shared_keys: Section | None = None,
) -> TemplateResponse:
    """The page of a signed-in account; `new_key` shown once, a new account's when `first_key`."""
    now = clock.now()
    days = _days(now)
    since = now.replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=CHART_DAYS - 1)
    flows = Posting.objects.of_account(account.pk).per_day(since=since)
    requested, served = daily_tokens(account_id=account.pk, since=since)
    details = user_details(account, now=now, privileged=True)
    ledger = Paginator(Posting.objects.of_account(account.pk).select_related("event", "wallet"), LEDGER_PAGE)
    context = {
        "title": "Your account",
        "account": account,
        "username": unique_alias(account),
        "details": details,
        "available": holds.available(
            account_id=account.pk, anonymous=account.is_anonymous, pseudonymous=account.pseudonymous
        ),
        "kudos_chart": charts.daily_bars(
            title="Kudos per day, last 30 days",
            days=days,
            series=[
                charts.Series("earned", "earned", {day: flow[0] for day, flow in flows.items()}),
                charts.Series("spent", "spent", {day: flow[1] for day, flow in flows.items()}),
            ],
        ),
        "tokens_chart": charts.daily_bars(
            title="Tokens per day, last 30 days",
            days=days,
            series=[
                charts.Series("requested", "requested", requested),
                charts.Series("served", "served", served),
            ],
        ),
        "ledger": ledger.get_page(request.GET.get("page")),
        "workers": [(worker, worker.is_online(now)) for worker in account.workers.live().order_by("name")],
        "transfer_form": transfer_form or TransferForm(initial={"idempotency_key": uuid4().hex}),
        "shared_keys": shared_keys or section(account, now=now),
        "new_key": new_key,
        "first_key": first_key,
    }
    return TemplateResponse(request, "front/account.html", context)
