"""The horde family's shapes that the base serves itself (its error envelope and the heartbeat),
and the strict input fields every app's horde routes validate with."""

import math
import uuid

from django.conf import settings
from django.core import validators
from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import fields, serializers
from rest_framework.validators import ProhibitSurrogateCharactersValidator


class HordeErrorOutput(serializers.Serializer):
    message = serializers.CharField()
    rc = serializers.CharField()


class HeartbeatOutput(serializers.Serializer):
    message = serializers.CharField()
    version = serializers.CharField()


class StrictCharField(serializers.CharField):
    """A string, and only a string: numbers and booleans are wrong types here."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictBooleanField(serializers.BooleanField):
    def to_internal_value(self, data):
        if not isinstance(data, bool):
            self.fail("invalid", input=data)
        return data


class StrictIntegerField(serializers.IntegerField):
    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictFloatField(serializers.FloatField):
    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictUUIDField(serializers.UUIDField):
    """A UUID written as a string: DRF would otherwise read 1 or true as UUID(int=1)."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid", value=data)
        return super().to_internal_value(data)


# OpenAPI security requirements of the horde routes: the `apikey` header, or optionally it.
APIKEY_AUTH = [{"apikey": []}]
OPTIONAL_APIKEY_AUTH = [{}, {"apikey": []}]
APIKEY = OpenApiParameter("apikey", str, OpenApiParameter.HEADER, required=True)


def keyed_route(operation_id: str, *, body=fields.empty, answer, refusals: dict):
    """The schema of a horde route that requires the apikey header: its body, its answer and
    its app's refusals."""
    return extend_schema(
        operation_id=operation_id,
        parameters=[APIKEY],
        auth=APIKEY_AUTH,
        request=body,
        responses={200: answer, **refusals},
    )


# The answer of the routes that list (models, workers), as the AI Horde's: an array of objects.
OBJECT_LIST = {"type": "array", "items": {"type": "object", "additionalProperties": True}}
# A count in a query string: what hordeops.parsing.ascii_int reads.
COUNT = {"type": "integer", "minimum": 0, "maximum": 10**18 - 1}


class NonBlankText(OpenApiSerializerFieldExtension):
    """A string field that trims its value and refuses a blank one: white space alone is refused
    too, so the schema asks for a character that is not white space."""

    target_class = "hordeops.serializers.StrictCharField"
    match_subclasses = True

    def map_serializer_field(self, auto_schema, direction):
        schema = auto_schema._map_serializer_field(self.target, direction, bypass_extensions=True)
        if self.target.trim_whitespace and not self.target.allow_blank and schema.get("type") == "string":
            schema["pattern"] = NOT_ONLY_WHITE_SPACE
        return schema


# A character that Python's `str.strip()` (DRF's trimming) keeps. The schema's regex dialect
# reads `\S` with another set of white space (U+0085 and U+001C-U+001F are not in it), so the
# set is written out.
NOT_ONLY_WHITE_SPACE = "[^" + "".join(f"\\u{c:04x}" for c in range(0x3001) if chr(c).isspace()) + "]"


# A string holding no NUL character, anywhere: an anchored pattern, as patterns otherwise match
# any part of the string. The whole-string form of NOT_ONLY_WHITE_SPACE says both.
NUL_FREE = "^[^\\u0000]*$"
_NUL_FREE_NOT_BLANK = "^[^\\u0000]*" + NOT_ONLY_WHITE_SPACE[:-1] + "\\u0000][^\\u0000]*$"


