"""Text styles and their collections (`workers.models.Style`, `StyleCollection`), as the AI
Horde's `/v2/styles/text` and `/v2/collections` rule them (`horde/apis/v2/kobold_styles.py`,
`styles.py`, `horde/classes/base/style.py`): who makes, changes and deletes one, how one is
found by its id or its name, the template's rule, and the shapes the routes answer.

A trusted account, or one a moderator gave the customizer role, makes styles and collections,
never the anonymous account; only its owner changes one; its owner or a moderator deletes it.
What a request naming a style runs under is `jobs.styles`'.
"""

import random
import string
from collections.abc import Iterable
from typing import Any
from uuid import UUID

from django.db import IntegrityError, transaction
from django.db.models import F, QuerySet

from hordeops import errors, ratelimit
from workers.details import TEXT, unique_alias
from workers.models import Account, Style, StyleCollection

# The AI Horde's limit on making styles, 20 an hour (per account here).
CREATIONS = (20 / 3600, 20)
# The AI Horde's page of styles and collections.
PAGE_SIZE = 25
SORTS = ("popular", "age")
# What a prompt template holds where the request's prompt goes.
PROMPT_FIELD = "p"
# The AI Horde's prompt when a style is made without one: `{np}`, an image style's negative
# prompt, is left empty in a text request's.
DEFAULT_PROMPT = "{p}{np}"

Found = Style | StyleCollection


def take_rate(*, account_id: int) -> None:
    """Spend one of the account's style creations (`CREATIONS`), or refuse (429) with the wait."""
    rate, burst = CREATIONS
    if wait := ratelimit.take([ratelimit.Bucket(f"hordeops:rate:styles:{account_id}", rate, burst)]):
        raise errors.RateLimited(wait_seconds=wait, refusal="rate_limit")


def may_make(account: Account) -> None:
    """Only a trusted or customizer account makes styles and collections; the anonymous
    account never (asked first: it may not, whatever it is)."""
    if account.is_anonymous:
        raise errors.StylesAnonForbidden("Anonymous users cannot create styles or collections.")
    if not (account.trusted or account.customizer):
        raise errors.StylesRequiresCustomizer()


# --- The prompt template ------------------------------------------------------------------------


