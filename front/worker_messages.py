"""Messages to workers on the AI Horde's routes: `GET/POST /api/v2/workers/messages`,
`GET/DELETE /api/v2/workers/messages/{id}` (`base.WorkerMessages`, `base.SingleWorkerMessage`).

The rules are the workers app's (`workers.messages`); this floor serves them because a
moderator's write or delete through the API is logged in the admin's history, as the same act in
the admin is (`LogEntry`), which only `front` may know."""

import logging
from uuid import UUID

from django.contrib.admin.models import ADDITION, DELETION
from django.db import transaction
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from front.api_log import log_api_act
from hordeops import clock, errors
from hordeops.parsing import ascii_int
from hordeops.serializers import (
    APIKEY,
    APIKEY_AUTH,
    HordeErrorOutput,
    StrictCharField,
    StrictIntegerField,
    StrictUUIDField,
)
from workers import messages, services
from workers.models import MESSAGE_MAX_LENGTH, Account, WorkerMessage
from workers.views import SIMPLE

logger = logging.getLogger(__name__)


def write_message(
    *, author: Account, worker_id: UUID, message: str, origin: str | None, hours: int
) -> WorkerMessage:
    """Send the message (`workers.messages.send`); a moderator's is logged as the admin's are."""
    with transaction.atomic():
        row = messages.send(
            author=author, worker_id=worker_id, message=message, origin=origin, hours=hours, now=clock.now()
        )
        if author.moderator:
            log_api_act(author, row, "Sent", flag=ADDITION)
    logger.info("message %s to worker %s by account %s", row.pk, row.worker_id, author.pk)
    return row


def remove_message(*, caller: Account, message_id: str) -> None:
    """Delete the message, if `caller` may; a moderator's delete is logged as the admin's are."""
    with transaction.atomic():
        row = messages.deletable(caller=caller, message_id=message_id)
        if caller.moderator:
            log_api_act(caller, row, "Deleted", flag=DELETION)
        pk = row.pk
        row.delete()
    logger.info("message %s deleted by account %s", pk, caller.pk)


@extend_schema_serializer(component_name="ResponseModelMessage")
class MessageOutput(serializers.Serializer):
    id = serializers.CharField(help_text="The ID of this message")
    worker_id = serializers.CharField(help_text="The ID of the worker this message is intended for.")
    user_id = serializers.CharField(
        required=False, help_text="The ID of the user who wrote it through the API (none: the admin)."
    )
    message = serializers.CharField(help_text="The message sent")
    origin = serializers.CharField(help_text="The origin of this message.")
    expiry = serializers.CharField(help_text="The date at which this message will expire (RFC 822).")
    created = serializers.CharField(help_text="The date at which this message was created (RFC 822).")


class MessageInput(serializers.Serializer):
    """The AI Horde's `input_model_message`; `worker_id` is required here (no message to all)."""

    worker_id = StrictUUIDField(help_text="The ID of the worker this message is intended for.")
    message = StrictCharField(min_length=1, max_length=MESSAGE_MAX_LENGTH, trim_whitespace=False)
    origin = StrictCharField(
        required=False,
        allow_null=True,
        min_length=1,
        max_length=255,
        trim_whitespace=False,
        help_text="Moderators only; anyone else's messages have their user id as origin.",
    )
    expiry = StrictIntegerField(
        required=False,
        allow_null=True,
        min_value=1,
        max_value=messages.MAX_HOURS,
        help_text="The number of hours after which this message expires (12).",
    )


MAX_PAGE = 10**9
ERRORS = {code: HordeErrorOutput for code in (400, 401, 403, 404, 429)}
MESSAGE_ID = OpenApiParameter("message_id", OpenApiTypes.STR, OpenApiParameter.PATH)


def _caller(request: Request) -> Account:
    return services.authenticate(api_key=request.headers.get("apikey"))


class WorkerMessagesView(APIView):
    @extend_schema(
        operation_id="worker_messages",
        auth=APIKEY_AUTH,
        parameters=[
            APIKEY,
            OpenApiParameter(
                "user_id",
                {"type": "string", "pattern": "^[0-9]{0,18}$"},
                description="A user's numerical id: a moderator's filter (that user's workers); "
                "anyone else may name only themselves.",
            ),
            OpenApiParameter("worker_id", OpenApiTypes.UUID),
            OpenApiParameter("validity", str, enum=list(messages.VALIDITIES), default="active"),
            OpenApiParameter("page", {"type": "integer", "minimum": 1, "maximum": MAX_PAGE}, default=1),
        ],
        responses={200: MessageOutput(many=True), **ERRORS},
    )
    def get(self, request: Request) -> Response:
        """The messages to the caller's workers (a moderator's: to any), 50 a page, oldest first."""
        viewer = _caller(request)
        params = request.query_params
        worker_id = params.get("worker_id")
        if worker_id is not None:
            try:
                worker_id = UUID(worker_id)
            except ValueError:
                raise errors.BadRequest("worker_id must be a worker's id (a UUID).") from None
        raw_page = params.get("page")
        page = 1 if raw_page is None else ascii_int(raw_page, max_digits=10)
        if not page or page > MAX_PAGE:
            raise errors.BadRequest(f"page must be a whole number from 1 to {MAX_PAGE}.")
        return Response(
            messages.listed(
                viewer=viewer,
                user_id=params.get("user_id") or None,  # empty: not given
                worker_id=worker_id,
                validity=params.get("validity") or "active",
                page=page,
                now=clock.now(),
            )
        )

    @extend_schema(
        operation_id="worker_message_create",
        auth=APIKEY_AUTH,
        parameters=[APIKEY],
        request=MessageInput,
        responses={200: MessageOutput, **ERRORS},
    )
    def post(self, request: Request) -> Response:
        """Send a message to a worker: a moderator's to any, an owner's to their own."""
        author = _caller(request)
        serializer = MessageInput(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        row = write_message(
            author=author,
            worker_id=data["worker_id"],
            message=data["message"],
            origin=data.get("origin"),
            hours=data.get("expiry") or messages.DEFAULT_HOURS,
        )
        return Response(messages.details(row))


class WorkerMessageView(APIView):
    @extend_schema(
        operation_id="worker_message",
        parameters=[MESSAGE_ID],
        responses={200: MessageOutput, 404: HordeErrorOutput, 429: HordeErrorOutput},
    )
    def get(self, request: Request, message_id: str) -> Response:
        """A message by its id: whoever holds the id may read it, as on the AI Horde."""
        return Response(messages.details(messages.find(message_id)))

    @extend_schema(
        operation_id="worker_message_delete",
        auth=APIKEY_AUTH,
        parameters=[MESSAGE_ID, APIKEY],
        responses={200: SIMPLE, **ERRORS},
    )
    def delete(self, request: Request, message_id: str) -> Response:
        """Delete a message: its author's key, or a moderator's. Its worker's pops stop carrying it."""
        remove_message(caller=_caller(request), message_id=message_id)
        return Response({"message": "OK"})
