"""A moderator's reason for a list action, asked on a second page before the action is taken
and logged with it: the admin's actions that bind or lift something (suspension, maintenance,
pause, cancellation, a key reset) take one, so that the history says why.

`asks_reason` writes that flow once, as Django writes `delete_selected` once: an action is its
words and the one service call it makes."""

import functools
from collections.abc import Callable, Iterable

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db.models import Model, QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse


class ReasonForm(forms.Form):
    reason = forms.CharField(
        max_length=500,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text="Logged with the action; an owner told why (a suspension, a maintenance) sees it.",
    )


# act(modeladmin, request, queryset, reason) -> the objects it changed, each logged.
Act = Callable[[admin.ModelAdmin, HttpRequest, QuerySet, str], Iterable[Model]]


def asks_reason(
    *,
    description: str,
    title: str,
    consequence: str,
    logged: str,
    done: str | None,
    permission: str = "change",
    among: Callable[[QuerySet], QuerySet] | None = None,
) -> Callable[[Act], Callable]:
    """An admin list action that asks for a reason, then runs the decorated `act` with it.

    Each object `act` returns is logged as "`logged`: reason"; `done`, formatted with how many,
    is the message shown after (None: `act` says its own). `among` narrows the selection to
    what the action applies to, both on the page that asks and for `act`."""

    def decorate(act: Act) -> Callable:
        @admin.action(description=description, permissions=[permission])
        @functools.wraps(act)
        def action(modeladmin, request, queryset):
            if among is not None:
                queryset = among(queryset)
            form = ReasonForm(request.POST if "reason" in request.POST else None)
            if form.is_valid():
                reason = form.cleaned_data["reason"]
                changed = list(act(modeladmin, request, queryset, reason))
                for obj in changed:
                    modeladmin.log_change(request, obj, f"{logged}: {reason}")
                if done is not None:
                    modeladmin.message_user(request, done.format(len(changed)), messages.SUCCESS)
                return None
            context = {
                **modeladmin.admin_site.each_context(request),
                "title": title,
                "consequence": consequence,
                "objects": list(queryset),
                "form": form,
                "action": request.POST.get("action", ""),
                "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
                "opts": modeladmin.model._meta,
            }
            return TemplateResponse(request, "admin/front/action_reason.html", context)

        return action

    return decorate
