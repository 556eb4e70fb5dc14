"""Run one text request through hordeops with the official AI Horde client, horde_sdk.

Runs under .venv-sdk/bin/python (horde-sdk needs Python 3.12; see bin/sdk-venv), not under
pytest: tests/test_horde_sdk_compat.py starts it against a live server and reads its output.

    AI_HORDE_URL=http://127.0.0.1:PORT/api/ .venv-sdk/bin/python tests/sdk/horde_sdk_roundtrip.py \
        REQUESTER_KEY WORKER_KEY MODEL

The keys and the model may instead come from HORDE_REQUESTER_KEY, HORDE_WORKER_KEY and
HORDE_MODEL. `... horde_sdk_roundtrip.py fleet FLEET_JSON` instead reads the details of workers and
accounts the test made (`fleet`): every list and single form, public and privileged; and
`... horde_sdk_roundtrip.py sharedkeys OWNER_KEY` makes, uses, reads, changes and deletes a
shared key of that account's (`sharedkeys`); `... horde_sdk_roundtrip.py documents` reads the news
and the three documents (`documents`); `... horde_sdk_roundtrip.py teams CREATOR_KEY WORKER_KEY
WORKER_ID` makes, lists, reads, changes and deletes a team, with that worker in it (`teams`);
`... horde_sdk_roundtrip.py workermessages MODERATOR_KEY OWNER_KEY WORKER_ID` sends, lists,
reads and deletes messages to a worker (`workermessages`); `... horde_sdk_roundtrip.py
blockworker MODERATOR_KEY WORKER_ID` times out a worker's address and lifts it (`blockworker`);
`... horde_sdk_roundtrip.py moderators MODERATOR_KEY OWNER_KEY OWNER_ID` lists users, changes
that account as a moderator and as itself, and awards it kudos (`moderators`).
`... horde_sdk_roundtrip.py styles CREATOR_KEY REQUESTER_KEY WORKER_KEY MODEL` makes, reads,
uses, changes and deletes a text style and a collection of it (`styles`).
AI_HORDE_URL is read by horde_sdk when it is imported and must end with a slash.

Every request is an SDK request model sent with the SDK's synchronous manual client, and every
answer is parsed into the SDK's response model. Prints one JSON object of what was seen; any
HTTP error or SDK parse failure prints the error on stderr and exits with status 1.

horde_sdk 0.33.3 quirks met here:
- The base URL is the module global `endpoints.AI_HORDE_BASE_URL`, set from AI_HORDE_URL (or,
  winning, AI_HORDE_DEV_URL) at import time; it is urljoined, so without the trailing slash
  requests go to /v2/... instead of /api/v2/....
- `import horde_sdk` calls `dotenv.load_dotenv()`, which looks for .env from the installed
  package's folder upwards (.venv-sdk/.., that is the repo root), not from the working directory;
  it does not override variables already set.
- The manual client does not raise on an HTTP error or on a response its model rejects: it returns
  a `RequestErrorResponse` (the pydantic error is in `object_data["exception"]`), so `_send` checks.
  Only a 4xx/5xx body with an `errors` key raises (`PayloadValidationError`). The sync client never
  retries (`should_retry` is defined but not called in 0.33.3).
- Request models validate `apikey`: only "0000000000", a 36-character UUID or 22 characters pass.
- Unknown response keys are kept (`model_extra`) unless TESTS_ONGOING is set, which makes every
  model `extra="forbid"`: then hordeops' extra pop keys `kind` and `lease` fail to parse. The test
  unsets TESTS_ONGOING, AI_HORDE_DEV_URL and AI_HORDE_DEV_APIKEY for this script.
- A document request's `format` is sent only when left at its default (html): set, it goes into
  the body, and the client refuses a GET with a body ("GET requests cannot have a body!").
- Pop responses: `skipped` must be an object (never null), `payload.top_k` may be at most 100 and
  `payload.max_length` at least 16; `id`/`ids` must be UUIDs.
- Its `ResponseModelCollection` declares `type` as `Literal["image"]`: a text collection's
  `"text"`, which the AI Horde answers too, fails its model in any mode (`styles`). The
  collections list's `type` is, like a document's `format`, sent only at its default ("all"):
  its field is `type_`, so the client puts a set `type` in the body of a GET and refuses it.
  `CollectionByNameRequest` cannot be sent at all: `collection_name` is not among the client's
  path fields (`AIHordePathData`), so it goes to the body of a GET, refused the same way.
"""

import json
import os
import sys
import time
from typing import Any, TypeVar

