"""Users and the horde's modes changed through the horde API, as the AI Horde's moderators change
them (`horde/apis/v2/base.py` `UserSingle.put`, `AwardKudos`, `HordeModes.put`): parse, call one
step of `front.moderation`, shape the answer. This floor serves them because a moderator's act
through them is logged in the admin's history as the same act in the admin is."""

import unicodedata

from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from front import moderation
from front.signup import UNPRINTABLE
from hordeops.api import validated_body
from hordeops.serializers import (
    APIKEY,
    APIKEY_AUTH,
    HordeErrorOutput,
    StrictBooleanField,
    StrictCharField,
    StrictIntegerField,
)
from kudos import views as kudos_views
from kudos.awards import MAX_AWARD
from kudos.serializers import WholeKudosField
from workers import modes, services
from workers.models import Account

ERRORS = {code: HordeErrorOutput for code in (400, 401, 403, 404, 408, 413, 429)}
LIMITED = {429: HordeErrorOutput}

# The AI Horde's user fields hordeops has nothing for: a value for one is refused (400), saying why.
NOT_SERVED = {
    "vpn": "hordeops does not look for VPNs: it has no VPN role to give.",
    "service": "a moderator makes a service account in the admin, which drops its passkey with it.",
    "education": "hordeops has no education accounts.",
    "special": "hordeops has no special payloads, so no special role.",
    "filtered": "hordeops has no prompt filters.",
    "monthly_kudos": "hordeops pays no monthly kudos.",
    "usage_multiplier": "hordeops has no usage multiplier: every account pays the same rates.",
}
MAX_AWARD_WHOLE = int(MAX_AWARD)


def _optional_bool(help_text: str) -> StrictBooleanField:
    return StrictBooleanField(required=False, allow_null=True, help_text=help_text)


def _note(help_text: str) -> StrictCharField:
    # Kept as sent: a trimmed note could be shorter than the schema allows.
    return StrictCharField(
        required=False,
        allow_null=True,
        min_length=5,
        max_length=500,
        trim_whitespace=False,
        help_text=help_text,
    )


class ModifyUserInput(serializers.Serializer):
    """The AI Horde's `ModifyUserInput`, as far as hordeops has its fields (`NOT_SERVED`)."""

    kudos = WholeKudosField(
        required=False,
        allow_null=True,
        min_value=1,
        max_value=MAX_AWARD_WHOLE,
        help_text="Moderators: kudos to award (minted), a positive whole number; none are taken away.",
        error_messages={"min_value": "Kudos are awarded, a positive whole number: none are taken away."},
    )
    concurrency = StrictIntegerField(
        required=False,
        allow_null=True,
        min_value=0,
        max_value=500,
        help_text="Moderators: how many waiting or running requests the account may have.",
    )
    worker_invited = StrictIntegerField(
        required=False,
        allow_null=True,
        min_value=0,
        max_value=2**31 - 1,
        help_text="Moderators: how many workers the account may run, invite-only mode too; 0: the default.",
    )
    trusted = _optional_bool("Moderators: trust or untrust the account.")
    flagged = _optional_bool("Moderators: flag the account (false lifts it and forgets its suspicions).")
    reset_suspicion = _optional_bool("Moderators: true forgets the account's suspicions and lifts its flag.")
    admin_comment = _note("Moderators: a note on the account, seen by moderators only.")
    moderator = _optional_bool("The operator's alone, in the admin: refused here (403 NotAdmin).")
    public_workers = _optional_bool("The account or a moderator: show its worker ids to anyone.")
    username = StrictCharField(
        required=False,
        allow_null=True,
        min_length=3,
        max_length=100,
        trim_whitespace=False,
        help_text="The account or a moderator: its new name, at most 30 characters (400 TooLongUserName).",
    )
    contact = _note("The account or a moderator: how moderators may reach the person.")
    customizer = _optional_bool("A moderator: the customizer role, which makes text styles without trust.")
    generate_proxy_passkey = _optional_bool(
        "A service account's new proxy passkey, answered once as `proxy_passkey` (others: 403)."
    )
    undelete = _optional_bool("hordeops deletes no account (400 UserNotDeleted).")

    def validate_username(self, name: str | None) -> str | None:
        if name is not None and any(unicodedata.category(char) in UNPRINTABLE for char in name):
            raise serializers.ValidationError("A name may not hold control characters.")
        return name

    def validate(self, data: dict) -> dict:
        given = self.initial_data
        refused = {name: why for name, why in NOT_SERVED.items() if given.get(name) is not None}
        if refused:
            raise serializers.ValidationError(refused)
        return data


