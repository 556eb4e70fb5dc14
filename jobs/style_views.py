"""The AI Horde's text style and collection routes (`/v2/styles/text`, `/v2/collections`):
parse, call one service of `workers.styles`, shape the answer. A style's params are a text
request's (`jobs.serializers.TextParamsInput`), hence these routes are the jobs app's. Image
styles are not served."""

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from hordeops import errors
from hordeops.api import validated_body
from hordeops.parsing import ascii_int
from hordeops.replica import replica_reads
from hordeops.serializers import (
    APIKEY,
    APIKEY_AUTH,
    HordeErrorOutput,
    StrictBooleanField,
    StrictCharField,
    StrictIntegerField,
    keyed_route,
)
from jobs.serializers import TextParamsInput
from jobs.styles import PROMPT_LIMIT, UNSERVED_STYLE_FIELDS, refuse_unserved
from workers import styles
from workers.models import Style, StyleCollection
from workers.services import authenticate
from workers.views import SIMPLE

ERRORS = {code: HordeErrorOutput for code in (400, 401, 403, 404, 429)}
LISTED = {400: HordeErrorOutput, 429: HordeErrorOutput}
# The AI Horde's page numbers run from 1; more digits than any page of 25 could reach are refused.
PAGE_DIGITS = 6


class StyleParamsInput(TextParamsInput):
    """A style's `params` (the AI Horde's `ModelStyleInputParamsKobold`, horde_sdk's with the
    lengths): a text request's sampling params, only those the style's author sets. Its `n` is
    the request's; hordeops' own params (OpenAI's penalties and biases, `sampler_seed`) are not
    a style's, as horde_sdk's model of a style has no field for them."""

    n = None
    max_length = StrictIntegerField(min_value=16, max_value=16384, required=False)
    max_context_length = StrictIntegerField(min_value=80, max_value=1048576, required=False)
    frequency_penalty = None
    presence_penalty = None
    logit_bias = None
    sampler_seed = None


def _list(child: serializers.Field) -> serializers.ListField:
    # The counts (5 models, 10 tags) are the service's, refused in the AI Horde's words.
    return serializers.ListField(child=child, required=False, allow_null=True)


class StyleInput(serializers.Serializer):
    """The AI Horde's `ModelStyleInputKobold`, its bounds as it states them."""

    name = StrictCharField(
        min_length=Style.NAME_LENGTH[0], max_length=Style.NAME_LENGTH[1], trim_whitespace=False
    )
    info = StrictCharField(
        min_length=Style.INFO_LENGTH[0],
        max_length=Style.INFO_LENGTH[1],
        required=False,
        allow_null=True,
        trim_whitespace=False,
    )
    prompt = StrictCharField(
        min_length=3, max_length=PROMPT_LIMIT, default=styles.DEFAULT_PROMPT, trim_whitespace=False
    )
    params = StyleParamsInput(required=False, allow_null=True)
    public = StrictBooleanField(default=True)
    nsfw = StrictBooleanField(default=False)
    tags = _list(StrictCharField(min_length=1, max_length=Style.TAG_LENGTH))
    models = _list(StrictCharField(min_length=1, max_length=255))


class StylePatchInput(StyleInput):
    """The AI Horde's `ModelStylePatchKobold`: each field optional, null as if not sent."""

    name = StrictCharField(
        min_length=Style.NAME_LENGTH[0],
        max_length=Style.NAME_LENGTH[1],
        required=False,
        allow_null=True,
        trim_whitespace=False,
    )
    info = StrictCharField(
        min_length=1, max_length=1000, required=False, allow_null=True, trim_whitespace=False
    )
    prompt = StrictCharField(
        min_length=7, max_length=PROMPT_LIMIT, required=False, allow_null=True, trim_whitespace=False
    )
    public = StrictBooleanField(required=False, allow_null=True)
    nsfw = StrictBooleanField(required=False, allow_null=True)


class StyleOutput(serializers.Serializer):
    """The AI Horde's `StyleKobold`."""

    name = serializers.CharField()
    info = serializers.CharField(allow_blank=True)
    prompt = serializers.CharField()
    params = serializers.DictField()
    public = serializers.BooleanField()
    nsfw = serializers.BooleanField()
    tags = serializers.ListField(child=serializers.CharField())
    models = serializers.ListField(child=serializers.CharField())
    id = serializers.UUIDField()
    use_count = serializers.IntegerField()
    creator = serializers.CharField()


