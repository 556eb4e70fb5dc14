"""The horde's worker routes (the AI Horde's `/workers`): parse, call one service or read, shape
the answer with `workers.details`. The account routes are `kudos.views`'."""

from datetime import timedelta
from uuid import UUID

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from hordeops import clock, errors
from hordeops.api import validated_body
from hordeops.replica import replica_reads
from hordeops.serializers import (
    APIKEY,
    APIKEY_AUTH,
    OBJECT_LIST,
    OPTIONAL_APIKEY_AUTH,
    HordeErrorOutput,
    StrictBooleanField,
    StrictCharField,
    StrictIntegerField,
    keyed_route,
)
from workers import services, shared_keys, teams
from workers.details import TEXT, online_workers, privileged_details, unique_alias, worker_details
from workers.models import MAX_TIMEOUT_HOURS, Account, AddressTimeout, Team, Worker

APIKEY_OPTIONAL = OpenApiParameter("apikey", str, OpenApiParameter.HEADER, required=False)
ERRORS = {code: HordeErrorOutput for code in (400, 401, 403, 404, 429)}


def caller(request: Request) -> Account | None:
    """The key's account, if a known key was sent: it decides what details are shown. An
    unknown key is no error on these public routes, as on the AI Horde: it sees what anyone does."""
    try:
        return services.authenticate(api_key=request.headers.get("apikey"))
    except errors.InvalidAPIKey:
        return None


def may_see(viewer: Account | None, account_id: int) -> bool:
    return viewer is not None and (viewer.moderator or viewer.pk == account_id)


def _worker(lookup: dict) -> Worker:
    worker = Worker.objects.live().select_related("account", "team").filter(**lookup).first()
    if worker is None:
        raise errors.WorkerNotFound()
    return worker


def _worker_answer(request: Request, worker: Worker) -> Response:
    privileged = may_see(caller(request), worker.account_id)
    return Response(worker_details(worker, now=clock.now(), privileged=privileged))


class WorkersView(APIView):
    @replica_reads
    @extend_schema(
        operation_id="workers",
        auth=OPTIONAL_APIKEY_AUTH,
        parameters=[
            APIKEY_OPTIONAL,
            OpenApiParameter("type", str, enum=["text", "image", "interrogation", "all", ""]),
            OpenApiParameter("name", str),
        ],
        responses={200: OBJECT_LIST, **ERRORS},
    )
    def get(self, request: Request) -> Response:
        """The workers online now (the AI Horde's list); hordeops has text workers only."""
        # horde_sdk's "all" is the empty string, which the AI Horde reads as no filter.
        kind = request.query_params.get("type") or "all"
        if kind not in (TEXT, "image", "interrogation", "all"):
            raise errors.BadRequest("type must be one of text, image, interrogation or all.")
        if kind not in (TEXT, "all"):
            return Response([])
        now = clock.now()
        viewer = caller(request)
        name = request.query_params.get("name")
        if viewer is not None and viewer.moderator:  # sees every worker's private details
            workers = Worker.objects.online(now).select_related("account", "team").order_by("name")
            if name is not None:
                workers = workers.filter(name=name)
            return Response([worker_details(w, now=now, privileged=True) for w in workers])
        # Everyone else reads the cached list; an owner sees its own workers' details too.
        own = privileged_details(viewer) if viewer is not None else {}
        return Response(
            [
                {**details, **own, "paused": paused}
                if viewer is not None and account_id == viewer.pk
                else details
                for account_id, details, paused in online_workers(now=now)
                if name is None or details["name"] == name
            ]
        )


class WorkerModifyInput(serializers.Serializer):
    maintenance = StrictBooleanField(required=False, allow_null=True)
    maintenance_msg = StrictCharField(required=False, allow_null=True, allow_blank=True, max_length=500)
    info = StrictCharField(required=False, allow_null=True, allow_blank=True, max_length=1000)
    name = StrictCharField(required=False, allow_null=True, min_length=5, max_length=100)
    paused = StrictBooleanField(required=False, allow_null=True)
    team = StrictCharField(required=False, allow_null=True, allow_blank=True, max_length=36)


WORKER_ID = OpenApiParameter("worker_id", OpenApiTypes.UUID, OpenApiParameter.PATH)