from horde_sdk.ai_horde_api import endpoints
from horde_sdk.ai_horde_api.ai_horde_clients import AIHordeAPIManualClient, AIHordeAPISimpleClient
from horde_sdk.ai_horde_api.apimodels import (
    AIHordeGetPrivacyPolicyRequest,
    AIHordeGetSponsorsRequest,
    AIHordeGetTermsRequest,
    AllCollectionsRequest,
    AllCollectionsResponse,
    AllStylesTextRequest,
    AllStylesTextResponse,
    AllTeamDetailsRequest,
    AllTeamDetailsResponse,
    AllWorkerMessagesRequest,
    AllWorkersDetailsRequest,
    AllWorkersDetailsResponse,
    BlockWorkerIPAddressRequest,
    BlockWorkerIPAddressResponse,
    CollectionByIDRequest,
    CollectionByNameRequest,
    CreateCollectionRequest,
    CreateCollectionResponse,
    CreateStyleTextRequest,
    CreateTeamRequest,
    CreateWorkerMessageRequest,
    DeleteCollectionRequest,
    DeleteCollectionResponse,
    DeleteStyleTextRequest,
    DeleteStyleTextResponse,
    DeleteTeamRequest,
    DeleteTeamResponse,
    DeleteWorkerIPAddressRequest,
    DeleteWorkerIPAddressResponse,
    DeleteWorkerMessageRequest,
    DeleteWorkerMessageResponse,
    DeleteWorkerRequest,
    DeleteWorkerResponse,
    FindUserRequest,
    HordeDocument,
    HordePerformanceRequest,
    HordePerformanceResponse,
    HordeStatusModelsAllRequest,
    HordeStatusModelsAllResponse,
    HordeStatusModelsSingleRequest,
    HordeStatusModelsSingleResponse,
    JobSubmitResponse,
    KudosAwardRequest,
    KudosAwardResponse,
    KudosTransferRequest,
    KudosTransferResponse,
    ListUsersDetailsRequest,
    ListUsersDetailsResponse,
    ModelGenerationInputKobold,
    ModelStyleInputParamsKobold,
    ModifyStyleTextRequest,
    ModifyStyleTextResponse,
    ModifyTeam,
    ModifyTeamRequest,
    ModifyUserRequest,
    ModifyUserResponse,
    ModifyWorkerRequest,
    ModifyWorkerResponse,
    NewsRequest,
    NewsResponse,
    ResponseModelCollection,
    ResponseModelMessage,
    ResponseModelMessages,
    SharedKeyCreateRequest,
    SharedKeyDeleteRequest,
    SharedKeyDeleteResponse,
    SharedKeyDetailsRequest,
    SharedKeyModifyRequest,
    SingleStyleTextByIDRequest,
    SingleStyleTextByNameRequest,
    SingleTeamDetailsRequest,
    SingleUserDetailsRequest,
    SingleWorkerDetailsRequest,
    SingleWorkerDetailsResponse,
    SingleWorkerMessageRequest,
    SingleWorkerNameDetailsRequest,
    StyleKobold,
    TeamDetails,
    TextGenerateAsyncRequest,
    TextGenerateAsyncResponse,
    TextGenerateJobPopRequest,
    TextGenerateJobPopResponse,
    TextGenerateStatusRequest,
    TextGenerateStatusResponse,
    TextGenerationJobSubmitRequest,
    TextStatsModelResponse,
    TextStatsModelsRequest,
    TextStatsModelsTotalRequest,
    TextStatsModelsTotalResponse,
    UpdateCollectionRequest,
    UpdateCollectionResponse,
    UserDetailsResponse,
)
from horde_sdk.ai_horde_api.apimodels.sharedkeys import ExpiryStrSharedKeyDetailsResponse
from horde_sdk.ai_horde_api.consts import GENERATION_STATE
from horde_sdk.generic_api.apimodels import HordeRequest, HordeResponse, RequestErrorResponse

PROMPT = "Once upon a time, in a horde far away,"
# Leading and trailing blanks, a newline and non-ASCII: the text must come back byte for byte.
GENERATION = " there lived a worker.\n\u2014 The end. \u2713 "
MAX_LENGTH = 80
STATUS_TIMEOUT_SECONDS = 30.0

ResponseT = TypeVar("ResponseT", bound=HordeResponse)


class RoundtripError(Exception):
    pass


def _arg(index: int, env: str) -> str:
    value = sys.argv[index] if len(sys.argv) > index else os.environ.get(env, "")
    if not value:
        raise RoundtripError(f"missing argument {index} or environment variable {env}")
    return value


def _send(client: AIHordeAPIManualClient, request: HordeRequest, expected: type[ResponseT]) -> ResponseT:
    """Send one request model; return the parsed response model or raise on any failure."""
    response = client.submit_request(request, expected)
    if isinstance(response, RequestErrorResponse):
        raise RoundtripError(
            f"{type(request).__name__} -> {expected.__name__} failed: {response.message} "
            f"(rc={response.rc}, object_data={response.object_data!r})"
        )
    if not isinstance(response, expected):
        raise RoundtripError(f"{type(request).__name__}: expected {expected.__name__}, got {response!r}")
    return response


