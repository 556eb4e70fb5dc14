"""The account page's shared keys (`/account#shared-keys`): the signed-in account makes,
changes and deletes its own, each a POST under CSRF, through the services and limits of the
`/api/v2/sharedkeys` routes (`workers.shared_keys`), their refusals the forms' errors.

A refused form answers the page again, 400, the form filled in as it was sent."""

import logging
from uuid import UUID

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse

from front.account import render_page, signed_in_or_form
from front.shared_key_forms import CreateForm, edit_form, section
from hordeops import clock, errors
from workers import shared_keys
from workers.models import Account

logger = logging.getLogger(__name__)

# The route's words for a key no one has ("No user matching sent Shared Key.") speak to a
# client sending it as its key; on the page it is the id of one that is gone.
GONE = "No shared key has this id: it was deleted?"


def _back() -> HttpResponseRedirect:
    return HttpResponseRedirect(reverse("front:account") + "#shared-keys")


def _refused(request: HttpRequest, account: Account, **shown) -> HttpResponse:
    answer = render_page(request, account, shared_keys=section(account, now=clock.now(), **shown))
    answer.status_code = 400
    return answer


def _why(refused: errors.DomainError) -> str:
    return GONE if isinstance(refused, errors.SharedKeyNotFound) else refused.message


@signed_in_or_form
def create(request: HttpRequest, account: Account) -> HttpResponse:
    """A new key, as `PUT /api/v2/sharedkeys` makes one: its rate, its count and its bounds."""
    form = CreateForm(request.POST)
    if form.is_valid():
        try:
            shared_keys.take_rate(account_id=account.pk)
            key = shared_keys.create_shared_key(owner=account, now=clock.now(), **form.cleaned_data)
        except errors.DomainError as refused:
            form.add_error(None, refused.message)
        else:
            logger.info("account %s made a shared key on the account page", account.pk)
            messages.success(request, f"Made the shared key {key.name or 'without a name'}: {key.pk}.")
            return _back()
    return _refused(request, account, create_form=form)


@signed_in_or_form
def edit(request: HttpRequest, account: Account, key_id: UUID) -> HttpResponse:
    """What the form gives of one of the account's keys, as `PATCH /api/v2/sharedkeys/{id}`."""
    form = edit_form(key_id, request.POST)
    if form.is_valid():
        try:
            shared_keys.modify_shared_key(
                owner=account, key_id=str(key_id), now=clock.now(), **form.cleaned_data
            )
        except errors.DomainError as refused:
            form.add_error(None, _why(refused))
        else:
            messages.success(request, f"Changed the shared key {key_id}.")
            return _back()
    return _refused(request, account, edited=(key_id, form))


@signed_in_or_form
def delete(request: HttpRequest, account: Account, key_id: UUID) -> HttpResponse:
    """One of the account's keys, as `DELETE /api/v2/sharedkeys/{id}`: refused at once everywhere."""
    try:
        shared_keys.delete_shared_key(owner=account, key_id=str(key_id))
    except errors.DomainError as refused:
        return _refused(request, account, refused=_why(refused))
    logger.info("account %s deleted a shared key on the account page", account.pk)
    messages.success(request, f"Deleted the shared key {key_id}: it works nowhere now.")
    return _back()