class CollectionInput(serializers.Serializer):
    """The AI Horde's `InputModelCollection` (its styles by id or name)."""

    name = StrictCharField(
        min_length=StyleCollection.NAME_LENGTH[0],
        max_length=StyleCollection.NAME_LENGTH[1],
        trim_whitespace=False,
    )
    info = StrictCharField(
        min_length=StyleCollection.INFO_LENGTH[0],
        max_length=StyleCollection.INFO_LENGTH[1],
        required=False,
        allow_null=True,
        trim_whitespace=False,
    )
    public = StrictBooleanField(default=True)
    styles = serializers.ListField(child=StrictCharField(min_length=1, max_length=512, trim_whitespace=False))


class CollectionPatchInput(CollectionInput):
    name = StrictCharField(
        min_length=StyleCollection.NAME_LENGTH[0],
        max_length=StyleCollection.NAME_LENGTH[1],
        required=False,
        allow_null=True,
        trim_whitespace=False,
    )
    public = StrictBooleanField(required=False, allow_null=True)
    styles = serializers.ListField(
        child=StrictCharField(min_length=1, max_length=512, trim_whitespace=False),
        required=False,
        allow_null=True,
    )


class StyleShortOutput(serializers.Serializer):
    """The AI Horde's `ResponseModelStylesShort`."""

    name = serializers.CharField()
    id = serializers.UUIDField()


class CollectionOutput(serializers.Serializer):
    """The AI Horde's `ResponseModelCollection`."""

    id = serializers.UUIDField()
    name = serializers.CharField()
    type = serializers.ChoiceField(choices=["text"])
    info = serializers.CharField(allow_null=True)
    public = serializers.BooleanField()
    styles = StyleShortOutput(many=True)
    use_count = serializers.IntegerField()


MODIFIED = inline_serializer(
    "StyleModify", {"id": serializers.UUIDField(), "message": serializers.CharField()}
)
STYLE_ID = OpenApiParameter("style_id", OpenApiTypes.UUID, OpenApiParameter.PATH)
COLLECTION_ID = OpenApiParameter("collection_id", OpenApiTypes.UUID, OpenApiParameter.PATH)
SORT = OpenApiParameter("sort", str, enum=list(styles.SORTS), description="popular (the default) or age")
PAGE = OpenApiParameter(
    "page", {"type": "integer", "minimum": 1, "maximum": 10**PAGE_DIGITS - 1}, description="from 1; 25 a page"
)


def _valid(serializer_class, request: Request, *, unserved: dict[str, str] | None = None) -> dict:
    refuse_unserved(request.data, unserved or {})
    return validated_body(serializer_class, request)


def _listing(request: Request) -> dict:
    """The list routes' `sort` and `page`, as the AI Horde reads them."""
    page = request.query_params.get("page", "1")
    number = ascii_int(page, max_digits=PAGE_DIGITS)
    if not number:
        raise errors.BadRequest("'page' needs to be a whole number from 1.")
    return {"sort": request.query_params.get("sort", "popular"), "page": number}


class TextStylesView(APIView):
    @replica_reads
    @extend_schema(
        operation_id="styles_text",
        parameters=[SORT, PAGE, OpenApiParameter("tag", str), OpenApiParameter("model", str)],
        responses={200: StyleOutput(many=True), **LISTED},
    )
    def get(self, request: Request) -> Response:
        """The public text styles, the most used (or the oldest) first, 25 a page; with `tag`
        or `model`, only those that have it."""
        found = styles.public_styles(
            **_listing(request), tag=request.query_params.get("tag"), model=request.query_params.get("model")
        )
        return Response([styles.style_details(style) for style in found])

    @keyed_route("style_text_create", body=StyleInput, answer=MODIFIED, refusals=ERRORS)
    def post(self, request: Request) -> Response:
        """Make a text style: trusted or customizer accounts only (403 `StylesRequiresCustomizer`)."""
        caller = authenticate(api_key=request.headers.get("apikey"))
        data = _valid(StyleInput, request, unserved=UNSERVED_STYLE_FIELDS)
        style = styles.create_style(caller=caller, **data)
        return Response(styles.changed_answer(style))