def template_pieces(template: str) -> list[tuple[str, str | None]]:
    """The template as the AI Horde's `format_map(defaultdict(str, p=prompt))` reads it: each
    piece's literal text, then the placeholder after it (None at the end). Only a plain
    `{name}` is a placeholder here: one the AI Horde would fail on as it applies the style (a
    stray brace, `{0}`, `{p.x}`, `{p[0]}`, `{p!r}`, `{p:>9}`) is refused (StylePromptInvalid)."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError:
        raise errors.StylePromptInvalid() from None
    pieces = []
    for literal, name, spec, conversion in parsed:
        if name is not None and (not name.isidentifier() or spec or conversion):
            raise errors.StylePromptInvalid()
        pieces.append((literal, name))
    return pieces


def check_template(template: str) -> None:
    """A style's prompt holds `{p}` (the AI Horde's test of the text, StylePromptMissingVars)
    and only what `template_pieces` takes."""
    if "{p}" not in template:
        raise errors.StylePromptMissingVars()
    template_pieces(template)


def fill(template: str, prompt: str, *, limit: int) -> str:
    """The template with the request's prompt at each `{p}` and every other placeholder empty,
    as the AI Horde fills it; refused past `limit` characters before it is built."""
    pieces = template_pieces(template)
    size = sum(len(literal) + (len(prompt) if name == PROMPT_FIELD else 0) for literal, name in pieces)
    if size > limit:
        raise errors.BadRequest(
            f"The styled prompt would be {size} characters, more than the {limit} a prompt may hold."
        )
    return "".join(literal + (prompt if name == PROMPT_FIELD else "") for literal, name in pieces)


# --- Finding one -----------------------------------------------------------------------------------


def _uuid(reference: str) -> UUID | None:
    try:
        return UUID(reference)
    except ValueError:
        return None


def find_style(style_id: str) -> Style:
    """The style of that id; StyleNotFound for any other id."""
    pk = _uuid(style_id)
    style = Style.objects.select_related("owner").filter(pk=pk).first() if pk else None
    if style is None:
        raise errors.StyleNotFound(style_id)
    return style


def find_collection(collection_id: str) -> StyleCollection:
    """The collection of that id, with its styles; CollectionNotFound for any other id."""
    pk = _uuid(collection_id)
    found = _with_styles(StyleCollection.objects.filter(pk=pk)).first() if pk else None
    if found is None:
        raise errors.CollectionNotFound(collection_id)
    return found


def _with_styles(collections: QuerySet) -> QuerySet:
    return collections.select_related("owner").prefetch_related("styles__owner")


def _owner_id(alias: str) -> int | None:
    """The account an alias names, as the AI Horde reads it: by the id after its last `#`."""
    digits = alias.rsplit("#", 1)[-1].strip()
    return int(digits) if digits.isascii() and digits.isdigit() and len(digits) <= 18 else None


def by_name(reference: str, *, collections: bool | None) -> Found | None:
    """A style or collection by name, as the AI Horde's `get_style_by_name` finds it: `name`,
    `alias::name`, `style::name` / `collection::name`, or `style::alias::name` (the unique name
    the routes answer, e.g. `db0#1::style::dark`). `collections`: False for styles only, True
    for collections only, None for either (a style first, or as the prefix says). Where several
    owners have one of that name, the oldest; an alias that names no account finds nothing."""
    parts = reference.split("::")
    name, alias = parts[-1], None
    if len(parts) == 3:
        kind, alias = parts[0], parts[1]
        if collections is None and kind in ("style", "collection"):
            collections = kind == "collection"
    elif len(parts) == 2:
        if parts[0] in ("style", "collection"):
            if collections is None:
                collections = parts[0] == "collection"
        else:
            alias = parts[0]
    owner = None
    if alias is not None:
        owner = _owner_id(alias)
        if owner is None:
            return None
    kinds: list[type[Found]] = [Style, StyleCollection]
    if collections is not None:
        kinds = [StyleCollection] if collections else [Style]
    for kind in kinds:
        found = kind.objects.filter(name=name)
        if owner is not None:
            found = found.filter(owner_id=owner)
        if kind is StyleCollection:
            found = _with_styles(found)
        else:
            found = found.select_related("owner")
        if (first := found.order_by("created_at", "pk").first()) is not None:
            return first
    return None


def style_by_name(reference: str) -> Style:
    found = by_name(reference, collections=False)
    if found is None:
        raise errors.StyleNotFound(reference)
    return found


def collection_by_name(reference: str) -> StyleCollection:
    found = by_name(reference, collections=True)
    if found is None:
        raise errors.CollectionNotFound(reference)
    return found


def resolve(reference: str) -> Found:
    """What a request's `style` names, as the AI Horde's `apply_style` looks it up: a style's
    id, else a collection's, else a name (`by_name`); StyleNotFound for nothing."""
    pk = _uuid(reference)
    if pk is not None:
        style = Style.objects.select_related("owner").filter(pk=pk).first()
        if style is not None:
            return style
        collection = _with_styles(StyleCollection.objects.filter(pk=pk)).first()
        if collection is not None:
            return collection
    found = by_name(reference, collections=None)
    if found is None:
        raise errors.StyleNotFound(reference)
    return found


def pick(collection: StyleCollection) -> Style:
    """The style a request naming the collection runs under: one of its styles, at random."""
    styles = list(collection.styles.all())
    if not styles:
        raise errors.BadRequest(f"The collection '{collection.name}' holds no style to apply.")
    return random.choice(styles)


# --- The routes' shapes -------------------------------------------------------------------------


def unique_name(style: Style) -> str:
    """The AI Horde's `get_unique_name`: `alias::style::name`, which `by_name` finds."""
    return f"{unique_alias(style.owner)}::style::{style.name}"


def style_details(style: Style) -> dict[str, Any]:
    """The AI Horde's `StyleKobold` (horde_sdk 0.33.3's model of it)."""
    return {
        "name": style.name,
        "info": style.info,
        "prompt": style.prompt,
        "params": style.params,
        "public": style.public,
        "nsfw": style.nsfw,
        "tags": style.tags,
        "models": style.model_names,
        "id": str(style.pk),
        "use_count": style.use_count,
        "creator": unique_alias(style.owner),
    }


def collection_details(collection: StyleCollection) -> dict[str, Any]:
    """The AI Horde's `ResponseModelCollection`: its styles by unique name and id."""
    styles = sorted(collection.styles.all(), key=lambda style: (style.name, style.owner_id))
    return {
        "id": str(collection.pk),
        "name": collection.name,
        "type": TEXT,
        "info": collection.info or None,
        "public": collection.public,
        "styles": [{"name": unique_name(style), "id": str(style.pk)} for style in styles],
        "use_count": collection.use_count,
    }


def changed_answer(found: Found) -> dict[str, str]:
    """The AI Horde's `StyleModify`."""
    return {"id": str(found.pk), "message": "OK"}


def account_styles(
    account: Account, *, privileged: bool, rows: list[tuple[Any, str]] | None = None
) -> list[dict[str, str]]:
    """The account's styles as its `UserDetails` lists them (`ResponseModelStylesUser`): the
    public ones, every one to itself or a moderator. `rows` (id, name), as `public_styles_of` reads
    them for many accounts at once; read here when not given."""
    if rows is None:
        styles = account.styles.order_by("name")
        if not privileged:
            styles = styles.filter(public=True)
        rows = list(styles.values_list("pk", "name"))
    alias = unique_alias(account)
    return [{"name": f"{alias}::style::{name}", "id": str(pk), "type": TEXT} for pk, name in rows]


