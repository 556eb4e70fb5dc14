"""Input validation and output shapes of the horde text routes (AI Horde v2 names)."""

import threading
from typing import Any

from django.utils.functional import cached_property
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from hordeops.serializers import (  # noqa: F401  (the horde routes' error shape and strict fields)
    HordeErrorOutput,
    StrictBooleanField,
    StrictCharField,
    StrictFloatField,
    StrictIntegerField,
    StrictUUIDField,
    quick_validator,
)
from jobs import leases
from jobs.waits import MAX_WAIT_SECONDS
from workers.declaration import WorkerDeclaration

_quick: dict[type, object] = {}  # HotInput class -> its one-pass check


class HotInput(serializers.Serializer):
    """The body of a hot route (a worker's pop, progress or submit, a requester's async, and
    what they nest): fields built once per class and thread.

    DRF deep-copies a serializer's declared fields for every instance, and on these routes
    that copy cost more than the validation itself. These fields keep no state while they
    validate: no context, no partial updates, no default or validator that needs its
    serializer. So one bound set, built on an empty instance, serves every instance of the
    class on a thread.
    """

    _built = threading.local()

    def __init__(self, *args, **kwargs) -> None:
        if kwargs.get("context") or kwargs.get("partial"):
            raise TypeError("A HotInput's fields are shared: they see no context and no partial update.")
        super().__init__(*args, **kwargs)

    @classmethod
    def quick(cls, data: object) -> dict | None:
        """The body validated in one pass, or None where DRF's full validation must judge it
        (`hordeops.serializers.quick_validator`: the same result, and only DRF writes errors)."""
        validate = _quick.get(cls)
        if validate is None:
            validate = _quick.setdefault(cls, quick_validator(cls) or (lambda data: None))
        return validate(data)

    @classmethod
    def validated(cls, data: object) -> Any:
        """The body validated, in one pass where it is plainly valid (`quick`), by DRF otherwise
        (its ValidationError), then made into what the route's service takes (`built`): the
        same value whichever path checked it."""
        valid = cls.quick(data)
        if valid is None:
            serializer = cls(data=data)
            serializer.is_valid(raise_exception=True)
            valid = serializer.validated_data
        return cls.built(valid)

    @staticmethod
    def built(valid: dict) -> Any:
        """What the route's service takes from the validated body: the dict itself, unless the
        class says otherwise."""
        return valid

    @cached_property
    def fields(self):
        built = self._built.__dict__
        cls = type(self)
        if cls not in built:
            built[cls] = serializers.Serializer.fields.func(cls())
        return built[cls]


def _int(lo: int, hi: int, **kwargs) -> StrictIntegerField:
    return StrictIntegerField(min_value=lo, max_value=hi, **kwargs)


def _float(lo: float, hi: float) -> StrictFloatField:
    return StrictFloatField(min_value=lo, max_value=hi, required=False)


def _flag() -> StrictBooleanField:
    return StrictBooleanField(required=False)


@extend_schema_field(
    {
        "type": "array",
        "items": {"type": "integer", "minimum": 0, "maximum": 6},
        "minItems": 7,
        "maxItems": 7,
        "uniqueItems": True,
    }
)
class SamplerOrderField(serializers.ListField):
    """The order of the 7 KoboldAI samplers: each once (`validate_sampler_order`)."""


# OpenAI's bounds on a logit bias, and on how many tokens one request may bias.
LOGIT_BIAS_LIMIT = 100
LOGIT_BIAS_MAX_TOKENS = 300


LOGIT_BIAS_SCHEMA = {
    "type": "object",
    "additionalProperties": {"type": "number", "minimum": -LOGIT_BIAS_LIMIT, "maximum": LOGIT_BIAS_LIMIT},
    "maxProperties": LOGIT_BIAS_MAX_TOKENS,
    "description": "token ids (decimal strings) to a bias from -100 to 100",
}


@extend_schema_field(LOGIT_BIAS_SCHEMA)
class LogitBiasField(serializers.DictField):
    """OpenAI's `logit_bias` (`check_logit_bias` checks its keys and size)."""


@extend_schema_field({**LOGIT_BIAS_SCHEMA, "nullable": True})
class NullableLogitBiasField(LogitBiasField):
    """`logit_bias` where null is as if not sent (the /v1 routes')."""


def logit_bias_field(*, allow_null: bool = False) -> serializers.DictField:
    """OpenAI's `logit_bias`: token ids (as the JSON object's keys) to a bias from -100 to 100."""
    bias = StrictFloatField(min_value=-LOGIT_BIAS_LIMIT, max_value=LOGIT_BIAS_LIMIT)
    kind = NullableLogitBiasField if allow_null else LogitBiasField
    return kind(child=bias, required=False, allow_null=allow_null)


