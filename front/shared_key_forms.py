"""The account page's shared keys: the forms that make and change one, and what the section
shows. The forms bound each field as the route's body is bounded (`workers.shared_keys`), so
that a person reads the error beside the field; the services check the same bounds again.
The views that post them are `front.shared_keys`'."""

from dataclasses import dataclass, field
from datetime import datetime
from uuid import UUID

from django import forms

from workers import shared_keys
from workers.models import Account, SharedKey

SHORTEST, LONGEST = shared_keys.NAME_LENGTH
NOT_YOURS = "No shared key of yours has this id."


def _number(label: str, most: int, **options) -> forms.IntegerField:
    return forms.IntegerField(label=label, min_value=SharedKey.UNLIMITED, max_value=most, **options)


class CreateForm(forms.Form):
    name = forms.CharField(label="Name", min_length=SHORTEST, max_length=LONGEST, required=False)
    kudos = _number("Kudos budget (-1: unlimited)", shared_keys.MAX_KUDOS, initial=5000)
    expiry = _number("Expires in days (-1: never)", shared_keys.MAX_EXPIRY_DAYS, initial=-1)
    max_text_tokens = _number("Most tokens a request (-1: any)", shared_keys.MAX_TEXT_TOKENS, initial=-1)


UNCHANGED = {"placeholder": "unchanged"}


class EditForm(forms.Form):
    """As the route's PATCH: a field left empty is left as it is."""

    name = forms.CharField(
        label="Name",
        min_length=SHORTEST,
        max_length=LONGEST,
        required=False,
        empty_value=None,
        widget=forms.TextInput(attrs=UNCHANGED),
    )
    kudos = _number(
        "Kudos budget", shared_keys.MAX_KUDOS, required=False, widget=forms.NumberInput(UNCHANGED)
    )
    expiry = _number(
        "Expires in days from now",
        shared_keys.MAX_EXPIRY_DAYS,
        required=False,
        widget=forms.NumberInput(UNCHANGED),
    )
    max_text_tokens = _number(
        "Most tokens a request",
        shared_keys.MAX_TEXT_TOKENS,
        required=False,
        widget=forms.NumberInput(UNCHANGED),
    )


def edit_form(key_id: UUID, data=None) -> EditForm:
    """A key's form, its fields' ids its own: the page holds one form per key."""
    return EditForm(data, auto_id=f"key-{key_id}-%s")


@dataclass(frozen=True)
class Row:
    key: SharedKey
    expired: bool
    form: EditForm
    open: bool = False  # the form was sent and refused: shown open, with why


@dataclass(frozen=True)
class Section:
    rows: list[Row]
    create_form: CreateForm
    allowed: int
    refused: list[str] = field(default_factory=list)


def section(
    account: Account,
    *,
    now: datetime,
    create_form: CreateForm | None = None,
    edited: tuple[UUID, EditForm] | None = None,
    refused: str = "",
) -> Section:
    """The account's keys, oldest first, each with its form (`edited`'s, refused, in its row);
    a refusal about no key of the account's (another's, or one gone) at the section's head."""
    rows, errors = [], [refused] if refused else []
    for key in account.shared_keys.order_by("created_at"):
        if edited is not None and edited[0] == key.pk:
            rows.append(Row(key, key.is_expired(now), edited[1], open=True))
        else:
            rows.append(Row(key, key.is_expired(now), edit_form(key.pk)))
    if edited is not None and all(row.key.pk != edited[0] for row in rows):
        # Its form never reached the service when a field was refused: say whose it is not.
        errors += edited[1].non_field_errors() or [NOT_YOURS]
    return Section(
        rows=rows,
        create_form=create_form or CreateForm(),
        allowed=shared_keys.allowed(account),
        refused=errors,
    )