class WorkerView(APIView):
    def _id(self, raw: str) -> UUID:
        try:
            return UUID(raw)
        except ValueError:
            raise errors.WorkerNotFound() from None

    @replica_reads
    @extend_schema(
        operation_id="worker",
        parameters=[WORKER_ID, APIKEY_OPTIONAL],
        responses={200: dict, **ERRORS},
        auth=OPTIONAL_APIKEY_AUTH,
    )
    def get(self, request: Request, worker_id: str) -> Response:
        return _worker_answer(request, _worker({"pk": self._id(worker_id)}))

    @extend_schema(
        operation_id="worker_modify",
        auth=APIKEY_AUTH,
        parameters=[WORKER_ID, APIKEY],
        request=WorkerModifyInput,
        responses={200: dict, **ERRORS},
    )
    def put(self, request: Request, worker_id: str) -> Response:
        serializer = WorkerModifyInput(data=request.data)
        serializer.is_valid(raise_exception=True)
        changed = services.modify_worker(
            api_key=request.headers.get("apikey"), worker_id=self._id(worker_id), **serializer.validated_data
        )
        return Response(changed)

    @extend_schema(
        operation_id="worker_delete",
        auth=APIKEY_AUTH,
        parameters=[WORKER_ID, APIKEY],
        responses={
            200: inline_serializer(
                "DeletedWorker",
                {"deleted_id": serializers.CharField(), "deleted_name": serializers.CharField()},
            ),
            **ERRORS,
        },
    )
    def delete(self, request: Request, worker_id: str) -> Response:
        """Delete the worker, as its owner or a moderator (KoboldAI Lite's "Del." button)."""
        deleted = services.delete_worker(api_key=request.headers.get("apikey"), worker_id=self._id(worker_id))
        return Response(deleted)


class WorkerByNameView(APIView):
    @replica_reads
    @extend_schema(
        operation_id="worker_by_name",
        parameters=[APIKEY_OPTIONAL],
        responses={200: dict, **ERRORS},
        auth=OPTIONAL_APIKEY_AUTH,
    )
    def get(self, request: Request, worker_name: str) -> Response:
        return _worker_answer(request, _worker({"name": worker_name}))


class GoodbyeInput(serializers.Serializer):
    name = StrictCharField(min_length=1, max_length=100, trim_whitespace=True)


class WorkerGoodbyeView(APIView):
    @extend_schema(
        operation_id="worker_goodbye",
        auth=APIKEY_AUTH,
        parameters=[APIKEY],
        request=GoodbyeInput,
        responses={
            200: inline_serializer(
                "WorkerGoodbye",
                {
                    "id": serializers.CharField(),
                    "name": serializers.CharField(),
                    "online": serializers.BooleanField(),
                },
            ),
            **ERRORS,
        },
    )
    def post(self, request: Request) -> Response:
        """A stopping worker says so: offline at once, until its next pop (hordeops' own route)."""
        data = validated_body(GoodbyeInput, request)
        worker = services.say_goodbye(
            api_key=request.headers.get("apikey"), name=data["name"], now=clock.now()
        )
        return Response({"id": str(worker.pk), "name": worker.name, "online": False})


class AddTimeoutInput(serializers.Serializer):
    ipaddr = StrictCharField(min_length=7, max_length=40)
    hours = StrictIntegerField(min_value=1, max_value=MAX_TIMEOUT_HOURS)


class DeleteTimeoutInput(serializers.Serializer):
    ipaddr = StrictCharField(min_length=7, max_length=40)


IP_TIMEOUTS = inline_serializer(
    "IPTimeout", {"ipaddr": serializers.CharField(), "seconds": serializers.IntegerField()}, many=True
)
SIMPLE = inline_serializer("SimpleResponse", {"message": serializers.CharField()})


def _moderator(request: Request) -> Account:
    caller = services.authenticate(api_key=request.headers.get("apikey"))
    if not caller.moderator:
        raise errors.NotModerator()
    return caller


def _timeouts_answer(rows) -> list[dict]:
    now = clock.now()
    return [
        {"ipaddr": row.network, "seconds": int((row.until - now).total_seconds())}
        for row in rows
        if row.until > now
    ]