def _unknown_keys(model: Any) -> list[str]:
    """Keys the server sent that this SDK version has no field for (allowed unless TESTS_ONGOING)."""
    return sorted((model.model_extra or {}).keys())


def _ask_text(client: AIHordeAPIManualClient, api_key: str, **body: Any) -> TextGenerateAsyncResponse:
    """A text request of PROMPT, MAX_LENGTH tokens at 1,024 context, queued with `api_key`."""
    request = TextGenerateAsyncRequest(
        apikey=api_key,
        prompt=PROMPT,
        params=ModelGenerationInputKobold(max_length=MAX_LENGTH, max_context_length=1024),
        **body,
    )
    return _send(client, request, TextGenerateAsyncResponse)


def _ask_proxied(client: AIHordeAPIManualClient, api_key: str, model: str) -> dict[str, Any]:
    """The AI Horde's request fields of its own, as the SDK sends them: for one of a service
    account's users, from validated bridges only, unbatched. Accepted from a service account,
    refused (OnlyServiceAccountProxy) from any other; either answer parsed by its model."""
    request = TextGenerateAsyncRequest(
        apikey=api_key,
        prompt=PROMPT,
        params=ModelGenerationInputKobold(max_length=MAX_LENGTH, max_context_length=1024),
        models=[model],
        validated_backends=True,
        disable_batching=True,
        proxied_account="sdk-reader#1",
    )
    answer = client.submit_request(request, TextGenerateAsyncResponse)
    if isinstance(answer, RequestErrorResponse):
        return {"rc": answer.rc, "message": answer.message}
    if not isinstance(answer, TextGenerateAsyncResponse):
        raise RoundtripError(f"TextGenerateAsyncRequest: got {answer!r}")
    return {"id": str(answer.id_), "message": answer.message, "unknown_keys": _unknown_keys(answer)}


def run(base_url: str, requester_key: str, worker_key: str, model: str) -> dict[str, Any]:
    client = AIHordeAPIManualClient()
    worker_name = f"sdk-worker-{os.getpid()}"

    def pop() -> TextGenerateJobPopResponse:
        request = TextGenerateJobPopRequest(
            apikey=worker_key,
            name=worker_name,
            models=[model],
            max_length=512,
            max_context_length=2048,
            bridge_agent="horde_sdk roundtrip:0.33.3:hordeops-tests",
        )
        return _send(client, request, TextGenerateJobPopResponse)

    # (a) The worker checks in once so that the server knows it and its model.
    first_pop = pop()
    if first_pop.id_ is not None or first_pop.ids:
        raise RoundtripError(f"the first pop should find no job, got {first_pop!r}")

    # (b) The requester asks for text from that model.
    created = _ask_text(client, requester_key, models=[model])

    # (c) The worker pops the job.
    job = pop()
    if job.id_ is None:
        raise RoundtripError(f"the second pop should hand out a job, got {job!r}")

    # (d) The worker submits its generation.
    submitted = _send(
        client,
        TextGenerationJobSubmitRequest(
            apikey=worker_key, id=job.id_, generation=GENERATION, state=GENERATION_STATE.ok
        ),
        JobSubmitResponse,
    )

    # (e) The requester polls until the request is done.
    deadline = time.monotonic() + STATUS_TIMEOUT_SECONDS
    polls = 0
    while True:
        polls += 1
        status = _send(client, TextGenerateStatusRequest(id=created.id_), TextGenerateStatusResponse)
        if status.done:
            break
        if time.monotonic() > deadline:
            raise RoundtripError(f"request not done after {STATUS_TIMEOUT_SECONDS}s: {status!r}")
        time.sleep(0.2)

    discovery = _discover(client, requester_key, worker_key, worker_name, model)
    proxied = _ask_proxied(client, requester_key, model)

    return {
        "base_url": base_url,
        "discovery": discovery,
        "proxied": proxied,
        "first_pop": {"id": first_pop.id_ and str(first_pop.id_), "ids": [str(i) for i in first_pop.ids]},
        "request_id": str(created.id_),
        "request_kudos": created.kudos,
        "job_id": str(job.id_),
        "job_ids": [str(i) for i in job.ids],
        "job_model": job.model,
        "payload_prompt": job.payload.prompt,
        "payload_max_length": job.payload.max_length,
        "payload_max_context_length": job.payload.max_context_length,
        "payload_n": job.payload.n,
        "ttl": job.ttl,
        "skipped_is_empty": job.skipped.is_empty(),
        "submitted_text": GENERATION,
        "reward": submitted.reward,
        "status_polls": polls,
        "status": {
            "done": status.done,
            "faulted": status.faulted,
            "finished": status.finished,
            "processing": status.processing,
            "waiting": status.waiting,
            "kudos": status.kudos,
            "generations": [
                {
                    "text": g.text,
                    "model": g.model,
                    "state": str(g.state),
                    "worker_id": str(g.worker_id),
                    "worker_name": g.worker_name,
                    "seed": g.seed,
                }
                for g in status.generations
            ],
        },
        "unknown_keys": {
            "pop_response": _unknown_keys(job),
            "async_response": _unknown_keys(created),
            "status_response": _unknown_keys(status),
        },
    }


