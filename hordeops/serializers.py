"""The horde family's shapes that the base serves itself (its error envelope and the heartbeat),
and the strict input fields every app's horde routes validate with."""

from rest_framework import serializers


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