class OperationsIPView(APIView):
    """The AI Horde's `/v2/operations/ipaddr`: a moderator lists, adds and removes timeouts."""

    @keyed_route("operations_ip_list", answer=IP_TIMEOUTS, refusals=ERRORS)
    def get(self, request: Request) -> Response:
        _moderator(request)
        return Response(_timeouts_answer(AddressTimeout.objects.active(clock.now())))

    @keyed_route("operations_ip_add", body=AddTimeoutInput, answer=SIMPLE, refusals=ERRORS)
    def post(self, request: Request) -> Response:
        moderator = _moderator(request)
        data = validated_body(AddTimeoutInput, request)
        now = clock.now()
        services.time_out_address(
            network=data["ipaddr"], until=now + timedelta(hours=data["hours"]), by=moderator.name, now=now
        )
        return Response({"message": "OK"})

    @keyed_route("operations_ip_delete", body=DeleteTimeoutInput, answer=SIMPLE, refusals=ERRORS)
    def delete(self, request: Request) -> Response:
        moderator = _moderator(request)
        data = validated_body(DeleteTimeoutInput, request)
        services.lift_address_timeouts(networks=[data["ipaddr"]], by=moderator.name, now=clock.now())
        return Response({"message": "OK"})


class OperationsIPSingleView(APIView):
    @keyed_route("operations_ip", answer=IP_TIMEOUTS, refusals=ERRORS)
    def get(self, request: Request, ipaddr: str) -> Response:
        """The timeouts that hold an address or a network."""
        _moderator(request)
        try:
            holding = AddressTimeout.objects.active(clock.now()).holding(ipaddr)
        except ValueError:
            raise errors.BadRequest("Invalid IP Address") from None
        return Response(_timeouts_answer(holding))


class BlockWorkerInput(serializers.Serializer):
    """The AI Horde's `AddWorkerTimeout`."""

    days = StrictIntegerField(
        min_value=1, max_value=30, help_text="For how many days to put this worker's IP in timeout."
    )


class OperationsBlockWorkerIPView(APIView):
    """The AI Horde's `/v2/operations/block_worker_ipaddr/{worker_id}`: a moderator times out a
    worker's address, or lifts that timeout, without seeing the address."""

    def _id(self, raw: str) -> UUID:
        try:
            return UUID(raw)
        except ValueError:
            raise errors.WorkerNotFound(f"Worker with ID '{raw}' not found.") from None

    @extend_schema(
        operation_id="operations_block_worker_ip",
        auth=APIKEY_AUTH,
        parameters=[WORKER_ID, APIKEY],
        request=BlockWorkerInput,
        responses={200: SIMPLE, **ERRORS},
    )
    def put(self, request: Request, worker_id: str) -> Response:
        moderator = _moderator(request)
        data = validated_body(BlockWorkerInput, request)
        services.block_worker_address(
            worker_id=self._id(worker_id), days=data["days"], by=unique_alias(moderator), now=clock.now()
        )
        return Response({"message": "OK"})

    @extend_schema(
        operation_id="operations_unblock_worker_ip",
        auth=APIKEY_AUTH,
        parameters=[WORKER_ID, APIKEY],
        responses={200: SIMPLE, **ERRORS},
    )
    def delete(self, request: Request, worker_id: str) -> Response:
        moderator = _moderator(request)
        services.unblock_worker_address(
            worker_id=self._id(worker_id), by=unique_alias(moderator), now=clock.now()
        )
        return Response({"message": "OK"})


class SharedKeyInput(serializers.Serializer):
    """The AI Horde's `SharedKeyInput`; the image limits are taken and bind nothing (text only)."""

    kudos = StrictIntegerField(min_value=-1, max_value=shared_keys.MAX_KUDOS, required=False, allow_null=True)
    expiry = StrictIntegerField(
        min_value=-1, max_value=shared_keys.MAX_EXPIRY_DAYS, required=False, allow_null=True
    )
    # Kept as sent: a trimmed name could be shorter than the schema allows.
    name = StrictCharField(
        min_length=shared_keys.NAME_LENGTH[0],
        max_length=shared_keys.NAME_LENGTH[1],
        required=False,
        allow_null=True,
        trim_whitespace=False,
    )
    max_image_pixels = StrictIntegerField(min_value=-1, max_value=4_194_304, required=False, allow_null=True)
    max_image_steps = StrictIntegerField(min_value=-1, max_value=500, required=False, allow_null=True)
    max_text_tokens = StrictIntegerField(
        min_value=-1, max_value=shared_keys.MAX_TEXT_TOKENS, required=False, allow_null=True
    )


