"""The horde's account routes (the AI Horde's `/find_user`, `/users/{id}`): parse, read, shape
the answer with `kudos.details`; and its kudos transfer (`kudos.transfers`)."""

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from hordeops import clock, errors
from hordeops.parsing import ascii_int
from hordeops.serializers import APIKEY_AUTH, OPTIONAL_APIKEY_AUTH, HordeErrorOutput
from kudos import serializers as s
from kudos import transfers
from kudos.details import user_details
from workers import services, shared_keys
from workers.models import Account
from workers.views import APIKEY, APIKEY_OPTIONAL, ERRORS, caller, may_see


class FindUserView(APIView):
    @extend_schema(
        operation_id="find_user", parameters=[APIKEY], responses={200: dict, **ERRORS}, auth=APIKEY_AUTH
    )
    def get(self, request: Request) -> Response:
        """The key's account; through a shared key, its owner as anyone sees it, named
        `owner#id (Shared Key: name)` as the AI Horde names it."""
        account, shared_key = shared_keys.key_holder(api_key=request.headers.get("apikey"))
        services.refuse_suspended(account)
        if shared_key is not None:
            details = user_details(account, now=clock.now(), privileged=False)
            return Response({**details, "username": shared_keys.username(shared_key)})
        return Response(user_details(account, now=clock.now(), privileged=True, moderator=account.moderator))


class UserView(APIView):
    @extend_schema(
        operation_id="user",
        parameters=[APIKEY_OPTIONAL],
        responses={200: dict, **ERRORS},
        auth=OPTIONAL_APIKEY_AUTH,
    )
    def get(self, request: Request, user_id: str) -> Response:
        # ASCII digits only, and within a bigint: anything else is no user, not a database error.
        number = ascii_int(user_id)
        account = Account.objects.filter(pk=number).first() if number is not None else None
        if account is None:
            raise errors.UserNotFound()
        viewer = caller(request)
        answer = user_details(
            account,
            now=clock.now(),
            privileged=may_see(viewer, account.pk),
            moderator=viewer is not None and viewer.moderator,
        )
        return Response(answer)


# 408 and 413: the body's bounds; 503: the database's.
TRANSFER_ERRORS = {code: HordeErrorOutput for code in (400, 401, 403, 404, 408, 409, 413, 429, 503)}


class KudosTransferView(APIView):
    @extend_schema(
        operation_id="transfer_kudos",
        auth=APIKEY_AUTH,
        parameters=[
            OpenApiParameter(
                "Idempotency-Key",
                str,
                OpenApiParameter.HEADER,
                required=False,
                pattern=transfers.IDEMPOTENCY_KEY_PATTERN,
            )
        ],
        request=s.KudosTransferInput,
        responses={200: s.KudosTransferOutput, **TRANSFER_ERRORS},
    )
    def post(self, request: Request) -> Response:
        """Send kudos to another account, from what this one can spend (the AI Horde's route)."""
        account = services.authenticate(api_key=request.headers.get("apikey"))
        serializer = s.KudosTransferInput(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        key = transfers.idempotency_key(header=request.headers.get("Idempotency-Key"))
        transfers.take_rate(account_id=account.pk)
        moved = transfers.transfer_kudos(
            source=account, username=data["username"], amount=data["amount"], idempotency_key=key
        )
        return Response({"transferred": moved})