def bound_request_strings(result: dict, generator, request, public) -> dict:
    """drf-spectacular postprocessing hook: every string a request body holds is refused with
    a NUL in it (the body parser's NulByteInPayload) and past the body limit (413), so the
    schema says both of each, where DRF's fields know neither. Not the NUL of a string that is
    one choice of a union (a message's content: a string or a list of parts): schemathesis
    cannot make examples of such a union with a pattern in it, and its own setting
    (tests/schemathesis.toml, allow-x00) keeps NUL out of every string and key instead."""
    limit = settings.MAX_REQUEST_BODY_BYTES
    components = result.get("components", {}).get("schemas", {})
    pending = [
        media.get("schema")
        for operations in result.get("paths", {}).values()
        for operation in operations.values()
        if isinstance(operation, dict)
        for media in operation.get("requestBody", {}).get("content", {}).values()
    ]
    seen: set[str] = set()
    pending = [(schema, False) for schema in pending]  # (schema, within a union)
    while pending:
        node, in_union = pending.pop()
        if isinstance(node, list):
            pending.extend((item, in_union) for item in node)
            continue
        if not isinstance(node, dict):
            continue
        if ref := node.get("$ref"):
            name = ref.rsplit("/", 1)[-1]
            if name not in seen and name in components:
                seen.add(name)
                pending.append((components[name], False))
            continue
        if node.get("type") == "string" and "enum" not in node and "format" not in node:
            node["maxLength"] = min(node.get("maxLength", limit), limit)
            pattern = node.get("pattern")
            if pattern is None and not in_union:
                node["pattern"] = NUL_FREE
            elif pattern == NOT_ONLY_WHITE_SPACE:
                node["pattern"] = _NUL_FREE_NOT_BLANK
        for key, value in node.items():
            if isinstance(value, (dict, list)):
                pending.append((value, in_union or key in ("oneOf", "anyOf")))
    return result


class ListLengths(OpenApiSerializerFieldExtension):
    """A nested serializer's list (`many=True`) with its bounds: drf-spectacular leaves out
    `allow_empty`, `min_length` and `max_length`, and the schema then offers what is refused."""

    target_class = "rest_framework.serializers.ListSerializer"

    def map_serializer_field(self, auto_schema, direction):
        schema = auto_schema._map_serializer_field(self.target, direction, bypass_extensions=True)
        field = self.target
        least = max(field.min_length or 0, 0 if field.allow_empty else 1)
        if least:
            schema["minItems"] = least
        if field.max_length is not None:
            schema["maxItems"] = field.max_length
        return schema


# --- One pass over a hot route's body ------------------------------------------------------------
#
# A worker's pop, progress and submit bodies are checked on every poll, and DRF's field-by-field
# validation (a run_validation, a validators list and an error-collecting frame per field and per
# list item) was a tenth of an idle pop's CPU. `quick_validator` compiles a serializer's declared
# fields into one function that accepts only what DRF accepts, gives exactly what DRF gives, and
# answers `None` (DRF decides, with its own messages) for anything else: a wrong type, a bound
# crossed, a blank, a NUL or surrogate character, an unknown kind of field. So an error reads the
# same whichever path saw the body: only DRF ever writes one.


class _Fallback(Exception):
    """This value is for DRF to judge."""


_CHAR_VALIDATORS = (
    validators.MaxLengthValidator,
    validators.MinLengthValidator,
    validators.ProhibitNullCharactersValidator,
    ProhibitSurrogateCharactersValidator,
)
_RANGE_VALIDATORS = (validators.MinValueValidator, validators.MaxValueValidator)
_MAX_QUICK_INT = 10**18  # past this, DRF's str() round trip of the int is left to DRF


def _own_validators(field: fields.Field, allowed: tuple[type, ...]) -> None:
    if any(type(v) not in allowed for v in field.validators):
        raise _Fallback(field)


def _passing(test):
    """The check of a value DRF takes as it is: the value where `test` holds, else _Fallback."""

    def check(value):
        if not test(value):
            raise _Fallback
        return value

    return check


