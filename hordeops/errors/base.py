"""Domain errors: each has a stable code and an HTTP status. The machinery, and the errors of
the requests' and generations' flow; who may do what is `hordeops.errors.access`.

Services raise these; each API family maps them to its own error shape in one place
(`hordeops.api` for the horde routes). Each error names its code and status (and any
`retry-after`) in its class line, `class NotFound(DomainError, code="NotFound", status=404)`,
and its message in `default_message`; a variant of another error keeps what it does not name.
"""

import math


class DomainError(Exception):
    code = "BadRequest"
    status = 400
    default_message = "The request could not be processed."
    # Seconds after which the same call may succeed: sent as `retry-after` in every shape.
    retry_after: int | None = None
    # The methods the route serves, for a 405: sent as `allow` (RFC 9110) in every shape.
    allow: tuple[str, ...] = ()

    def __init_subclass__(
        cls, *, code: str | None = None, status: int | None = None, retry_after: int | None = None, **kwargs
    ) -> None:
        super().__init_subclass__(**kwargs)
        if code is not None:
            cls.code = code
        if status is not None:
            cls.status = status
        if retry_after is not None:
            cls.retry_after = retry_after

    def __init__(self, message: str | None = None, **extra: object) -> None:
        self.message = message or self.default_message
        # Machine-readable details that an error shape may carry beside the message.
        self.extra = extra
        super().__init__(self.message)


def response_headers(err: DomainError, status: int) -> dict[str, str]:
    """The headers every error shape adds: whether and when a client may send it again."""
    headers = {}
    if status in (502, 503, 504):
        # The SDKs retry every 5xx unless told not to; resending would queue a new job.
        headers["x-should-retry"] = "false"
    if err.retry_after is not None:
        headers["retry-after"] = str(err.retry_after)
    if err.allow:
        headers["allow"] = ", ".join(err.allow)
    return headers


class BadRequest(DomainError, code="BadRequest", status=400):
    pass


class UnreadableAddress(BadRequest):
    default_message = (
        "The client address could not be read: the horde's proxy forwarded something that is not an "
        "IP address (X-Forwarded-For). Please tell the horde's operator."
    )


class BadWebhook(BadRequest):
    # The AI Horde's words for a hook that is not https (its other refusals are hordeops').
    default_message = "webhooks need to point to an https endpoint."


class NotFound(DomainError, code="NotFound", status=404):
    default_message = "Not found."


class InternalError(DomainError, code="InternalError", status=500):
    default_message = "Internal server error."


class NulByteInPayload(DomainError, code="NulByteInPayload", status=400):
    default_message = "The payload contains a NUL byte, which is not accepted."


class InvalidJSON(DomainError, code="InvalidJSON", status=400):
    default_message = "The body is not valid JSON in UTF-8."


class PayloadTooLarge(DomainError, code="PayloadTooLarge", status=413):
    default_message = "The body is larger than 1 MiB."


class BodyTimeout(DomainError, code="RequestTimeout", status=408):
    default_message = "The request body did not arrive in time."


class HeadTimeout(DomainError, code="RequestTimeout", status=408):
    default_message = "The request line and headers did not arrive in time."


class HeadTooLarge(DomainError, code="RequestHeaderFieldsTooLarge", status=431):
    default_message = "The request line and headers are larger than this server takes."


class TooManyConnections(DomainError, code="ServiceUnavailable", status=503, retry_after=1):
    default_message = "This server holds as many connections as it may: try again shortly."


class KudosUpfront(DomainError, code="KudosUpfront", status=403):
    """A request that needs its kudos upfront, from an account that cannot cover it (the AI
    Horde's rc and words)."""

    def __init__(self, *, tokens: int, required: object) -> None:
        super().__init__(
            f"Due to heavy demand, for requests over {tokens} tokens, the client needs to already "
            f"have the required kudos. This request requires {required} kudos to fulfil.",
            tokens=tokens,
        )


class KudosValidationError(DomainError, code="KudosValidationError", status=400):
    """A kudos transfer refused, with the AI Horde's rc for why (`InvalidTargetUsername`,
    `KudosTransferNotEnough`, `IdempotencyKeyConflict`, ...)."""

    def __init__(self, message: str, *, rc: str) -> None:
        self.code = rc
        super().__init__(message)


class TooManyPrompts(DomainError, code="TooManyPrompts", status=429, retry_after=5):
    """The account already has as many waiting or running requests as it may (the AI Horde's rc)."""

    refusal = "waiting_requests"

    def __init__(self, *, count: int, limit: int) -> None:
        super().__init__(
            f"Parallel requests ({count}) exceeded user limit ({limit}). "
            "Please try again later or request to increase your concurrency."
        )


class RateLimited(DomainError, code="RateLimited", status=429):
    """A key or a client address sending faster than its token bucket refills."""

    def __init__(self, *, wait_seconds: float, refusal: str = "rate_limit") -> None:
        self.retry_after = max(1, math.ceil(wait_seconds))
        self.refusal = refusal  # which limit: `hordeops.metrics.REFUSAL_REASONS`
        super().__init__(f"Too many requests from this key or address: try again in {self.retry_after} s.")


class InvalidAPIKey(DomainError, code="InvalidAPIKey", status=401):
    default_message = "No user matching sent API Key. Have you remembered to register?"