class SharedKeyOutput(serializers.Serializer):
    """The AI Horde's `SharedKeyDetails` (`expiry` left out when it never expires)."""

    id = serializers.UUIDField()
    username = serializers.CharField()
    name = serializers.CharField(allow_blank=True)
    kudos = serializers.IntegerField()
    expiry = serializers.CharField(required=False)
    utilized = serializers.IntegerField()
    max_image_pixels = serializers.IntegerField()
    max_image_steps = serializers.IntegerField()
    max_text_tokens = serializers.IntegerField()


SHARED_KEY_ID = OpenApiParameter("sharedkey_id", OpenApiTypes.UUID, OpenApiParameter.PATH)
SHARED_KEY_ERRORS = {code: HordeErrorOutput for code in (400, 401, 403, 408, 413, 429)}


def _settings(data: dict) -> dict:
    """The key's settings the body gave (the image limits dropped)."""
    chosen = ("kudos", "expiry", "name", "max_text_tokens")
    return {field: data[field] for field in chosen if data.get(field) is not None}


class SharedKeysView(APIView):
    @keyed_route("sharedkey_create", body=SharedKeyInput, answer=SharedKeyOutput, refusals=SHARED_KEY_ERRORS)
    def put(self, request: Request) -> Response:
        """Make a shared key of the caller's (`kudos` 5000, -1 unlimited; `expiry` in days, -1 never)."""
        account = shared_keys.caller(api_key=request.headers.get("apikey"))
        data = validated_body(SharedKeyInput, request)
        shared_keys.take_rate(account_id=account.pk)
        key = shared_keys.create_shared_key(owner=account, now=clock.now(), **_settings(data))
        return Response(shared_keys.details(key))


class SharedKeyView(APIView):
    @extend_schema(
        operation_id="sharedkey",
        parameters=[SHARED_KEY_ID],
        responses={200: SharedKeyOutput, 401: HordeErrorOutput, 429: HordeErrorOutput},
    )
    def get(self, request: Request, sharedkey_id: str) -> Response:
        """A shared key's details: its id is the key, so whoever holds it may read them."""
        key = shared_keys.find(sharedkey_id)
        if key is None:
            raise errors.SharedKeyNotFound()
        return Response(shared_keys.details(key))

    @keyed_route("sharedkey_modify", body=SharedKeyInput, answer=SharedKeyOutput, refusals=SHARED_KEY_ERRORS)
    def patch(self, request: Request, sharedkey_id: str) -> Response:
        """Change the owner's key: what the body gives (at least one), the rest as it was."""
        data = validated_body(SharedKeyInput, request)
        changes = {field: data.get(field) for field in ("kudos", "expiry", "name", "max_text_tokens")}
        owner = shared_keys.caller(api_key=request.headers.get("apikey"), key_id=sharedkey_id)
        key = shared_keys.modify_shared_key(owner=owner, key_id=sharedkey_id, now=clock.now(), **changes)
        return Response(shared_keys.details(key))

    @keyed_route("sharedkey_delete", answer=SIMPLE, refusals=SHARED_KEY_ERRORS)
    def delete(self, request: Request, sharedkey_id: str) -> Response:
        """Delete the owner's key: refused everywhere from then on."""
        owner = shared_keys.caller(api_key=request.headers.get("apikey"), key_id=sharedkey_id)
        shared_keys.delete_shared_key(owner=owner, key_id=sharedkey_id)
        return Response({"message": "OK"})


class TeamCreateInput(serializers.Serializer):
    """The AI Horde's `CreateTeamInput`. Kept as sent: a trimmed name could be shorter than the
    schema allows."""

    name = StrictCharField(
        min_length=Team.NAME_LENGTH[0], max_length=Team.NAME_LENGTH[1], trim_whitespace=False
    )
    info = StrictCharField(
        min_length=Team.INFO_LENGTH[0],
        max_length=Team.INFO_LENGTH[1],
        required=False,
        allow_null=True,
        trim_whitespace=False,
    )


class TeamModifyInput(TeamCreateInput):
    """The AI Horde's `ModifyTeamInput`: either field, or both."""

    name = StrictCharField(
        min_length=Team.NAME_LENGTH[0],
        max_length=Team.NAME_LENGTH[1],
        required=False,
        allow_null=True,
        trim_whitespace=False,
    )