def check_logit_bias(value: dict[str, float] | None) -> dict[str, float]:
    """Keys that are token ids (whole numbers from 0), at most LOGIT_BIAS_MAX_TOKENS of them;
    the ids kept as the decimal strings JSON carries, as every server that takes a bias reads them."""
    if not value:
        return {}
    if len(value) > LOGIT_BIAS_MAX_TOKENS:
        raise serializers.ValidationError(f"logit_bias may bias at most {LOGIT_BIAS_MAX_TOKENS} tokens.")
    bias = {}
    for key, number in value.items():
        if not (key.isascii() and key.isdigit() and len(key) <= 9):
            raise serializers.ValidationError(f"logit_bias keys must be token ids, not {key[:32]!r}.")
        bias[str(int(key))] = number
    return bias


class TextParamsInput(HotInput):
    """`params`: the AI Horde's KoboldAI sampling knobs with its ranges."""

    n = _int(1, 20, default=1)
    max_length = _int(16, 16384, default=80)
    max_context_length = _int(80, 1048576, default=2048)
    rep_pen = _float(1, 3)
    rep_pen_range = _int(0, 4096, required=False)
    rep_pen_slope = _float(0, 10)
    temperature = _float(0, 5)
    tfs = _float(0, 1)
    top_a = _float(0, 1)
    top_k = _int(0, 200, required=False)
    top_p = _float(0.001, 1)
    typical = _float(0, 1)
    min_p = _float(0, 1)
    # OpenAI's penalties and token biases: hordeops' own params (the AI Horde has none), passed to
    # a bridge (a legacy worker's pop leaves them out: horde_sdk's strict mode refuses them).
    frequency_penalty = _float(-2, 2)
    presence_penalty = _float(-2, 2)
    logit_bias = logit_bias_field()
    smoothing_factor = _float(0, 10)
    dynatemp_range = _float(0, 5)
    dynatemp_exponent = _float(0, 5)
    # KoboldAI's own name for a sampling seed (the AI Horde has none): passed to the worker.
    sampler_seed = _int(0, 2**31 - 1, required=False)
    sampler_order = SamplerOrderField(child=_int(0, 6), min_length=7, max_length=7, required=False)
    stop_sequence = serializers.ListField(
        # As sent: "\nYou:" must stop the model at the start of the user's turn, not at any "You:".
        child=StrictCharField(allow_blank=False, trim_whitespace=False, max_length=2000),
        max_length=128,
        required=False,
    )
    use_default_badwordsids = _flag()
    frmtadsnsp = _flag()
    frmtrmblln = _flag()
    frmtrmspch = _flag()
    frmttriminc = _flag()
    singleline = _flag()

    def validate_sampler_order(self, value: list[int]) -> list[int]:
        if len(set(value)) < 7:
            raise serializers.ValidationError("sampler_order must list all 7 samplers.")
        return value

    def validate_logit_bias(self, value: dict[str, float]) -> dict[str, float]:
        return check_logit_bias(value)

    def validate_stop_sequence(self, value: list[str]) -> list[str]:
        if sum(len(item) for item in value) > 2000:
            raise serializers.ValidationError("stop_sequence may hold 2000 characters in all.")
        return value


@extend_schema_field({"type": "string", "minLength": 1, "maxLength": 1_000_000})
class PromptField(StrictCharField):
    """The prompt, as sent. An empty one is read here and refused by the view as the AI Horde's
    `MissingPrompt`, not as a validation error; the schema says what is accepted."""


class TextAsyncInput(HotInput):
    prompt = PromptField(allow_blank=True, trim_whitespace=False, max_length=1_000_000)
    params = TextParamsInput(required=False)
    models = serializers.ListField(child=StrictCharField(max_length=255), max_length=200, default=list)
    workers = serializers.ListField(child=StrictUUIDField(), max_length=5, default=list)
    worker_blacklist = StrictBooleanField(default=False)
    trusted_workers = StrictBooleanField(default=False)
    slow_workers = StrictBooleanField(default=True)
    allow_downgrade = StrictBooleanField(default=False)
    dry_run = StrictBooleanField(default=False)
    webhook = StrictCharField(
        max_length=1024,
        required=False,
        allow_blank=True,
        allow_null=True,
        help_text="An https URL the horde POSTs each generation to once it is done (`jobs.webhooks`).",
    )
    validated_backends = StrictBooleanField(
        default=False, help_text="Only workers of a bridge the horde validates serve it."
    )
    disable_batching = StrictBooleanField(
        default=False, help_text="A pop takes one job of it at a time (trusted accounts only, for n above 1)."
    )
    proxied_account = StrictCharField(
        max_length=255,
        allow_blank=True,
        trim_whitespace=False,
        default="",
        help_text="A service account's own user this request is sent for.",
    )
    # A style's or a collection's id or name (`jobs.styles`): the request runs under it.
    style = StrictCharField(required=False, allow_null=True, max_length=512, trim_whitespace=False)


class TextAsyncOutput(serializers.Serializer):
    id = serializers.UUIDField(required=False)
    kudos = serializers.IntegerField()
    message = serializers.CharField(required=False)


class GenerationOutput(serializers.Serializer):
    text = serializers.CharField()
    seed = serializers.IntegerField()
    gen_metadata = serializers.ListField(child=serializers.DictField())
    worker_id = serializers.UUIDField()
    worker_name = serializers.CharField()
    model = serializers.CharField()
    state = serializers.CharField()


