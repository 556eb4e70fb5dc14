"""The horde's account routes (the AI Horde's `/find_user`, `/users/{id}`): parse, read, shape
the answer with `kudos.details`; and its kudos transfer (`kudos.transfers`)."""

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from hordeops import clock, errors
from hordeops.parsing import MAX_DIGITS, ascii_int
from hordeops.replica import replica_reads
from hordeops.serializers import APIKEY_AUTH, OBJECT_LIST, OPTIONAL_APIKEY_AUTH, HordeErrorOutput
from kudos import details, transfers
from kudos import serializers as s
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


class UsersView(APIView):
    @replica_reads
    @extend_schema(
        operation_id="users",
        parameters=[
            OpenApiParameter(
                "page",
                {"type": "integer", "minimum": 1, "maximum": 10**18 - 1},
                description=f"{details.USERS_PER_PAGE} users a page; none past {details.LAST_USERS_PAGE}.",
                default=1,
            ),
            OpenApiParameter("sort", str, enum=list(details.USER_SORTS), default="kudos"),
        ],
        responses={200: OBJECT_LIST, 400: HordeErrorOutput, 429: HordeErrorOutput},
    )
    def get(self, request: Request) -> Response:
        """Every account, a page at a time, as anyone sees it: by kudos, most first, or by age."""
        page = _page(request.query_params.get("page") or "1")
        sort = request.query_params.get("sort") or "kudos"
        return Response(details.users_page(sort=sort, page=page, now=clock.now()))


def _page(raw: str) -> int:
    """The page asked for, read as the AI Horde reads it: below 1 is the first, and any whole
    number past the last page is one (an empty list); anything else is refused."""
    digits = raw.removeprefix("-")
    if not (digits.isascii() and digits.isdigit()):
        raise ValidationError({"page": "Which page of results to return: a whole number."})
    if raw.startswith("-"):
        return 1
    return int(digits) if len(digits) <= MAX_DIGITS else details.LAST_USERS_PAGE + 1


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