class TeamWorkerOutput(serializers.Serializer):
    """The AI Horde's `WorkerDetailLite`."""

    type = serializers.CharField()
    name = serializers.CharField()
    id = serializers.UUIDField()
    online = serializers.BooleanField()


class TeamModelOutput(serializers.Serializer):
    """The AI Horde's `ActiveModelLite`."""

    name = serializers.CharField()
    count = serializers.IntegerField()


class TeamDetailsOutput(serializers.Serializer):
    """The AI Horde's `TeamDetails` (`workers.teams.team_details`)."""

    name = serializers.CharField()
    id = serializers.UUIDField()
    info = serializers.CharField(allow_null=True)
    requests_fulfilled = serializers.IntegerField()
    kudos = serializers.FloatField()
    uptime = serializers.IntegerField()
    creator = serializers.CharField()
    worker_count = serializers.IntegerField()
    workers = TeamWorkerOutput(many=True)
    models = TeamModelOutput(many=True)


class ModifyTeamOutput(serializers.Serializer):
    """The AI Horde's `ModifyTeam`."""

    id = serializers.UUIDField()
    name = serializers.CharField()
    info = serializers.CharField(allow_null=True)


TEAM_ID = OpenApiParameter("team_id", OpenApiTypes.UUID, OpenApiParameter.PATH)


class TeamsView(APIView):
    @replica_reads
    @extend_schema(operation_id="teams", responses={200: TeamDetailsOutput(many=True), 429: HordeErrorOutput})
    def get(self, request: Request) -> Response:
        """Every team, by name, with its workers and totals."""
        now = clock.now()
        return Response([teams.team_details(team, now=now) for team in teams.teams()])

    @keyed_route("team_create", body=TeamCreateInput, answer=ModifyTeamOutput, refusals=ERRORS)
    def post(self, request: Request) -> Response:
        """Make a team: trusted accounts only (403 `UntrustedTeamCreation`)."""
        caller = services.authenticate(api_key=request.headers.get("apikey"))
        data = validated_body(TeamCreateInput, request)
        team = teams.create_team(caller=caller, name=data["name"], info=data.get("info"))
        return Response(teams.changed_answer(team))


class TeamView(APIView):
    @replica_reads
    @extend_schema(
        operation_id="team",
        parameters=[TEAM_ID, APIKEY_OPTIONAL],
        auth=OPTIONAL_APIKEY_AUTH,
        responses={200: TeamDetailsOutput, **ERRORS},
    )
    def get(self, request: Request, team_id: str) -> Response:
        """A team's details. A key, when sent, must be its creator's or a moderator's, as the AI
        Horde asks of it (403 `NotModerator`)."""
        team = teams.find_team(team_id)
        if request.headers.get("apikey") is not None:
            viewer = services.authenticate(api_key=request.headers.get("apikey"))
            if not team.may_change(viewer):
                raise errors.NotModerator("Only the team's creator or a moderator may send a key here.")
        return Response(teams.team_details(team, now=clock.now()))

    @extend_schema(
        operation_id="team_modify",
        auth=APIKEY_AUTH,
        parameters=[TEAM_ID, APIKEY],
        request=TeamModifyInput,
        responses={200: ModifyTeamOutput, **ERRORS},
    )
    def patch(self, request: Request, team_id: str) -> Response:
        """Rename or describe a team, as its creator or a moderator."""
        caller = services.authenticate(api_key=request.headers.get("apikey"))
        data = validated_body(TeamModifyInput, request)
        team = teams.modify_team(caller=caller, team_id=team_id, name=data.get("name"), info=data.get("info"))
        return Response(teams.changed_answer(team))

    @extend_schema(
        operation_id="team_delete",
        auth=APIKEY_AUTH,
        parameters=[TEAM_ID, APIKEY],
        responses={
            200: inline_serializer(
                "DeletedTeam",
                {"deleted_id": serializers.CharField(), "deleted_name": serializers.CharField()},
            ),
            **ERRORS,
        },
    )
    def delete(self, request: Request, team_id: str) -> Response:
        """Delete a team, as its creator or a moderator: its workers are left without one."""
        caller = services.authenticate(api_key=request.headers.get("apikey"))
        return Response(teams.delete_team(caller=caller, team_id=team_id))
