"""The horde text routes: parse, call one service, shape the answer."""

import asyncio
import functools
import time
from typing import Any
from uuid import UUID

from django.conf import settings
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from hordeops import api, clock, errors, ratelimit
from hordeops.api import validated_body
from hordeops.parsing import MAX_DIGITS, ascii_int
from hordeops.replica import replica_reads
from hordeops.serializers import APIKEY, APIKEY_AUTH, COUNT, OBJECT_LIST, keyed_route
from jobs import deadlines, discovery, services, styles, waits
from jobs import serializers as s
from jobs.models import TextRequest
from jobs.schema import DEADLINE
from jobs.status import request_status
from kudos import rates
from workers import messages, shared_keys
from workers.declaration import CAPABILITIES, WorkerDeclaration
from workers.services import authenticate

# 429: the rate limits, on every route but the worker routes (there: a bad key's only).
LIMITED = {429: s.HordeErrorOutput}
# 408 and 413: the body's bounds.
ERRORS = {code: s.HordeErrorOutput for code in (400, 401, 403, 404, 408, 409, 413, 429, 503)}


def _account(request: Request):
    return authenticate(api_key=request.headers.get("apikey"))


def _worker_post(serializer_class, request: Request) -> tuple[str | None, Any]:
    """A worker route's API key and its body, validated and built by its serializer
    (`HotInput.validated`).

    The service checks the key in its own first statement (a round trip saved on the hottest
    routes). A body refused here is refused for a bad key first, 401 before 400, as when the
    key was checked before the body was read.
    """
    api_key = request.headers.get("apikey")
    try:
        return api_key, serializer_class.validated(request.data)
    except Exception:
        authenticate(api_key=api_key)
        raise


class TextAsyncView(APIView):
    @extend_schema(
        operation_id="text_async",
        parameters=[APIKEY, DEADLINE],
        auth=APIKEY_AUTH,
        request=s.TextAsyncInput,
        # 504: the deadline header's budget ran out before the request was queued.
        responses={202: s.TextAsyncOutput, 200: s.TextAsyncOutput, 504: s.HordeErrorOutput, **ERRORS},
    )
    def post(self, request: Request) -> Response:
        header = deadlines.header_budget(request)
        with deadlines.connection_wait(header):
            return self._queue(request, header)

    def _queue(self, request: Request, header: deadlines.Budget | errors.DomainError | None) -> Response:
        # A suspended account is refused by the request's admission, with the horde's rules;
        # a shared key is its owner's account, spending through the key.
        account, shared_key = shared_keys.key_holder(api_key=request.headers.get("apikey"))
        budget = deadlines.for_account(header, account)
        styles.refuse_unserved(request.data, styles.UNSERVED_REQUEST_FIELDS)
        data = validated_body(s.TextAsyncInput, request)
        if not data["prompt"]:
            raise errors.MissingPrompt()
        # The deadline bounds the request's life: it expires when the budget runs out.
        deadline_at = budget.deadline_at(clock.now()) if budget else None
        params = dict(data.get("params") or {"n": 1, "max_length": 80, "max_context_length": 2048})
        styled = styles.apply_style(
            data.get("style"), prompt=data["prompt"], params=params, models=data["models"], requester=account
        )
        queued = services.create_text_request(
            account=account,
            address=ratelimit.request_address(request),
            prompt=styled.prompt,
            params=styled.params,
            models=styled.models,
            workers=data["workers"],
            worker_blacklist=data["worker_blacklist"],
            trusted_workers=data["trusted_workers"],
            slow_workers=data["slow_workers"],
            allow_downgrade=data["allow_downgrade"],
            dry_run=data["dry_run"],
            deadline_at=deadline_at,
            shared_key=shared_key,
            webhook=data.get("webhook"),
            validated_backends=data["validated_backends"],
            disable_batching=data["disable_batching"],
            proxied_account=data["proxied_account"],
            style_author=styled.author_id,
        )
        styles.count_use(styled, queued.request)
        if queued.request is None:
            return Response({"kudos": queued.kudos}, status=200)
        answer = {"id": queued.request.id, "kudos": queued.kudos}
        if queued.warning:
            answer["message"] = queued.warning
        return Response(answer, status=202)


def _request_id(raw: str) -> UUID:
    # Parsed here rather than by the URL converter, which only matches lowercase UUIDs.
    try:
        return UUID(raw)
    except ValueError:
        raise errors.RequestNotFound() from None


REQUEST_ID = OpenApiParameter("request_id", OpenApiTypes.UUID, OpenApiParameter.PATH)


def _status_route(operation_id: str):
    return extend_schema(
        operation_id=operation_id,
        parameters=[REQUEST_ID],
        responses={200: s.RequestStatusOutput, 404: s.HordeErrorOutput, **LIMITED},
    )


def _status_after(service, raw_id: str) -> Response:
    """The request's status once `service` has found it, or cancelled it."""
    now = clock.now()
    return Response(request_status(service(request_id=_request_id(raw_id), now=now), now=now))