class RequestStatusOutput(serializers.Serializer):
    finished = serializers.IntegerField()
    processing = serializers.IntegerField()
    restarted = serializers.IntegerField()
    waiting = serializers.IntegerField()
    done = serializers.BooleanField()
    faulted = serializers.BooleanField()
    is_possible = serializers.BooleanField()
    wait_time = serializers.IntegerField()
    queue_position = serializers.IntegerField()
    kudos = serializers.FloatField()
    generations = GenerationOutput(many=True)
    eligible_workers = serializers.IntegerField()
    eligible_worker_threads = serializers.IntegerField()
    might_stall = serializers.BooleanField()


class PopInput(HotInput):
    name = StrictCharField(min_length=1, max_length=100, trim_whitespace=True)
    models = serializers.ListField(
        child=StrictCharField(min_length=1, max_length=255), min_length=1, max_length=200
    )
    max_length = _int(1, 1_048_576, default=512)
    max_context_length = _int(1, 1_048_576, default=2048)
    threads = _int(1, 50, default=1)
    nsfw = StrictBooleanField(default=False)
    bridge_agent = StrictCharField(max_length=1000, default="unknown:0:unknown")
    amount = _int(1, 20, default=1)
    chat = StrictBooleanField(default=False)
    tools = StrictBooleanField(
        default=False, help_text="The worker's model server takes OpenAI `tools` and answers tool calls."
    )
    structured_outputs = StrictBooleanField(
        default=False,
        help_text="The worker's model server holds a reply to a `response_format` (JSON, a schema).",
    )
    wait_seconds = StrictFloatField(
        min_value=0,
        max_value=MAX_WAIT_SECONDS,
        default=0,
        help_text="Seconds the pop may wait for a job it can take before it answers empty; 0: none.",
    )

    @staticmethod
    def built(valid: dict) -> WorkerDeclaration:
        return WorkerDeclaration(**valid)


class LeaseOutput(serializers.Serializer):
    expires_at = serializers.DateTimeField()
    cap_seconds = serializers.IntegerField()
    preparation_seconds = serializers.IntegerField()


class PopOutput(serializers.Serializer):
    payload = serializers.DictField()
    id = serializers.UUIDField(allow_null=True)
    ids = serializers.ListField(child=serializers.UUIDField())
    model = serializers.CharField(allow_null=True)
    ttl = serializers.IntegerField(allow_null=True)
    skipped = serializers.DictField()
    messages = serializers.ListField(child=serializers.DictField())
    softprompt = serializers.CharField(allow_null=True)
    extra_source_images = serializers.ListField(allow_null=True)
    # Only to a worker that pops with `chat: true`, and only with a job.
    kind = serializers.CharField(required=False)
    streamed = serializers.BooleanField(required=False)
    lease = LeaseOutput(required=False)
    deadline_ms = serializers.IntegerField(required=False)


class SubmitInput(HotInput):
    id = StrictUUIDField()
    generation = StrictCharField(allow_blank=True, trim_whitespace=False, default="")
    state = serializers.ChoiceField(choices=["ok", "censored", "faulted", "csam"], default="ok")
    seed = _int(-(2**63), 2**63 - 1, default=0)
    gen_metadata = serializers.ListField(child=serializers.DictField(), max_length=50, default=list)
    # hordeops's own: the reply's tool calls, OpenAI's `{"id", "type", "function": {"name",
    # "arguments"}}`, for a job that offered tools (docs/reference/worker_protocol.md).
    tool_calls = serializers.ListField(child=serializers.DictField(), max_length=128, required=False)

    @staticmethod
    def built(valid: dict) -> dict[str, Any]:
        """`submit_generation`'s arguments, in its names (the AI Horde's `id`, `generation`)."""
        return {
            "generation_id": valid["id"],
            "text": valid["generation"],
            "state": valid["state"],
            "seed": valid["seed"],
            "gen_metadata": valid["gen_metadata"],
            "tool_calls": valid.get("tool_calls"),
        }


class ProgressInput(HotInput):
    id = StrictUUIDField()
    seq = _int(1, 10_000_000)
    delta = StrictCharField(allow_blank=True, trim_whitespace=False, max_length=1_000_000)
    tokens = _int(0, 10_000_000, required=False, allow_null=True)
    # hordeops's own: pieces of the reply's tool calls, OpenAI's stream form `{"index", "id",
    # "function": {"name", "arguments"}}` (docs/reference/worker_protocol.md).
    tool_calls = serializers.ListField(child=serializers.DictField(), max_length=128, required=False)

    @staticmethod
    def built(valid: dict) -> dict[str, Any]:
        """`record_progress`'s arguments, in its names."""
        return {
            "generation_id": valid["id"],
            "seq": valid["seq"],
            "delta": valid["delta"],
            "tokens": valid.get("tokens"),
            "tool_calls": valid.get("tool_calls"),
        }


class ProgressOutput(serializers.Serializer):
    lease = serializers.ChoiceField(choices=[outcome.value for outcome in leases.ANSWERED])
    expires_at = serializers.DateTimeField()
    ttl = serializers.IntegerField()


class SubmitOutput(serializers.Serializer):
    reward = serializers.FloatField()
