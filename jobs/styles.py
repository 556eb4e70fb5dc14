"""A text request's `style` (the AI Horde's `apply_style`, `horde/apis/v2/kobold.py`): the
request runs under the style it names, or under one of a collection's styles at random, with
the style's prompt template filled with its prompt, the style's params (its own `n` kept) and
the style's models. A style of another account's credits that account: the request pays the
style fee with its horde tax, and the style's author receives it with a `style` record
(`jobs.services.requests.horde_tax`). Finding, making and changing styles is `workers.styles`'.

horde_sdk 0.33.3 sends fields the AI Horde's source does not have (`template_fields`,
`context_fit`; a style's `parameter_policy` and `template_fields`): they are refused, not
silently dropped (`refuse_unserved`).
"""

from dataclasses import dataclass
from typing import Any

from hordeops import errors
from jobs.models import TextRequest
from workers import styles
from workers.models import Account, Style, StyleCollection

# The longest prompt the async route takes, which a filled template may not pass either.
PROMPT_LIMIT = 1_000_000
# The AI Horde's defaults of a request's lengths, where the style sets none.
DEFAULT_LENGTHS = {"max_length": 80, "max_context_length": 2048}

# horde_sdk's fields that the AI Horde's source does not have, by where they are sent, each
# with why it is refused.
UNSERVED_REQUEST_FIELDS = {
    "template_fields": "no style here declares template fields; a style's prompt takes {p} alone.",
    "context_fit": "a prompt is sent as it is, and a worker cuts its front to fit its context.",
}
UNSERVED_STYLE_FIELDS = {
    "template_fields": "a style's prompt takes {p} alone.",
    "parameter_policy": "a request under a style runs with the style's params, its own n kept.",
    "sharedkey": "a style cannot spend a shared key here; the requester pays.",
}


def refuse_unserved(body: Any, unserved: dict[str, str]) -> None:
    """Refuse (400 StyleFieldNotServed) a body that sets one of `unserved` to anything but null."""
    if not isinstance(body, dict):
        return
    for name, why in unserved.items():
        if body.get(name) is not None:
            raise errors.StyleFieldNotServed(name, why)


@dataclass(frozen=True)
class Styled:
    """What a request runs under: its own prompt, params and models, or its style's."""

    prompt: str
    params: dict[str, Any]
    models: list[str]
    style: Style | None = None
    collection: StyleCollection | None = None
    # The style's account, credited with the style fee: None without a style, or for one's own.
    author_id: int | None = None


def apply_style(
    reference: str | None, *, prompt: str, params: dict[str, Any], models: list[str], requester: Account
) -> Styled:
    """The prompt, params and models a request runs under: its own without a `reference`;
    else the style's (or one of the collection's styles') as the AI Horde applies them: the
    template with the request's prompt at `{p}`, the style's params in place of the request's
    but for its `n`, the style's models in place of its own. StyleNotFound when the reference
    names neither a style nor a collection."""
    if reference is None:
        return Styled(prompt=prompt, params=params, models=models)
    found = styles.resolve(reference)
    collection = None
    if isinstance(found, StyleCollection):
        collection, found = found, styles.pick(found)
    return Styled(
        prompt=styles.fill(found.prompt, prompt, limit=PROMPT_LIMIT),
        params={**DEFAULT_LENGTHS, **found.params, "n": params.get("n", 1)},
        models=list(found.model_names),
        style=found,
        collection=collection,
        author_id=None if found.owner_id == requester.pk else found.owner_id,
    )


def count_use(styled: Styled, request: TextRequest | None) -> None:
    """A request queued under a style (not a dry run) adds to its use count, and its
    collection's."""
    if styled.style is not None and request is not None:
        styles.count_use(styled.style, styled.collection)