def public_styles_of(account_ids: list[int]) -> dict[int, list[tuple[Any, str]]]:
    """The public styles (id, name) of each of `account_ids`, by name: one statement."""
    found: dict[int, list[tuple[Any, str]]] = {pk: [] for pk in account_ids}
    rows = Style.objects.filter(owner_id__in=account_ids, public=True).order_by("name")
    for owner_id, pk, name in rows.values_list("owner_id", "pk", "name"):
        found[owner_id].append((pk, name))
    return found


def _page(page: int) -> slice:
    start = (page - 1) * PAGE_SIZE
    return slice(start, start + PAGE_SIZE)


def _check_sort(sort: str) -> None:
    if sort not in SORTS:
        raise errors.BadRequest("'sort' needs to be one of ['popular', 'age']")


def _ordered(found: QuerySet, sort: str) -> QuerySet:
    return (
        found.order_by("created_at", "pk")
        if sort == "age"
        else found.order_by("-use_count", "created_at", "pk")
    )


def public_styles(*, sort: str, page: int, tag: str | None = None, model: str | None = None) -> list[Style]:
    """A page of the public styles, the most used or the oldest first, with a tag or a model."""
    _check_sort(sort)
    found = Style.objects.filter(public=True).select_related("owner")
    if tag is not None:
        found = found.filter(tags__contains=[tag])
    if model is not None:
        found = found.filter(model_names__contains=[model])
    return list(_ordered(found, sort)[_page(page)])


def public_collections(*, sort: str, page: int, kind: str) -> list[StyleCollection]:
    """A page of the public collections; `kind` `image` finds none (hordeops has text styles only)."""
    _check_sort(sort)
    if kind not in ("all", "image", "text"):
        raise errors.BadRequest("'type' needs to be one of ['all', 'image', 'text']")
    if kind == "image":
        return []
    return list(_ordered(_with_styles(StyleCollection.objects.filter(public=True)), sort)[_page(page)])


# --- Making, changing, deleting ---------------------------------------------------------------------


def _models(models: Iterable[str]) -> list[str]:
    chosen = list(dict.fromkeys(models))
    if len(chosen) > Style.MAX_MODELS:
        raise errors.BadRequest(f"A style can only use a maximum of {Style.MAX_MODELS} models.")
    if not chosen:
        raise errors.BadRequest("A style has to specify at least one model.")
    return chosen


def _tags(tags: Iterable[str]) -> list[str]:
    chosen = list(dict.fromkeys(tags))
    if len(chosen) > Style.MAX_TAGS:
        raise errors.BadRequest(f"A style can be tagged a maximum of {Style.MAX_TAGS} times.")
    return chosen


def _params(params: dict[str, Any]) -> dict[str, Any]:
    """The AI Horde's `validate_text_params`: the context holds the reply (its defaults if unset)."""
    if params.get("max_context_length", 2048) < params.get("max_length", 80):
        raise errors.TokenOverflow("You cannot request more tokens than your context length.")
    return params


def _name_taken(kind: type[Found], owner: Account, name: str, *, but: UUID | None = None) -> bool:
    return kind.objects.filter(owner=owner, name=name).exclude(pk=but).exists()


def _taken(kind: type[Found], owner: Account, name: str) -> errors.BadRequest:
    word = "Style" if kind is Style else "Collection"
    return errors.BadRequest(
        f"{word} with name '{name}' already exists for user '{unique_alias(owner)}'. "
        "Please use a different name, or PATCH to modify the existing one."
    )


def _saved(kind: type[Found], owner: Account, name: str, save) -> None:
    """Run `save`; a name taken in the same instant is refused as one taken before."""
    try:
        with transaction.atomic():
            save()
    except IntegrityError:
        raise _taken(kind, owner, name) from None


def create_style(
    *,
    caller: Account,
    name: str,
    prompt: str = DEFAULT_PROMPT,
    info: str | None = None,
    params: dict[str, Any] | None = None,
    models: list[str] | None = None,
    tags: list[str] | None = None,
    public: bool = True,
    nsfw: bool = False,
) -> Style:
    """POST /api/v2/styles/text: a trusted or customizer account's new style, its name unique
    among its own; 1 to 5 models, at most 10 tags; at most `CREATIONS` an hour."""
    may_make(caller)
    style = Style(
        owner=caller,
        name=name,
        info=info or "",
        prompt=prompt,
        params=_params(params or {}),
        model_names=_models(models or []),
        tags=_tags(tags or []),
        public=public,
        nsfw=nsfw,
    )
    check_template(prompt)
    if _name_taken(Style, caller, name):
        raise _taken(Style, caller, name)
    take_rate(account_id=caller.pk)
    _saved(Style, caller, name, style.save)
    return style


