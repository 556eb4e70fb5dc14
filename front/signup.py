"""Sign-up, `/register`: a name and a proof of work make a pseudonymous account, whose key is
shown once, as the AI Horde's `/register` page makes one without OAuth.

The rules on who may sign up (a timed-out address, raid mode, REGISTRATIONS_PER_ADDRESS) are the
service's, `workers.services.sign_up`; the name's and the proof of work's are this page's.
"""

import unicodedata

from django import forms
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_protect
from django.views.decorators.http import require_http_methods

from front import proof_of_work
from hordeops import clock, errors
from hordeops.ratelimit import request_address
from workers import services
from workers.details import unique_alias

# The AI Horde's longest display name.
NAME_MAX_CHARS = 30
# Control, format (bidirectional overrides, zero-width), surrogate and private-use characters: a
# name shown in lists and logs holds none.
UNPRINTABLE = frozenset({"Cc", "Cf", "Cs", "Co"})


class SignUpForm(forms.Form):
    username = forms.CharField(
        label="Display Name",
        max_length=NAME_MAX_CHARS,
        widget=forms.TextInput(attrs={"placeholder": "Enter Display Name", "autocomplete": "nickname"}),
    )
    # The page's script writes the solution here (`front/static/front/proof_of_work.js`).
    altcha = forms.CharField(required=False, widget=forms.HiddenInput)

    def clean_username(self) -> str:
        name = self.cleaned_data["username"]
        if any(unicodedata.category(char) in UNPRINTABLE for char in name):
            raise forms.ValidationError("A name may not hold control characters.", code="unprintable")
        return name


@never_cache
@csrf_protect  # the web server skips the CSRF middleware outside the admin (hordeops/asgi.py)
@require_http_methods(["GET", "HEAD", "POST"])
def register(request: HttpRequest) -> HttpResponse:
    address = request_address(request)
    now = clock.now()
    try:
        services.refuse_sign_up(address=address)
    except errors.DomainError as refused:
        return refusal(request, refused)
    form = SignUpForm(request.POST if request.method == "POST" else None)
    if form.is_valid():
        try:
            proof_of_work.verify(form.cleaned_data["altcha"])
            account, api_key = services.sign_up(name=form.cleaned_data["username"], address=address, now=now)
        except proof_of_work.Refused as refused:
            form.add_error(None, str(refused))
        except errors.DomainError as refused:
            return refusal(request, refused)
        else:
            context = {"title": "Welcome", "username": unique_alias(account), "api_key": api_key}
            return TemplateResponse(request, "front/registered.html", context)
    context = {"title": "Sign up", "form": form, "challenge": proof_of_work.challenge(now=now)}
    return TemplateResponse(request, "front/register.html", context, status=400 if form.errors else 200)


# The AI Horde's page for a timed-out address ("IP Address Banned"); any other refusal says its own.
TIMED_OUT = "Your IP address has been banned. Please contact a moderator if you believe this is in error."


def refusal(request: HttpRequest, refused: errors.DomainError) -> HttpResponse:
    if isinstance(refused, errors.TimeoutIP):
        context = {"title": "IP Address Banned", "message": TIMED_OUT, "detail": refused.message}
    else:
        offer_providers = isinstance(refused, errors.SignUpClosedInRaid)
        context = {"title": "Not Allowed", "message": refused.message, "offer_providers": offer_providers}
    response = TemplateResponse(request, "front/refused.html", context, status=refused.status)
    for header, value in errors.response_headers(refused, refused.status).items():
        response[header] = value
    return response
