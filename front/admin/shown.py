"""What the admin's pages share: moderators' narrower rights, times as a list shows them, and
the columns and filters that are a line each."""

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.utils.html import format_html


class ModeratedFieldsMixin:
    """Superusers may change everything; moderators only `moderated_fields`."""

    moderated_fields: tuple[str, ...] = ()

    def get_readonly_fields(self, request, obj=None):
        if request.user.is_superuser:
            return super().get_readonly_fields(request, obj)
        return tuple(f for f in self.fields if f not in self.moderated_fields)


def moment(when: datetime | None) -> str:
    # To the second, as leases are counted; the year is noise in a list of live jobs.
    return "-" if when is None else when.astimezone(UTC).strftime("%m-%d %H:%M:%S")


def full_moment(when: datetime | None) -> str:
    return "-" if when is None else when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def short_id(pk) -> str:
    """The first 8 characters, the whole id on hover (and on the detail page)."""
    return format_html('<span title="{}">{}</span>', pk, str(pk)[:8])


def column(attribute: str, description: str, *, shown: Callable[[Any], Any] = lambda value: value, **display):
    """A column (or a read-only field) of `shown(obj.<attribute>)`: the admin's one-line
    `@admin.display` methods, written once."""
    return admin.display(description=description, **display)(lambda self, obj: shown(getattr(obj, attribute)))


# value -> (label, how it narrows the list)
Choices = dict[str, tuple[str, Callable[[QuerySet], QuerySet]]]


def choice_filter(title: str, parameter: str, choices: Choices) -> type[admin.SimpleListFilter]:
    """A list filter of fixed choices, each its label and how it narrows the queryset."""

    class ChoiceFilter(admin.SimpleListFilter):
        def lookups(self, request, model_admin):
            return [(value, label) for value, (label, _) in choices.items()]

        def queryset(self, request, queryset):
            chosen = choices.get(self.value())
            return chosen[1](queryset) if chosen else queryset

    ChoiceFilter.title, ChoiceFilter.parameter_name = title, parameter
    ChoiceFilter.__name__ = f"{parameter.title().replace('_', '')}Filter"
    return ChoiceFilter