def _discover(
    client: AIHordeAPIManualClient, requester_key: str, worker_key: str, worker_name: str, model: str
) -> dict[str, Any]:
    """Every discovery and account route the SDK models, each answer parsed by its model."""
    me = _send(client, FindUserRequest(apikey=worker_key), UserDetailsResponse)
    user = _send(client, SingleUserDetailsRequest(user_id=str(me.id_)), UserDetailsResponse)
    workers = _send(
        client, AllWorkersDetailsRequest(type="text", apikey=requester_key), AllWorkersDetailsResponse
    )
    mine = [w for w in workers.root if w.name == worker_name]
    if not mine:
        raise RoundtripError(f"{worker_name} is not in the workers list")
    by_id = _send(
        client,
        SingleWorkerDetailsRequest(worker_id=mine[0].id_, apikey=worker_key),
        SingleWorkerDetailsResponse,
    )
    by_name = _send(
        client, SingleWorkerNameDetailsRequest(worker_name=worker_name), SingleWorkerDetailsResponse
    )
    modified = _send(
        client,
        ModifyWorkerRequest(
            apikey=worker_key, worker_id=mine[0].id_, maintenance=False, info="a roundtrip worker"
        ),
        ModifyWorkerResponse,
    )
    models = _send(client, HordeStatusModelsAllRequest(type="text"), HordeStatusModelsAllResponse)
    one = _send(client, HordeStatusModelsSingleRequest(model_name=model), HordeStatusModelsSingleResponse)
    load = _send(client, HordePerformanceRequest(), HordePerformanceResponse)
    totals = _send(client, TextStatsModelsTotalRequest(), TextStatsModelsTotalResponse)
    per_model = _send(client, TextStatsModelsRequest(), TextStatsModelResponse)
    # workers_all_details(): the SDK's "all" type is the empty string.
    everyone = _send(client, AllWorkersDetailsRequest(apikey=requester_key), AllWorkersDetailsResponse)
    deleted = _send(
        client, DeleteWorkerRequest(worker_id=mine[0].id_, apikey=worker_key), DeleteWorkerResponse
    )
    sent = _send(
        client,
        KudosTransferRequest(apikey=requester_key, username=me.username, amount=5),
        KudosTransferResponse,
    )
    after = _send(client, FindUserRequest(apikey=worker_key), UserDetailsResponse)
    return {
        "transferred": sent.transferred,
        "kudos": {"before": me.kudos, "after": after.kudos, "received": after.kudos_details.received},
        "find_user": {"username": me.username, "worker_count": me.worker_count, "worker_ids": me.worker_ids},
        "user": {"username": user.username, "worker_ids": user.worker_ids},
        "worker": {
            "id": str(by_id.id_),
            "name": by_name.name,
            "online": by_id.online,
            "models": by_id.models,
            "owner": by_id.owner,
            "requests_fulfilled": by_name.requests_fulfilled,
        },
        "modified": {"maintenance": modified.maintenance, "info": modified.info},
        "models": [m.name for m in models.root],
        "model": [(m.name, m.count) for m in one.root],
        "text_worker_count": load.text_worker_count,
        "totals_total": totals.total,
        "per_model_total": per_model.total,
        "all_types": [w.name for w in everyone.root],
        "deleted": {"id": str(deleted.deleted_id), "name": deleted.deleted_name},
    }


def _worker_seen(worker: Any) -> dict[str, Any]:
    kudos = worker.kudos_details
    return {
        "online": worker.online,
        "trusted": worker.trusted,
        "maintenance_mode": worker.maintenance_mode,
        "kudos_rewards": worker.kudos_rewards,
        "kudos_details": {"generated": kudos.generated, "uptime": kudos.uptime},
        "owner": worker.owner,
    }


