"""Input validation and output shapes of the kudos routes (AI Horde v2 names)."""

from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from rest_framework import serializers

from hordeops.serializers import StrictCharField, StrictFloatField


class WholeKudosField(StrictFloatField):
    """A whole number of kudos, written as an integer or, as horde_sdk sends it, a float (5.0);
    a fraction is refused rather than cut down (the AI Horde moved 1 of 1.5)."""

    default_error_messages = {"fraction": "A whole number of kudos is required."}

    def to_internal_value(self, data) -> int:
        value = super().to_internal_value(data)
        if not value.is_integer():
            self.fail("fraction")
        return int(value)


class WholeKudosSchema(OpenApiSerializerFieldExtension):
    """The schema of a WholeKudosField: a number with no fraction, as the route takes it."""

    target_class = WholeKudosField

    def map_serializer_field(self, auto_schema, direction):
        schema = auto_schema._map_serializer_field(self.target, direction, bypass_extensions=True)
        return {**schema, "multipleOf": 1}


class KudosTransferInput(serializers.Serializer):
    username = StrictCharField(max_length=255)
    amount = WholeKudosField(default=100, min_value=-(2**31), max_value=2**31 - 1)


class KudosTransferOutput(serializers.Serializer):
    transferred = serializers.IntegerField()