class TextStatusView(APIView):
    @_status_route("text_status")
    def get(self, request: Request, request_id: str) -> Response:
        return _status_after(services.current_request, request_id)

    @_status_route("text_cancel")
    def delete(self, request: Request, request_id: str) -> Response:
        return _status_after(services.cancel_request, request_id)


# The payload keys the AI Horde's pop always carries, with its defaults, when the request did
# not set them (its marshalling fills them in: `ModelPayloadKobold`); an empty pop carries them
# too, with `max_length` and `max_context_length`.
PAYLOAD_DEFAULTS = {"min_p": 0.0, "smoothing_factor": 0.0, "dynatemp_range": 0.0, "dynatemp_exponent": 1.0}
EMPTY_PAYLOAD = {**PAYLOAD_DEFAULTS, "max_context_length": 2048, "max_length": 80}
# hordeops' own sampling params (OpenAI's, which the AI Horde lacks): a chat worker's alone.
CHAT_WORKER_PARAMS = ("frequency_penalty", "presence_penalty", "logit_bias")


def _pop_answer(job: services.PoppedJob | services.EmptyPop, now, *, chat: bool) -> dict:
    """The pop's answer in the AI Horde's shape. A worker that pops with `chat: true` also gets
    `kind`, `lease`, `deadline_ms` and (a text completion's job) `streamed` when it has a job,
    never as nulls: a legacy worker sees exactly the AI Horde's keys (horde_sdk's strict mode
    refuses any other)."""
    if isinstance(job, services.EmptyPop):
        return {
            "payload": dict(EMPTY_PAYLOAD),
            "id": None,
            "ids": [],
            "model": None,
            "ttl": None,
            "skipped": job.skipped,
            "messages": messages.for_worker(job.worker_id, now),
            "softprompt": None,
            "extra_source_images": None,
        }
    first = job.first
    text_request = job.request
    payload = {
        **PAYLOAD_DEFAULTS,
        **text_request.params,
        "prompt": text_request.prompt,
        "n": 1,
        "max_length": text_request.max_length,
        "max_context_length": text_request.max_context_length,
    }
    answer = {
        "payload": payload,
        "id": first.id,
        "ids": [g.id for g in job.generations],
        "model": first.model,
        "ttl": settings.TEXT_JOB_LEASE_SECONDS,
        "skipped": {},
        "messages": messages.for_worker(first.worker_id, now),
        "softprompt": None,
        "extra_source_images": None,
    }
    if not chat:
        for name in CHAT_WORKER_PARAMS:
            payload.pop(name, None)
        return answer
    if text_request.kind == TextRequest.Kind.CHAT:
        payload["messages"] = text_request.messages
    answer["kind"] = text_request.kind
    if text_request.followed:
        # A text completion's requester reads the output as it comes: post progress, as for a chat.
        answer["streamed"] = True
    answer["lease"] = {
        "expires_at": first.lease_expires_at,
        "cap_seconds": first.cap_seconds,
        "preparation_seconds": settings.TEXT_JOB_PREPARATION_SECONDS,
    }
    if text_request.deadline_at:
        # The requester's remaining budget, rounded down, for the worker to honour.
        remaining = text_request.deadline_at - now
        answer["deadline_ms"] = max(0, int(remaining.total_seconds() * 1000))
    return answer


class TextPopView(APIView):
    @keyed_route("text_pop", body=s.PopInput, answer=s.PopOutput, refusals=ERRORS)
    def post(self, request: Request) -> Response:
        api_key, declaration = _worker_post(s.PopInput, request)
        started = time.monotonic()
        now = clock.now()
        address = ratelimit.request_address(request)
        job = services.pop_generation(now=now, api_key=api_key, declaration=declaration, address=address)
        # Already in PopOutput's shape (the schema): rendered as is, without the serializer's
        # field-by-field copy on the hottest route. DRF's encoder writes UUIDs and UTC times
        # exactly as the serializer would.
        response = Response(_pop_answer(job, now, chat=declaration.chat))
        if declaration.wait_seconds and isinstance(job, services.EmptyPop) and job.may_wait:
            # The ASGI handler finishes it on the event loop (`jobs.waits`); under any other
            # handler (WSGI, the test client) this empty answer goes at once.
            pop = functools.partial(_pop_again, api_key=api_key, declaration=declaration, address=address)
            ends = started + declaration.wait_seconds
            header = deadlines.header_budget(request)
            if isinstance(header, deadlines.Budget):  # a client's deadline ends the wait too
                ends = min(ends, header.until)
            response.finish_on_loop = functools.partial(
                _answer_waiting, response, declaration, pop, since=started, ends=ends, worker_id=job.worker_id
            )
        return response


def _pop_again(*, api_key: str | None, declaration: WorkerDeclaration, address: str) -> tuple[bool, Response]:
    """A waiting pop's next pop, on a database thread: whether it took a job, and its answer
    (a refusal in the horde's shape). The lease starts now, at the answer."""
    try:
        now = clock.now()
        job = services.pop_generation(now=now, api_key=api_key, declaration=declaration, address=address)
    except Exception as exc:
        refusal = api.horde_exception_handler(exc, {})
        if refusal is None:
            raise
        return True, refusal
    return isinstance(job, services.PoppedJob), Response(_pop_answer(job, now, chat=declaration.chat))