def fleet(spec: dict[str, Any]) -> dict[str, Any]:
    """The workers and accounts `spec` names, through the simple client's worker calls
    (`workers_all_details`, `worker_details`, `worker_details_by_name`) and the user routes,
    as anyone, as their owner and as a moderator: every answer parsed by its model."""
    simple = AIHordeAPISimpleClient()
    manual = AIHordeAPIManualClient()
    moderator, owner = spec["moderator_key"], spec["owner_key"]
    listed = {
        viewer: {w.name: _worker_seen(w) for w in simple.workers_all_details(api_key=key)}
        for viewer, key in (("anyone", None), ("owner", owner), ("moderator", moderator))
    }
    single = {}
    for name in spec["workers"]:
        by_name = simple.worker_details_by_name(name)
        by_id = simple.worker_details(by_name.id_, api_key=moderator)
        single[name] = {"by_name": _worker_seen(by_name), "by_id_as_moderator": _worker_seen(by_id)}
    users = {}
    for user_id in spec["users"]:
        public = _send(manual, SingleUserDetailsRequest(user_id=str(user_id)), UserDetailsResponse)
        users[str(user_id)] = {"kudos": public.kudos, "accumulated": public.kudos_details.accumulated}
    me = _send(manual, FindUserRequest(apikey=owner), UserDetailsResponse)
    boss = _send(manual, FindUserRequest(apikey=moderator), UserDetailsResponse)
    return {
        "listed": listed,
        "single": single,
        "users": users,
        "find_user": {"kudos": me.kudos, "worker_ids": me.worker_ids},
        "moderator": {"moderator": boss.moderator, "evaluating_kudos": boss.evaluating_kudos},
    }


def sharedkeys(owner: str) -> dict[str, Any]:
    """A shared key of the account `owner`, through every shared-key request the SDK models:
    made, read, used as a requester's key (a text request, find_user), changed and deleted;
    then refused. Every answer is parsed by its model."""
    client = AIHordeAPIManualClient()
    limits = {"max_image_pixels": -1, "max_image_steps": -1}
    made = _send(
        client,
        SharedKeyCreateRequest(
            apikey=owner, kudos=500, name="sdk bot", max_text_tokens=100, expiry=30, **limits
        ),
        ExpiryStrSharedKeyDetailsResponse,
    )
    key = str(made.sharedkey_id)
    read = _send(client, SharedKeyDetailsRequest(id=key), ExpiryStrSharedKeyDetailsResponse)
    through = _send(client, FindUserRequest(apikey=key), UserDetailsResponse)
    mine = _send(client, FindUserRequest(apikey=owner), UserDetailsResponse)
    asked = _ask_text(client, key, models=[])
    used = _send(client, SharedKeyDetailsRequest(id=key), ExpiryStrSharedKeyDetailsResponse)
    changed = _send(
        client,
        SharedKeyModifyRequest(
            apikey=owner, id=key, kudos=-1, name="sdk bot 2", max_text_tokens=-1, **limits
        ),
        ExpiryStrSharedKeyDetailsResponse,
    )
    deleted = _send(client, SharedKeyDeleteRequest(apikey=owner, id=key), SharedKeyDeleteResponse)
    after = client.submit_request(
        TextGenerateAsyncRequest(apikey=key, prompt=PROMPT, models=[]), TextGenerateAsyncResponse
    )
    if not isinstance(after, RequestErrorResponse):
        raise RoundtripError(f"a deleted shared key was accepted: {after!r}")

    def seen(details: ExpiryStrSharedKeyDetailsResponse) -> dict[str, Any]:
        return {
            "username": details.username,
            "name": details.name,
            "kudos": details.kudos,
            "utilized": details.utilized,
            "max_text_tokens": details.max_text_tokens,
            "expiry": details.expiry,
        }

    return {
        "id": key,
        "made": seen(made),
        "read": seen(read),
        "used": seen(used),
        "changed": seen(changed),
        "find_user": {"username": through.username, "sharedkey_ids": through.sharedkey_ids},
        "owner_keys": mine.sharedkey_ids,
        "request": {"id": str(asked.id_), "kudos": asked.kudos},
        "deleted": deleted.message,
        "after_delete": after.rc,
    }