@extend_schema_serializer(component_name="ModifyUser")
class ModifyUserOutput(serializers.Serializer):
    """The AI Horde's `ModifyUser`: what was set."""

    new_kudos = serializers.FloatField(required=False, help_text="The account's kudos after the award.")
    concurrency = serializers.IntegerField(required=False)
    worker_invited = serializers.IntegerField(required=False)
    trusted = serializers.BooleanField(required=False)
    flagged = serializers.BooleanField(required=False)
    new_suspicion = serializers.IntegerField(required=False)
    admin_comment = serializers.CharField(required=False)
    customizer = serializers.BooleanField(required=False)
    public_workers = serializers.BooleanField(required=False)
    username = serializers.CharField(required=False)
    contact = serializers.CharField(required=False)
    proxy_passkey = serializers.CharField(required=False, help_text="A service account's new proxy passkey.")


# The AI Horde's user ids are numbers; anything else is no account (404 UserNotFound).
USER_ID = OpenApiParameter("user_id", {"type": "string", "pattern": "^[0-9]{1,18}$"}, OpenApiParameter.PATH)


def _caller(request: Request) -> Account:
    return services.authenticate(api_key=request.headers.get("apikey"))


class UserView(kudos_views.UserView):
    """`GET` (`kudos.views.UserView`) and `PUT /api/v2/users/{id}`."""

    @extend_schema(
        operation_id="user_modify",
        auth=APIKEY_AUTH,
        parameters=[USER_ID, APIKEY],
        request=ModifyUserInput,
        responses={200: ModifyUserOutput, **ERRORS},
    )
    def put(self, request: Request, user_id: str) -> Response:
        """Change an account: moderators its trust, flag, suspicions, bounds, kudos (awarded) and
        note; the account itself, or a moderator, its name, contact and whether its workers are
        public. Each moderator's change is logged in the admin's history."""
        caller = _caller(request)
        changes = validated_body(ModifyUserInput, request)
        return Response(moderation.modify_user(caller=caller, user_id=user_id, changes=changes))


class KudosAwardInput(serializers.Serializer):
    username = StrictCharField(max_length=255, help_text="The account's username (`alice#12`), or its id.")
    amount = WholeKudosField(default=100, min_value=1, max_value=MAX_AWARD_WHOLE)


class KudosAwardOutput(serializers.Serializer):
    awarded = serializers.FloatField()


class KudosAwardView(APIView):
    @extend_schema(
        operation_id="award_kudos",
        auth=APIKEY_AUTH,
        parameters=[APIKEY],
        request=KudosAwardInput,
        responses={200: KudosAwardOutput, **ERRORS},
    )
    def post(self, request: Request) -> Response:
        """A moderator awards kudos, minted (the AI Horde's route, for its admins there)."""
        moderator = _caller(request)
        data = validated_body(KudosAwardInput, request)
        amount = moderation.award_by_api(
            moderator=moderator, username=data["username"], amount=data["amount"]
        )
        return Response({"awarded": float(amount)})


class ModesInput(serializers.Serializer):
    maintenance_mode = _optional_bool("No new requests are accepted (400 MaintenanceMode).")
    invite_only_mode = _optional_bool("Only trusted or invited accounts may start new workers.")
    raid_mode = _optional_bool("New workers of untrusted accounts are refused.")


@extend_schema_serializer(component_name="HordeModes")
class ModesOutput(serializers.Serializer):
    maintenance_mode = serializers.BooleanField(required=False)
    invite_only_mode = serializers.BooleanField(required=False)
    raid_mode = serializers.BooleanField(required=False)


class ModesView(APIView):
    @extend_schema(operation_id="status_modes", responses={200: ModesOutput, **LIMITED})
    def get(self, request: Request) -> Response:
        current = modes.current()
        return Response(
            {
                "maintenance_mode": current.maintenance,
                "invite_only_mode": current.invite_only,
                "raid_mode": current.raid,
            }
        )

    @extend_schema(
        operation_id="status_modes_modify",
        auth=APIKEY_AUTH,
        parameters=[APIKEY],
        request=ModesInput,
        responses={200: ModesOutput, **ERRORS},
    )
    def put(self, request: Request) -> Response:
        """A moderator sets the horde's modes (the AI Horde's maintenance is its admins')."""
        moderator = _caller(request)
        changes = validated_body(ModesInput, request)
        return Response(moderation.set_modes_by_api(moderator=moderator, changes=changes))
