"""A moderator's reason for a list action, asked on a second page before the action is taken
and logged with it: the admin's actions that bind or lift something (suspension, maintenance,
pause, cancellation, a key reset) take one, so that the history says why."""

from collections.abc import Callable

from django import forms
from django.contrib.admin import helpers
from django.template.response import TemplateResponse


class ReasonForm(forms.Form):
    reason = forms.CharField(
        max_length=500,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text="Logged with the action; an owner told why (a suspension, a maintenance) sees it.",
    )


def with_reason(
    modeladmin, request, queryset, *, title: str, consequence: str, act: Callable[[str], None]
) -> TemplateResponse | None:
    """Run `act(reason)` once the moderator has given a reason; until then, the page asking
    for it (the selected objects listed). The action's own POST carries the reason once given."""
    form = ReasonForm(request.POST if "reason" in request.POST else None)
    if form.is_valid():
        act(form.cleaned_data["reason"])
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
    return TemplateResponse(request, "admin/hordeops/action_reason.html", context)