def _check_for(field: fields.Field):
    """The one-pass check of one field's present, non-null value: the value as DRF would
    validate it, or _Fallback. Raises _Fallback at build time for a field it does not know."""
    kind = type(field)
    if kind is StrictCharField:
        _own_validators(field, _CHAR_VALIDATORS)
        trim, blank, lo, hi = field.trim_whitespace, field.allow_blank, field.min_length, field.max_length

        def check_char(value):
            if type(value) is not str or "\x00" in value:
                raise _Fallback
            if not value.isascii():
                try:
                    value.encode()  # a lone surrogate cannot be encoded: DRF refuses it
                except UnicodeEncodeError:
                    raise _Fallback from None
            if trim:
                value = value.strip()
            if not value:
                if not blank:
                    raise _Fallback
                return ""
            if (lo is not None and len(value) < lo) or (hi is not None and len(value) > hi):
                raise _Fallback
            return value

        return check_char
    if kind is StrictIntegerField:
        _own_validators(field, _RANGE_VALIDATORS)
        lo = -_MAX_QUICK_INT if field.min_value is None else max(field.min_value, -_MAX_QUICK_INT)
        hi = _MAX_QUICK_INT if field.max_value is None else min(field.max_value, _MAX_QUICK_INT)

        return _passing(lambda value: type(value) is int and lo <= value <= hi)
    if kind is StrictFloatField:
        _own_validators(field, _RANGE_VALIDATORS)
        lo = -math.inf if field.min_value is None else field.min_value
        hi = math.inf if field.max_value is None else field.max_value

        def check_float(value):
            # A huge int (float() overflows) or a non-finite float is left to DRF.
            if type(value) is int and -_MAX_QUICK_INT <= value <= _MAX_QUICK_INT:
                value = float(value)
            elif type(value) is not float or not math.isfinite(value):
                raise _Fallback
            if not lo <= value <= hi:
                raise _Fallback
            return value

        return check_float
    if kind is StrictBooleanField:
        _own_validators(field, ())
        return _passing(lambda value: type(value) is bool)
    if kind is StrictUUIDField:
        _own_validators(field, ())

        def check_uuid(value):
            if type(value) is not str:
                raise _Fallback
            try:
                return uuid.UUID(hex=value)
            except ValueError:
                raise _Fallback from None

        return check_uuid
    if kind is serializers.ChoiceField:
        _own_validators(field, ())
        if field.allow_blank:
            raise _Fallback(field)
        choices = dict(field.choice_strings_to_values)

        def check_choice(value):
            if type(value) is not str or value not in choices:
                raise _Fallback
            return choices[value]

        return check_choice
    if kind is serializers.DictField and type(field.child) is fields._UnvalidatedField:
        _own_validators(field, ())
        empty_ok = field.allow_empty

        def check_dict(value):
            # JSON keys are strings already; the unvalidated child keeps each value as sent.
            if type(value) is not dict or (not value and not empty_ok):
                raise _Fallback
            return dict(value)

        return check_dict
    if kind is serializers.ListField:
        _own_validators(field, (validators.MaxLengthValidator, validators.MinLengthValidator))
        child = _field_check(field.child)
        empty_ok, lo, hi = field.allow_empty, field.min_length, field.max_length

        def check_list(value):
            if type(value) is not list:
                raise _Fallback
            if (not value and not empty_ok) or (lo is not None and len(value) < lo):
                raise _Fallback
            if hi is not None and len(value) > hi:
                raise _Fallback
            return [child(item) for item in value]

        return check_list
    raise _Fallback(field)


def _field_check(field: fields.Field):
    """`_check_for`, with DRF's handling of null around it."""
    check = _check_for(field)
    if not field.allow_null:
        return check

    def check_nullable(value):
        return None if value is None else check(value)

    return check_nullable


def quick_validator(serializer_class: type[serializers.Serializer]):
    """The one-pass check of `serializer_class`'s bodies (`data -> dict | None`), or None where
    the class has something it does not know: a field kind, a validator, a `validate_<name>`
    method, a `validate()` of its own, a field not named after its key."""
    if serializer_class.validate is not serializers.Serializer.validate:
        return None
    steps = []
    try:
        for name, field in serializer_class._declared_fields.items():
            if (
                field.read_only
                or field.source not in (None, name)
                or hasattr(serializer_class, f"validate_{name}")
            ):
                return None
            missing = fields.empty
            if not field.required:
                missing = field.default  # callable (list): called per body; empty: the key is left out
            steps.append((name, _field_check(field), field.allow_null, field.required, missing))
    except _Fallback:
        return None

    def validate(data):
        if type(data) is not dict:
            return None
        out = {}
        try:
            for name, check, nullable, required, missing in steps:
                value = data.get(name, fields.empty)
                if value is fields.empty:
                    if required:
                        return None
                    if missing is not fields.empty:
                        out[name] = missing() if callable(missing) else missing
                elif value is None:
                    if not nullable:
                        return None
                    out[name] = None
                else:
                    out[name] = check(value)
        except _Fallback:
            return None
        return out

    return validate