class TextStyleView(APIView):
    @replica_reads
    @extend_schema(operation_id="style_text", parameters=[STYLE_ID], responses={200: StyleOutput, **ERRORS})
    def get(self, request: Request, style_id: str) -> Response:
        """A text style, public or not, by its id."""
        return Response(styles.style_details(styles.find_style(style_id)))

    @extend_schema(
        operation_id="style_text_modify",
        auth=APIKEY_AUTH,
        parameters=[STYLE_ID, APIKEY],
        request=StylePatchInput,
        responses={200: MODIFIED, **ERRORS},
    )
    def patch(self, request: Request, style_id: str) -> Response:
        """Change a text style, as its owner."""
        caller = authenticate(api_key=request.headers.get("apikey"))
        data = _valid(StylePatchInput, request, unserved=UNSERVED_STYLE_FIELDS)
        style = styles.modify_style(caller=caller, style_id=style_id, **data)
        return Response(styles.changed_answer(style))

    @extend_schema(
        operation_id="style_text_delete",
        auth=APIKEY_AUTH,
        parameters=[STYLE_ID, APIKEY],
        responses={200: SIMPLE, **ERRORS},
    )
    def delete(self, request: Request, style_id: str) -> Response:
        """Delete a text style, as its owner or a moderator: it leaves its collections."""
        caller = authenticate(api_key=request.headers.get("apikey"))
        styles.delete_style(caller=caller, style_id=style_id)
        return Response({"message": "OK"})


class TextStyleByNameView(APIView):
    @replica_reads
    @extend_schema(operation_id="style_text_by_name", responses={200: StyleOutput, **ERRORS})
    def get(self, request: Request, style_name: str) -> Response:
        """A text style by name: `name`, `alias::name` or its unique `alias::style::name`."""
        return Response(styles.style_details(styles.style_by_name(style_name)))


class CollectionsView(APIView):
    @replica_reads
    @extend_schema(
        operation_id="collections",
        parameters=[SORT, PAGE, OpenApiParameter("type", str, enum=["all", "image", "text"])],
        responses={200: CollectionOutput(many=True), **LISTED},
    )
    def get(self, request: Request) -> Response:
        """The public collections, the most used (or the oldest) first, 25 a page; `type=image`
        finds none."""
        found = styles.public_collections(**_listing(request), kind=request.query_params.get("type", "all"))
        return Response([styles.collection_details(collection) for collection in found])

    @keyed_route("collection_create", body=CollectionInput, answer=MODIFIED, refusals=ERRORS)
    def post(self, request: Request) -> Response:
        """Make a collection of styles: trusted or customizer accounts only."""
        caller = authenticate(api_key=request.headers.get("apikey"))
        data = _valid(CollectionInput, request)
        collection = styles.create_collection(caller=caller, **data)
        return Response(styles.changed_answer(collection))


class CollectionView(APIView):
    @replica_reads
    @extend_schema(
        operation_id="collection", parameters=[COLLECTION_ID], responses={200: CollectionOutput, **ERRORS}
    )
    def get(self, request: Request, collection_id: str) -> Response:
        """A collection, public or not, by its id."""
        return Response(styles.collection_details(styles.find_collection(collection_id)))

    @extend_schema(
        operation_id="collection_modify",
        auth=APIKEY_AUTH,
        parameters=[COLLECTION_ID, APIKEY],
        request=CollectionPatchInput,
        responses={200: MODIFIED, **ERRORS},
    )
    def patch(self, request: Request, collection_id: str) -> Response:
        """Change a collection, as its owner; `styles` replace its styles."""
        caller = authenticate(api_key=request.headers.get("apikey"))
        data = _valid(CollectionPatchInput, request)
        collection = styles.modify_collection(caller=caller, collection_id=collection_id, **data)
        return Response(styles.changed_answer(collection))

    @extend_schema(
        operation_id="collection_delete",
        auth=APIKEY_AUTH,
        parameters=[COLLECTION_ID, APIKEY],
        responses={200: SIMPLE, **ERRORS},
    )
    def delete(self, request: Request, collection_id: str) -> Response:
        """Delete a collection, as its owner or a moderator: its styles stay."""
        caller = authenticate(api_key=request.headers.get("apikey"))
        styles.delete_collection(caller=caller, collection_id=collection_id)
        return Response({"message": "OK"})


class CollectionByNameView(APIView):
    @replica_reads
    @extend_schema(operation_id="collection_by_name", responses={200: CollectionOutput, **ERRORS})
    def get(self, request: Request, collection_name: str) -> Response:
        """A collection by name: `name`, `alias::name` or `collection::alias::name`."""
        return Response(styles.collection_details(styles.collection_by_name(collection_name)))