async def _answer_waiting(
    response: Response,
    declaration: WorkerDeclaration,
    pop,
    receive,
    *,
    since: float,
    ends: float,
    worker_id: UUID | None,
) -> bool:
    """Wait for a job (`jobs.waits.wait_for_job`) and put what the last pop found in
    `response`, whose headers the middleware has written. False: the client left."""
    waiter = waits.Waiter(
        models=frozenset(declaration.models),
        chat=declaration.chat,
        max_length=declaration.max_length,
        max_context_length=declaration.max_context_length,
        worker_id=str(worker_id or ""),
        capabilities=frozenset(name for name in CAPABILITIES if getattr(declaration, name)),
        validated=rates.is_validated(declaration.bridge_agent),
    )
    client_gone = asyncio.ensure_future(waits.client_left(receive))
    try:
        answer = await waits.wait_for_job(waiter, since=since, ends=ends, pop=pop, client_gone=client_gone)
    finally:
        client_gone.cancel()
    if answer is waits.GONE:
        return False
    if answer is not None:
        content = response.accepted_renderer.render(
            answer.data, response.accepted_media_type, response.renderer_context
        )
        response.status_code = answer.status_code
        for name, value in answer.items():
            if name.lower() not in ("content-type", "content-length"):
                response[name] = value
        response.content = content
        response["Content-Length"] = str(len(content))
    return True


class TextProgressView(APIView):
    @keyed_route("text_progress", body=s.ProgressInput, answer=s.ProgressOutput, refusals=ERRORS)
    def post(self, request: Request) -> Response:
        api_key, arguments = _worker_post(s.ProgressInput, request)
        result = services.record_progress(api_key=api_key, **arguments)
        return Response(s.ProgressOutput(result).data)


class TextSubmitView(APIView):
    @keyed_route("text_submit", body=s.SubmitInput, answer=s.SubmitOutput, refusals=ERRORS)
    def post(self, request: Request) -> Response:
        api_key, arguments = _worker_post(s.SubmitInput, request)
        reward = services.submit_generation(api_key=api_key, **arguments)
        return Response({"reward": reward})


# --- discovery: the AI Horde's status and statistics routes (jobs/discovery.py) ------------------


def _count_param(request: Request, name: str) -> int | None:
    raw = request.query_params.get(name)
    if raw is None:
        return None
    count = ascii_int(raw)
    if count is None:
        raise errors.BadRequest(f"{name} must be a whole number of at most {MAX_DIGITS} digits.")
    return count


class ModelsStatusView(APIView):
    @replica_reads
    @extend_schema(
        operation_id="status_models",
        parameters=[
            OpenApiParameter(
                "type", str, enum=["image", "text"], description="image (the AI Horde's default) or text"
            ),
            OpenApiParameter("min_count", COUNT),
            OpenApiParameter("max_count", COUNT),
            OpenApiParameter("model_state", str, enum=["known", "custom", "all"]),
        ],
        responses={200: OBJECT_LIST, 400: s.HordeErrorOutput, **LIMITED},
    )
    def get(self, request: Request) -> Response:
        kind = request.query_params.get("type", "image")
        state = request.query_params.get("model_state", "all")
        if kind not in ("image", "text"):
            raise errors.BadRequest("type must be image or text.")
        if state not in ("known", "custom", "all"):
            raise errors.BadRequest("'model_state' needs to be one of ['known', 'custom', 'all']")
        min_count, max_count = _count_param(request, "min_count"), _count_param(request, "max_count")
        if state == "custom":
            return Response([])  # hordeops has no model reference: every model counts as known
        return Response(
            discovery.models_status(now=clock.now(), kind=kind, min_count=min_count, max_count=max_count)
        )


class ModelStatusView(APIView):
    # 404: a name the path cannot hold (a line break ends it).
    @replica_reads
    @extend_schema(
        operation_id="status_model", responses={200: OBJECT_LIST, 404: s.HordeErrorOutput, **LIMITED}
    )
    def get(self, request: Request, model_name: str) -> Response:
        return Response(discovery.model_status(model_name, now=clock.now()))


class PerformanceView(APIView):
    @replica_reads
    @extend_schema(operation_id="status_performance", responses={200: OpenApiTypes.OBJECT, **LIMITED})
    def get(self, request: Request) -> Response:
        return Response(discovery.performance(now=clock.now()))


class TextTotalsView(APIView):
    @replica_reads
    @extend_schema(operation_id="stats_text_totals", responses={200: OpenApiTypes.OBJECT, **LIMITED})
    def get(self, request: Request) -> Response:
        return Response(discovery.text_totals(now=clock.now()))


class TextModelStatsView(APIView):
    @replica_reads
    @extend_schema(operation_id="stats_text_models", responses={200: OpenApiTypes.OBJECT, **LIMITED})
    def get(self, request: Request) -> Response:
        return Response(discovery.text_models(now=clock.now()))