def modify_style(*, caller: Account, style_id: str, **changes: Any) -> Style:
    """PATCH /api/v2/styles/text/{id}: its owner changes what the body gives (None: as it was;
    `models` empty: as they were, as on the AI Horde; `tags` given: replaced, emptied by [])."""
    style = find_style(style_id)
    if style.owner_id != caller.pk:
        raise errors.Forbidden(f"This Style is not owned by user {unique_alias(caller)}")
    if changes.get("models"):
        style.model_names = _models(changes["models"])
    if changes.get("tags") is not None:
        style.tags = _tags(changes["tags"])
    if changes.get("prompt") is not None:
        check_template(changes["prompt"])
        style.prompt = changes["prompt"]
    if changes.get("params") is not None:
        style.params = _params(changes["params"])
    for field in ("name", "info", "public", "nsfw"):
        if changes.get(field) is not None:
            setattr(style, field, changes[field])
    if changes.get("name") is not None and _name_taken(Style, caller, style.name, but=style.pk):
        raise _taken(Style, caller, style.name)
    _saved(Style, caller, style.name, style.save)
    return style


def delete_style(*, caller: Account, style_id: str) -> None:
    """DELETE /api/v2/styles/text/{id}: by its owner or a moderator; it leaves its collections."""
    if caller.is_anonymous:
        raise errors.StylesAnonForbidden("Anonymous users cannot delete styles")
    style = find_style(style_id)
    if not style.may_delete(caller):
        raise errors.Forbidden(f"This Style is not owned by user {unique_alias(caller)}")
    Style.objects.filter(pk=style.pk).delete()


def _styles(references: list[str]) -> list[Style]:
    """The styles a collection's body names, each by its id or its name, once each in order."""
    if not references:
        raise errors.BadRequest("A collection has to include at least 1 style")
    if len(references) > StyleCollection.MAX_STYLES:
        raise errors.BadRequest(f"A collection can include at most {StyleCollection.MAX_STYLES} styles.")
    found: dict[UUID, Style] = {}
    for reference in references:
        pk = _uuid(reference)
        style = Style.objects.filter(pk=pk).first() if pk else None
        if style is None:
            style = by_name(reference, collections=False)
        if style is None:
            raise errors.BadRequest(f"A style with name '{reference[:255]}' cannot be found")
        found.setdefault(style.pk, style)
    return list(found.values())


def create_collection(
    *, caller: Account, name: str, styles: list[str], info: str | None = None, public: bool = True
) -> StyleCollection:
    """POST /api/v2/collections: a trusted or customizer account's collection of styles (any
    style, by its id or its name), its name unique among its own."""
    may_make(caller)
    chosen = _styles(styles)
    if _name_taken(StyleCollection, caller, name):
        raise _taken(StyleCollection, caller, name)
    collection = StyleCollection(owner=caller, name=name, info=info or "", public=public)

    def save() -> None:
        collection.save()
        collection.styles.set(chosen)

    _saved(StyleCollection, caller, name, save)
    return collection


def modify_collection(
    *,
    caller: Account,
    collection_id: str,
    name: str | None = None,
    info: str | None = None,
    public: bool | None = None,
    styles: list[str] | None = None,
) -> StyleCollection:
    """PATCH /api/v2/collections/{id}: its owner changes what the body gives; `styles`, when
    given, replace its styles."""
    collection = find_collection(collection_id)
    if collection.owner_id != caller.pk:
        raise errors.Forbidden(f"This Collection is not owned by user {unique_alias(caller)}")
    chosen = _styles(styles) if styles is not None else None
    if name is not None:
        if _name_taken(StyleCollection, caller, name, but=collection.pk):
            raise _taken(StyleCollection, caller, name)
        collection.name = name
    if info is not None:
        collection.info = info
    if public is not None:
        collection.public = public

    def save() -> None:
        collection.save()
        if chosen is not None:
            collection.styles.set(chosen)

    _saved(StyleCollection, caller, collection.name, save)
    return collection


def delete_collection(*, caller: Account, collection_id: str) -> None:
    """DELETE /api/v2/collections/{id}: by its owner or a moderator; its styles stay."""
    collection = find_collection(collection_id)
    if not collection.may_delete(caller):
        raise errors.Forbidden(f"This Collection is not owned by user {unique_alias(caller)}")
    StyleCollection.objects.filter(pk=collection.pk).delete()


def count_use(style: Style, collection: StyleCollection | None = None) -> None:
    """A request was queued under the style (through the collection): their use counts grow."""
    Style.objects.filter(pk=style.pk).update(use_count=F("use_count") + 1)
    if collection is not None:
        StyleCollection.objects.filter(pk=collection.pk).update(use_count=F("use_count") + 1)