def teams(creator: str, worker_key: str, worker_id: str) -> dict[str, Any]:
    """A team of the trusted account `creator`, through every team request the SDK models: made,
    listed, read, renamed, joined by the worker `worker_id` (its owner's `worker_key`), seen in
    the worker's details, deleted. Every answer is parsed by its model."""
    client = AIHordeAPIManualClient()
    made = _send(
        client, CreateTeamRequest(apikey=creator, name="sdk team", info="Made by horde_sdk."), ModifyTeam
    )
    team_id = str(made.id_)
    joined = _send(
        client,
        ModifyWorkerRequest(apikey=worker_key, worker_id=worker_id, team=team_id),
        ModifyWorkerResponse,
    )
    listed = _send(client, AllTeamDetailsRequest(), AllTeamDetailsResponse)
    read = _send(client, SingleTeamDetailsRequest(team_id=team_id), TeamDetails)
    worker = _send(client, SingleWorkerDetailsRequest(worker_id=worker_id), SingleWorkerDetailsResponse)
    changed = _send(
        client,
        ModifyTeamRequest(apikey=creator, team_id=team_id, name="sdk team 2", info="Renamed."),
        ModifyTeam,
    )
    deleted = _send(client, DeleteTeamRequest(apikey=creator, team_id=team_id), DeleteTeamResponse)
    after = _send(client, SingleWorkerDetailsRequest(worker_id=worker_id), SingleWorkerDetailsResponse)

    def seen(details: TeamDetails) -> dict[str, Any]:
        return {
            "name": details.name,
            "creator": details.creator,
            "worker_count": details.worker_count,
            "workers": [str(w.id_) for w in details.workers or []],
            "models": [(m.name, m.count) for m in details.models or []],
            "requests_fulfilled": details.requests_fulfilled,
        }

    return {
        "made": {"id": team_id, "name": made.name, "info": made.info},
        "joined": joined.team,
        "listed": [seen(team) for team in listed.root],
        "read": seen(read),
        "worker_team": worker.team.name if worker.team else None,
        "changed": {"id": str(changed.id_), "name": changed.name, "info": changed.info},
        "deleted": {"id": deleted.deleted_id, "name": deleted.deleted_name},
        "team_after_delete": after.team.name if after.team else None,
    }


def documents() -> dict[str, Any]:
    """The news and the terms, privacy policy and sponsors, each parsed by its SDK model."""
    client = AIHordeAPIManualClient()
    news = _send(client, NewsRequest(), NewsResponse)
    read = {
        name: _send(client, request, HordeDocument)
        for name, request in (
            ("terms", AIHordeGetTermsRequest()),
            ("privacy", AIHordeGetPrivacyPolicyRequest()),
            ("sponsors", AIHordeGetSponsorsRequest()),
        )
    }
    return {
        "news": [piece.model_dump() for piece in news],
        "documents": {name: {"html": doc.html, "markdown": doc.markdown} for name, doc in read.items()},
    }


def _refused_by_the_sdks_model(response: Any) -> tuple[list[str], Any]:
    """The fields horde_sdk's own model refused in a 200 answer (`field:pydantic error type`),
    and the answer as sent.

    Its `ResponseModelMessage` (0.33.3) declares `expiry` an integer (the input's hours), where
    the AI Horde answers an RFC 822 date, and has no `id`, `user_id` or `created`, which the AI
    Horde answers: its strict mode refuses the AI Horde's own answer. Anything else fails."""
    if not isinstance(response, RequestErrorResponse):
        raise RoundtripError(f"the SDK's model took an answer it has no fields for: {response!r}")
    exception = response.object_data.get("exception")
    if exception is None or not hasattr(exception, "errors"):
        raise RoundtripError(f"not the SDK's model refusing a 200 answer: {response!r}")
    refused = sorted({f"{error['loc'][-1]}:{error['type']}" for error in exception.errors()})
    return refused, response.object_data["raw_response"]


def workermessages(moderator: str, owner: str, worker_id: str) -> dict[str, Any]:
    """A moderator's and an owner's messages to the owner's worker through the SDK's four
    requests: sent, listed, read, deleted. The delete's answer is parsed by its model; the others'
    as far as the SDK's model allows (`_refused_by_the_sdks_model`)."""
    client = AIHordeAPIManualClient()
    body = {"worker_id": worker_id, "message": "Check your backend.", "origin": "Mods", "expiry": 2}
    sent, by_moderator = _refused_by_the_sdks_model(
        client.submit_request(CreateWorkerMessageRequest(apikey=moderator, **body), ResponseModelMessage)
    )
    own, by_owner = _refused_by_the_sdks_model(
        client.submit_request(
            CreateWorkerMessageRequest(apikey=owner, **{**body, "message": "A note"}), ResponseModelMessage
        )
    )
    listed, messages = _refused_by_the_sdks_model(
        client.submit_request(AllWorkerMessagesRequest(apikey=owner), ResponseModelMessages)
    )
    read, one = _refused_by_the_sdks_model(
        client.submit_request(SingleWorkerMessageRequest(id=by_moderator["id"]), ResponseModelMessage)
    )
    deleted = _send(
        client, DeleteWorkerMessageRequest(apikey=owner, id=by_owner["id"]), DeleteWorkerMessageResponse
    )
    refused = client.submit_request(
        DeleteWorkerMessageRequest(apikey=owner, id=by_moderator["id"]), DeleteWorkerMessageResponse
    )
    return {
        "refused_fields": {"sent": sent, "own": own, "listed": listed, "read": read},
        "by_moderator": by_moderator,
        "by_owner": by_owner,
        "listed": messages,
        "read": one,
        "deleted": deleted.message,
        "owner_deleting_the_moderators": getattr(refused, "rc", None),
    }


