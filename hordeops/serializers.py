"""The horde family's shapes that the base serves itself: its error envelope and the heartbeat."""

from rest_framework import serializers


class HordeErrorOutput(serializers.Serializer):
    message = serializers.CharField()
    rc = serializers.CharField()


class HeartbeatOutput(serializers.Serializer):
    message = serializers.CharField()
    version = serializers.CharField()
