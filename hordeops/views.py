from django.core.cache import cache
from django.db import connection
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from hordeops import errors
from hordeops.api import horde_error
from hordeops.serializers import HeartbeatOutput, HordeErrorOutput

VERSION = "2.5.0"


def _reachable() -> list[str]:
    """Return what the web app cannot reach: PostgreSQL, Redis, or neither."""
    down = []
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception:
        down.append("PostgreSQL")
    try:
        cache.client.get_client(write=True).ping()
    except Exception:
        down.append("Redis")
    return down


class HeartbeatView(APIView):
    @extend_schema(operation_id="heartbeat", responses={200: HeartbeatOutput, 503: HordeErrorOutput})
    def get(self, request: Request) -> Response:
        down = _reachable()
        if down:
            return horde_error(f"Cannot reach {' and '.join(down)}.", errors.ServiceUnavailable.code, 503)
        return Response({"message": "OK", "version": VERSION})