def blockworker(moderator: str, worker_id: str) -> dict[str, Any]:
    """A moderator times out a worker's address and lifts it, each answer parsed by its model."""
    client = AIHordeAPIManualClient()
    blocked = _send(
        client,
        BlockWorkerIPAddressRequest(apikey=moderator, worker_id=worker_id, days=3),
        BlockWorkerIPAddressResponse,
    )
    lifted = _send(
        client,
        DeleteWorkerIPAddressRequest(apikey=moderator, worker_id=worker_id),
        DeleteWorkerIPAddressResponse,
    )
    return {"blocked": blocked.message, "lifted": lifted.message}


def _changed(response: ModifyUserResponse) -> dict[str, Any]:
    """The fields a ModifyUser answer set (the SDK's model has all of them, None when not sent)."""
    return response.model_dump(exclude_none=True, exclude_unset=True)


def moderators(moderator: str, owner: str, owner_id: str) -> dict[str, Any]:
    """Every call horde_sdk 0.33.3 makes for users and awards (it has no request for
    `/v2/status/modes`): the users list, by kudos and by age; a moderator's and the account's own
    changes of it; an award; a stranger's change, refused. Each answer parsed by its model."""
    client = AIHordeAPIManualClient()
    by_kudos = _send(client, ListUsersDetailsRequest(page=1), ListUsersDetailsResponse)
    by_age = _send(client, ListUsersDetailsRequest(page=1, sort="age"), ListUsersDetailsResponse)
    moderated = _send(
        client,
        ModifyUserRequest(
            apikey=moderator,
            user_id=owner_id,
            trusted=True,
            concurrency=5,
            worker_invited=2,
            kudos=50,
            admin_comment="Runs a big box.",
            flagged=True,
        ),
        ModifyUserResponse,
    )
    reset = _send(
        client,
        ModifyUserRequest(apikey=moderator, user_id=owner_id, reset_suspicion=True),
        ModifyUserResponse,
    )
    own = _send(
        client,
        ModifyUserRequest(
            apikey=owner,
            user_id=owner_id,
            public_workers=True,
            contact="me@example.org",
            username="sdk-renamed",
        ),
        ModifyUserResponse,
    )
    awarded = _send(
        client,
        KudosAwardRequest(apikey=moderator, username=f"sdk-renamed#{owner_id}", amount=25),
        KudosAwardResponse,
    )
    refused = client.submit_request(
        ModifyUserRequest(apikey=owner, user_id=owner_id, trusted=False), ModifyUserResponse
    )
    me = _send(client, FindUserRequest(apikey=owner), UserDetailsResponse)
    return {
        "by_kudos": [user.username for user in by_kudos.root],
        "by_age": [user.username for user in by_age.root],
        "moderated": _changed(moderated),
        "reset": _changed(reset),
        "own": _changed(own),
        "awarded": awarded.awarded,
        "stranger_refused": getattr(refused, "rc", None),
        "me": {
            "username": me.username,
            "kudos": me.kudos,
            "trusted": me.trusted,
            "flagged": me.flagged,
            "concurrency": me.concurrency,
            "worker_invited": me.worker_invited,
            "contact": me.contact,
        },
    }


