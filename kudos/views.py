"""The horde's account routes (the AI Horde's `/find_user`, `/users/{id}`): parse, read, shape
the answer with `kudos.details`."""

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from hordeops import clock, errors
from hordeops.parsing import ascii_int
from hordeops.serializers import APIKEY_AUTH, OPTIONAL_APIKEY_AUTH
from kudos.details import user_details
from workers import services
from workers.models import Account
from workers.views import APIKEY, APIKEY_OPTIONAL, ERRORS, caller, may_see


class FindUserView(APIView):
    @extend_schema(
        operation_id="find_user", parameters=[APIKEY], responses={200: dict, **ERRORS}, auth=APIKEY_AUTH
    )
    def get(self, request: Request) -> Response:
        account = services.authenticate(api_key=request.headers.get("apikey"))
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