class WrongCredentials(DomainError, code="WrongCredentials", status=403):
    default_message = "Wrong credentials to submit as this worker."


class AnonForbiddenWorker(DomainError, code="AnonForbiddenWorker", status=403):
    default_message = "Anonymous is not allowed to own workers."


class WorkerMaintenance(DomainError, code="WorkerMaintenance", status=403):
    default_message = "This worker has been put into maintenance mode by its owner."


class UnknownModel(DomainError, code="UnknownModel", status=400):
    default_message = "No worker serves any of the requested models."


class NoValidatedBackends(DomainError, code="NoValidatedBackends", status=400):
    default_message = (
        "This horde validates no worker bridge (VALIDATED_BRIDGE_AGENTS is empty), so no worker "
        "could ever serve a request with validated_backends: send it without."
    )


class TokenOverflow(DomainError, code="TokenOverflow", status=400):
    default_message = "max_context_length must be at least max_length."


class MissingPrompt(DomainError, code="MissingPrompt", status=400):
    default_message = "The prompt cannot be empty."


class WorkerNotFound(DomainError, code="WorkerNotFound", status=404):
    default_message = "No worker with that id."


class RequestNotFound(DomainError, code="RequestNotFound", status=404):
    default_message = "Request not found."


class InvalidJobID(DomainError, code="InvalidJobID", status=404):
    default_message = "Processing Generation with this ID was not found."


class DuplicateGen(DomainError, code="DuplicateGen", status=400):
    default_message = "This generation has already been submitted."


class AbortedGen(DomainError, code="AbortedGen", status=400):
    default_message = "This generation took too long to process and has been aborted."


class GenerationCancelled(DomainError, code="GenerationCancelled", status=409):
    default_message = (
        "This generation was cancelled by its requester or its deadline. "
        "It does not count against the worker."
    )


class OutputTooLong(DomainError, code="OutputTooLong", status=400):
    default_message = "The output is longer than this job allows."


class MethodNotAllowed(DomainError, code="MethodNotAllowed", status=405):
    default_message = "This route does not serve that method."

    def __init__(self, message: str | None = None, *, allowed: tuple[str, ...]) -> None:
        super().__init__(message)
        self.allow = allowed


class ProgressOutOfOrder(DomainError, code="ProgressOutOfOrder", status=409):
    default_message = "This progress post skips a seq."


class ServiceUnavailable(DomainError, code="ServiceUnavailable", status=503):
    default_message = "The horde cannot reach its database or Redis right now."


class StreamStalled(Exception):
    """A chat stream's requester stopped taking its events (STREAM_SEND_TIMEOUT_SECONDS,
    STREAM_QUEUE_MAX_BYTES): the stream ends as if it had left, with nothing more sent."""


class ServerStopping(ServiceUnavailable):
    """The web process serving a chat request is stopping (a deploy or a restart)."""

    default_message = (
        "The horde's web process serving this request is restarting. The request is cancelled "
        "and not charged: send it again."
    )


class DatabaseLost(ServiceUnavailable):
    """PostgreSQL stopped answering while a chat request waited or streamed."""

    default_message = "The horde lost its database. The request is cancelled: nothing of it will be served."


class ProtocolValidationError(DomainError, code="ValidationError", status=400):
    """A chat request body that does not validate; `param` names the field."""

    openai_code = "invalid_request"

    def __init__(self, message: str | None = None, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ReplyTooLong(ProtocolValidationError, code="ReplyTooLong", status=400):
    """A /v1 request for a longer reply than any online worker of its model accepts: refused
    at once, for no worker could take it and it would wait out its life in silence."""

    openai_code = "max_tokens_too_large"


class CapabilityNotServed(ProtocolValidationError, code="CapabilityNotServed", status=404):
    """A /v1 request that needs tool calls or structured output for a model whose online
    workers do not declare it: refused at once, as a model nobody serves is, rather than left
    to wait out its life (`param`: the field that needs it)."""

    openai_code = "capability_not_served"


class ReplyBreaksJob(DomainError, code="ReplyBreaksJob", status=400):
    """A worker's submit of tool calls whose arguments are not a JSON object, or of a reply
    that is not the JSON its job asked for: the job was given back for another worker, and
    counts against this one as a give-back."""

    default_message = "The reply breaks what its job asked for; the job was given to another worker."


class ReplyFailed(DomainError, code="ReplyFailed", status=400):
    """A chat request that ended without a reply; `openai_code` is its ending (`jobs.models.Ending`)."""

    def __init__(self, message: str, *, status: int, openai_code: str) -> None:
        super().__init__(message)
        self.status = status
        self.openai_code = openai_code


class InvalidGenerationDeadline(DomainError, code="invalid_generation_deadline", status=400):
    """A malformed X-MultiLLM-Deadline-Ms header (docs/reference/generation_deadline.md)."""

    default_message = "X-MultiLLM-Deadline-Ms must be one integer from 1 to the horde's maximum."


class GenerationDeadlineExceeded(DomainError, code="generation_deadline_exceeded", status=504):
    """The requester's generation deadline ran out."""

    default_message = "The generation deadline was exceeded."


class UpstreamStreamInvalid(DomainError, code="upstream_stream_invalid", status=502):
    """Stream preflight found no output within its bounds, or the job ended first."""

    default_message = "The worker's stream delivered no output before the preflight bound or its end."