def styles(creator: str, requester: str, worker_key: str, model: str) -> dict[str, Any]:
    """A text style of the trusted account `creator` and a collection of it, through every
    style and collection request the SDK models: made, listed, read by id and by name, used by
    `requester`'s text request (which `worker_key`'s worker pops), changed, and deleted. Every
    answer is parsed by its model, but the collections' (`_refused_by_the_sdks_model`)."""
    client = AIHordeAPIManualClient()
    params = ModelStyleInputParamsKobold(max_length=64, max_context_length=1024, temperature=0.7)
    made = _send(
        client,
        CreateStyleTextRequest(
            apikey=creator,
            name="sdk-noir",
            info="Dark, brooding vibes",
            prompt="Noir: {p}",
            params=params,
            models=[model],
            tags=["dark"],
        ),
        ModifyStyleTextResponse,
    )
    style_id = made.id_
    listed = _send(client, AllStylesTextRequest(tag="dark"), AllStylesTextResponse)
    by_id = _send(client, SingleStyleTextByIDRequest(style_id=style_id), StyleKobold)
    by_name = _send(client, SingleStyleTextByNameRequest(style_name="sdk-noir"), StyleKobold)
    changed = _send(
        client,
        ModifyStyleTextRequest(
            apikey=creator, style_id=style_id, name="sdk-noir", prompt="Noir, again: {p}", params=params
        ),
        ModifyStyleTextResponse,
    )
    collected = _send(
        client,
        CreateCollectionRequest(apikey=creator, name="sdk moods", info="Moods.", styles=[style_id]),
        CreateCollectionResponse,
    )
    collection_id = collected.id_
    updated = _send(
        client,
        UpdateCollectionRequest(
            apikey=creator, collection_id=collection_id, name="sdk moods 2", styles=["sdk-noir"]
        ),
        UpdateCollectionResponse,
    )
    refused = {}
    answers = {}
    for name, request, expected in (
        ("listed", AllCollectionsRequest(), AllCollectionsResponse),
        ("by_id", CollectionByIDRequest(collection_id=collection_id), ResponseModelCollection),
    ):
        refused[name], answers[name] = _refused_by_the_sdks_model(client.submit_request(request, expected))
    try:  # its client cannot send this one (see the quirks above)
        client.submit_request(CollectionByNameRequest(collection_name="sdk moods 2"), ResponseModelCollection)
        by_name_unsent = None
    except RuntimeError as exc:
        by_name_unsent = str(exc).split("!")[0]

    pop = TextGenerateJobPopRequest(
        apikey=worker_key, name=f"sdk-styled-{os.getpid()}", models=[model], max_length=512
    )
    _send(client, pop, TextGenerateJobPopResponse)  # checks the worker in with its model
    asked = _ask_text(client, requester, models=[], style=collection_id)
    job = _send(client, pop, TextGenerateJobPopResponse)
    author = _send(client, FindUserRequest(apikey=creator), UserDetailsResponse)

    deleted_collection = _send(
        client, DeleteCollectionRequest(apikey=creator, collection_id=collection_id), DeleteCollectionResponse
    )
    deleted_style = _send(
        client, DeleteStyleTextRequest(apikey=creator, style_id=style_id), DeleteStyleTextResponse
    )
    gone = client.submit_request(SingleStyleTextByIDRequest(style_id=style_id), StyleKobold)

    def seen(style: StyleKobold) -> dict[str, Any]:
        return {
            "id": style.id_,
            "name": style.name,
            "prompt": style.prompt,
            "models": style.models,
            "tags": style.tags,
            "creator": style.creator,
            "params": style.params.model_dump(exclude_unset=True) if style.params else None,
        }

    return {
        "made": {"id": style_id, "message": made.message},
        "listed": [seen(style) for style in listed.root],
        "by_id": seen(by_id),
        "by_name": seen(by_name),
        "changed": {"id": changed.id_, "message": changed.message},
        "collected": {"id": collection_id, "message": collected.message},
        "updated": {"id": updated.id_, "message": updated.message},
        "collection_refused_fields": refused,
        "collection_answers": answers,
        "collection_by_name_unsent": by_name_unsent,
        "request": {"id": str(asked.id_), "kudos": asked.kudos},
        "job": {
            "id": job.id_ and str(job.id_),
            "model": job.model,
            "prompt": job.payload.prompt,
            "max_length": job.payload.max_length,
            "temperature": job.payload.temperature,
        },
        "author": {
            "customizer": author.customizer,
            "styles": [{"name": s.name, "id": s.id_, "type": str(s.type_)} for s in author.styles or []],
            "styled": author.kudos_details.styled,
            "style_records": author.records.style.text if author.records and author.records.style else None,
        },
        "deleted": [deleted_collection.message, deleted_style.message],
        "after_delete": getattr(gone, "rc", None),
    }


def main() -> int:
    try:
        base_url = os.environ.get("AI_HORDE_URL", "")
        if not base_url.endswith("/api/"):
            raise RoundtripError(f"AI_HORDE_URL must end with /api/ (trailing slash), got {base_url!r}")
        if endpoints.AI_HORDE_BASE_URL != base_url:
            raise RoundtripError(
                f"horde_sdk targets {endpoints.AI_HORDE_BASE_URL!r}, not {base_url!r}"
                " (is AI_HORDE_DEV_URL set?)"
            )
        if sys.argv[1:2] == ["fleet"]:
            result = fleet(json.loads(sys.argv[2]))
        elif sys.argv[1:2] == ["sharedkeys"]:
            result = sharedkeys(sys.argv[2])
        elif sys.argv[1:2] == ["teams"]:
            result = teams(sys.argv[2], sys.argv[3], sys.argv[4])
        elif sys.argv[1:2] == ["blockworker"]:
            result = blockworker(*sys.argv[2:4])
        elif sys.argv[1:2] == ["workermessages"]:
            result = workermessages(*sys.argv[2:5])
        elif sys.argv[1:2] == ["moderators"]:
            result = moderators(*sys.argv[2:5])
        elif sys.argv[1:2] == ["documents"]:
            result = documents()
        elif sys.argv[1:2] == ["styles"]:
            result = styles(*sys.argv[2:6])
        else:
            result = run(
                base_url, _arg(1, "HORDE_REQUESTER_KEY"), _arg(2, "HORDE_WORKER_KEY"), _arg(3, "HORDE_MODEL")
            )
    except Exception as exc:  # any failure, the SDK's parse errors included, fails the run
        print(f"horde_sdk roundtrip failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
