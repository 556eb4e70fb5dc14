import uuid
from datetime import UTC, date, datetime, timedelta

from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import F, Func, Q, Sum
from django.db.models.functions import TruncDate
from django.utils import timezone

from kudos.models import ZERO, amount_field
from workers.models import Account, Worker


class SecondsAfter(Func):
    """`timestamp + interval '1 second' * seconds`, evaluated in PostgreSQL."""

    template = "(%(expressions)s)"
    arg_joiner = " + interval '1 second' * "
    output_field = models.DateTimeField()


def lease_end_sql(alias: str = "") -> str:
    """A generation's lease end in SQL (pop + job_ttl), as `SecondsAfter` writes it for the ORM:
    the one definition of the lapse test, `lease end < now`, for `GenerationQuerySet.stale`
    and the stale pass's own UPDATE alike."""
    prefix = f"{alias}." if alias else ""
    return SecondsAfter.template % {
        "expressions": SecondsAfter.arg_joiner.join((f"{prefix}popped_at", f"{prefix}job_ttl"))
    }


class TextRequestQuerySet(models.QuerySet["TextRequest"]):
    def queued(self) -> "TextRequestQuerySet":
        """Requests with work still to hand out; matches the `request_pop_queue` index."""
        return self.filter(state=TextRequest.State.ACTIVE, queued__gt=0)

    def relayed_active(self) -> "TextRequestQuerySet":
        """Active requests whose requester follows them on the relay (`TextRequest.relayed`)."""
        return self.filter(Q(kind=TextRequest.Kind.CHAT) | Q(followed=True), state=TextRequest.State.ACTIVE)


class Ending(models.TextChoices):
    """Why a request that did not finish ended: the one vocabulary of its `ending` column, its
    generations' settlement reason, the relay's failure events and the /v1 error codes."""

    NONE = "", "-"
    CANCELLED = "cancelled", "cancelled by its requester"
    DEADLINE = "generation_deadline_exceeded", "its deadline ran out"
    LIFETIME = "request_expired", "its lifetime ran out"
    RESTARTS = "too_many_restarts", "restarted too often"
    ABORTED = "generation_aborted", "its streaming worker stopped delivering"
    GIVEN_BACK = "generation_given_back", "its streaming worker gave it back"
    UPSTREAM_INVALID = "upstream_stream_invalid", "its stream gave no output in preflight"
    UNAVAILABLE = "ServiceUnavailable", "the horde lost Redis, its database or the requester's web process"


class TextRequest(models.Model):
    """A requester's text or chat request: `n` generations wanted of one prompt."""

    class Kind(models.TextChoices):
        TEXT = "text", "Text"
        CHAT = "chat", "Chat"

    class State(models.TextChoices):
        ACTIVE = "active", "Active"
        DONE = "done", "Done"
        FAULTED = "faulted", "Faulted"
        CANCELLED = "cancelled", "Cancelled"
        EXPIRED = "expired", "Expired"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # Indexed with its time (`request_by_account_recent`), which serves lookups by account too.
    account = models.ForeignKey(Account, on_delete=models.CASCADE, related_name="requests", db_index=False)
    kind = models.CharField(max_length=8, choices=Kind.choices, default=Kind.TEXT)
    state = models.CharField(max_length=10, choices=State.choices, default=State.ACTIVE)
    prompt = models.TextField()
    messages = models.JSONField(null=True, blank=True)
    params = models.JSONField(default=dict, blank=True)
    max_length = models.PositiveIntegerField(default=80)
    max_context_length = models.PositiveIntegerField(default=2048)
    requested_models = ArrayField(models.CharField(max_length=255), default=list, blank=True)
    allowed_workers = ArrayField(models.UUIDField(), default=list, blank=True)
    # `workers` blocks instead of allows (the AI Horde's worker_blacklist).
    worker_blacklist = models.BooleanField(default=False, db_default=False)
    trusted_workers = models.BooleanField(default=False)
    # False: not offered to workers below eligibility.SLOW_WORKER_TOKENS_PER_SECOND.
    slow_workers = models.BooleanField(default=True)
    # Only workers whose bridge is in VALIDATED_BRIDGE_AGENTS are offered it (the AI Horde's
    # `validated_backends`, false when not sent, as its parser has it).
    validated_backends = models.BooleanField(default=False, db_default=False)
    # A pop takes one of its jobs at a time, whatever `amount` it asks for (the AI Horde's
    # `disable_batching`, trusted accounts only when n > 1).
    disable_batching = models.BooleanField(default=False, db_default=False)
    # Who a service account sent it for (the AI Horde's `proxied_account`, kept as sent): its
    # own user, as moderators see it; "" when sent for no one.
    proxied_account = models.CharField(max_length=255, blank=True, default="", db_default="")
    priority = models.IntegerField(default=0)
    # The fair order across accounts: how many waiting or running requests the account had
    # when this one was queued. The pop takes lower ranks first, so an account's 1,000th
    # request waits behind every other account's first (docs/reference/horde_api.md).
    fair_rank = models.PositiveIntegerField(default=0, db_default=0)
    n = models.PositiveSmallIntegerField(default=1)
    queued = models.PositiveSmallIntegerField(default=1)
    finished = models.PositiveSmallIntegerField(default=0)
    restarts = models.PositiveSmallIntegerField(default=0)
    ending = models.CharField(max_length=40, choices=Ending.choices, blank=True, default="", db_default="")
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    # The first generation whose output was committed to a streaming requester (of `n`, each
    # is marked `Generation.streamed`); the abort of a committed one faults the request
    # instead of restarting it: there is no fallback after commit.
    stream_generation = models.UUIDField(null=True, blank=True)
    # When the requester's generation deadline runs out (X-MultiLLM-Deadline-Ms), if it set one.
    deadline_at = models.DateTimeField(null=True, blank=True)
    # A text request whose requester follows its relay stream (a /v1 text completion): its
    # ending is relayed as a chat request's is, though any worker of its model may take it.
    followed = models.BooleanField(default=False, db_default=False)
    # Its requester reads the reply as a stream (a /v1 request with `stream` true): the progress
    # post that brings a generation's first output commits the stream to it (`commit_stream`).
    stream = models.BooleanField(default=False, db_default=False)
    # The prompt's length in tokens, as the AI Horde counts it (four characters a token): the
    # context its generations' kudos are reckoned by (`kudos.earning`).
    prompt_tokens = models.PositiveIntegerField(default=0, db_default=0)
    # Kudos held for the request while it is active (its cost when queued), and what its
    # generations have cost so far: the held remainder is its hold (`kudos.models.Hold`), which
    # counts against what its account may spend and is released when the request ends.
    kudos_reserved = amount_field(default=ZERO, db_default=ZERO)
    kudos_spent = amount_field(default=ZERO, db_default=ZERO)
    # The worker that served the conversation this request continues (`jobs.affinity`): it
    # alone is offered the request until `preferred_until`, so that its engine reuses the
    # history it holds; then anyone is.
    preferred_worker = models.UUIDField(null=True, blank=True)
    preferred_until = models.DateTimeField(null=True, blank=True)
    # What its worker's model server must support (`workers.declaration.CAPABILITIES`): a
    # chat that sends tools, or asks for a JSON reply (`response_format`).
    needs_tools = models.BooleanField(default=False, db_default=False)
    needs_structured_outputs = models.BooleanField(default=False, db_default=False)
    # Where each of its generations is posted once done (`jobs.webhooks`); empty: nowhere.
    webhook = models.CharField(max_length=1024, blank=True, default="", db_default="")

    objects = TextRequestQuerySet.as_manager()

    class Meta:
        # The section holds chat requests too: "Requests", not "Text requests".
        verbose_name = "request"
        ordering = ("-created_at",)
        indexes = [
            # The pop's filter and order: only requests with work to hand out.
            models.Index(
                F("fair_rank").asc(),
                F("priority").desc(),
                F("created_at").asc(),
                name="request_pop_queue",
                condition=Q(state="active", queued__gt=0),
            ),
            # The same order with every key ascending, so that a row comparison is one index
            # range: the status counts the requests between two places in the queue on it.
            models.Index(
                F("fair_rank"),
                F("priority") * -1,
                F("created_at"),
                name="request_queue_position",
                condition=Q(state="active", queued__gt=0),
            ),
            models.Index(fields=["expires_at"], name="request_active_expiry", condition=Q(state="active")),
            # An account's waiting or running requests, counted against its bound.
            models.Index(fields=["account"], name="request_active_by_account", condition=Q(state="active")),
            # An account's recent requests (the accounts list's activity, the requests by account).
            models.Index(fields=["account", "created_at"], name="request_by_account_recent"),
        ]
        permissions = [("cancel_textrequest", "Can cancel requests")]
        constraints = [
            models.CheckConstraint(condition=Q(n__gte=1) & Q(n__lte=20), name="request_n_1_20"),
            models.CheckConstraint(condition=Q(queued__lte=F("n")), name="request_queued_within_n"),
            models.CheckConstraint(condition=Q(finished__lte=F("n")), name="request_finished_within_n"),
            models.CheckConstraint(
                condition=Q(queued=0) | Q(state="active"), name="request_only_active_is_queued"
            ),
            models.CheckConstraint(condition=Q(ending__in=Ending.values), name="request_ending_known"),
        ]

    def __str__(self) -> str:
        return str(self.id)

    @property
    def relayed(self) -> bool:
        """Whether its output and its ending go to a requester through the relay."""
        return self.kind == self.Kind.CHAT or self.followed

    @property
    def is_done(self) -> bool:
        return self.state != self.State.ACTIVE

    def is_past_expiry(self, now: datetime) -> bool:
        """Still active, though past its lifetime or deadline: expired by the next stale pass,
        or at once by whoever reads it (`jobs.services.endings.current_request`)."""
        return self.state == self.State.ACTIVE and self.expires_at <= now

    # A generation's output may be this many UTF-8 bytes per requested token, plus the
    # allowance: room for any tokenizer (English runs about 4 bytes a token, CJK 3 to 6), and
    # a bound on what one worker can make the horde relay and store (docs/reference/operations.md).
    OUTPUT_BYTES_PER_TOKEN = 16
    OUTPUT_ALLOWANCE_BYTES = 1024

    @property
    def output_limit_bytes(self) -> int:
        """The most output one generation of this request may relay or submit, in UTF-8 bytes."""
        return self.max_length * self.OUTPUT_BYTES_PER_TOKEN + self.OUTPUT_ALLOWANCE_BYTES


# The columns of a queued request's shape, in the order of the index `queued_model_shape`.
QUEUE_SHAPE = ("kind", "max_length", "max_context_length", "trusted_workers", "targeted")


class QueuedModel(models.Model):
    """A waiting request under one model it names ('' for a request that names none), in queue
    order: the pop walks these by index, a model at a time, so that its cost does not grow with
    requests for models the worker does not serve.

    Each row also carries the request's shape: the columns the offer rule reads that are the
    same for many requests (kind, lengths, trust, whether it names workers). A pop that meets
    many requests it may not take in a row walks the shapes instead (a skip scan of
    `queued_model_shape`), decides the rule once per shape, and walks only the shapes it may
    be offered (`jobs.sql.pop`).

    Kept by the database itself: a trigger on the requests table (migrations 0010 and 0012,
    `jobs_request_queued_models`) holds exactly the rows of requests that are active with jobs
    still queued, whichever statement changes them.
    """

    # Indexed by the unique constraint below, which the trigger's DELETE by request uses.
    request = models.ForeignKey(TextRequest, on_delete=models.CASCADE, related_name="+", db_index=False)
    model = models.CharField(max_length=255)
    # The request's queue order, copied (the trigger keeps them equal).
    fair_rank = models.PositiveIntegerField()
    priority = models.IntegerField()
    created_at = models.DateTimeField()
    # The request's shape, copied.
    kind = models.CharField(max_length=8, choices=TextRequest.Kind.choices)
    max_length = models.PositiveIntegerField()
    max_context_length = models.PositiveIntegerField()
    trusted_workers = models.BooleanField()
    targeted = models.BooleanField()  # names the workers it may go to

    class Meta:
        indexes = [
            models.Index(
                F("model"),
                F("fair_rank").asc(),
                F("priority").desc(),
                F("created_at").asc(),
                name="queued_model_order",
                # Always true: the walk that reads a model's rows in queue order says so, and so
                # only it uses this index. The walk of one shape's rows uses `queued_model_shape`,
                # which the planner, guessing that the shape's columns filter little, would
                # otherwise pass over for this smaller one and filter its rows a shape at a time.
                condition=Q(fair_rank__gte=0),
            ),
            models.Index(
                F("model"),
                *(F(field) for field in QUEUE_SHAPE),
                F("fair_rank").asc(),
                F("priority").desc(),
                F("created_at").asc(),
                name="queued_model_shape",
            ),
        ]
        constraints = [
            models.UniqueConstraint(fields=["request", "model"], name="queued_model_once"),
        ]

    def __str__(self) -> str:
        return f"{self.request_id} {self.model or '(any model)'}"


class GenerationQuerySet(models.QuerySet["Generation"]):
    def processing(self) -> "GenerationQuerySet":
        return self.filter(state=Generation.State.PROCESSING)

    def tokens_per_day(self, *, since: datetime) -> dict[date, int]:
        """The tokens these generations produced each UTC day from `since`, by when they finished."""
        rows = (
            self.filter(finished_at__gte=since, tokens__isnull=False)
            .annotate(day=TruncDate("finished_at", tzinfo=UTC))
            .order_by()
            .values("day")
            .annotate(total=Sum("tokens"))
        )
        return {row["day"]: row["total"] for row in rows}

    def over_capacity(self) -> "GenerationQuerySet":
        return self.filter(fallback_tier__gt=1)

    def stale(self, now: datetime) -> "GenerationQuerySet":
        """Processing generations whose lease (pop + job_ttl) ended before `now`."""
        return (
            self.processing()
            .alias(lease_end=SecondsAfter(F("popped_at"), F("job_ttl")))
            .filter(lease_end__lt=now)
        )


class Generation(models.Model):
    """One job handed to one worker: the lease lives here and in the worker's hands.

    The `db_default`s are for the pop's hand-written INSERT (jobs.sql.claim), which leaves
    those columns, and the nullable ones, to the database."""

    class State(models.TextChoices):
        PROCESSING = "processing", "Processing"
        DONE = "done", "Done"
        ABORTED = "aborted", "Aborted (stale)"
        FAULTED = "faulted", "Faulted (given back)"
        CANCELLED = "cancelled", "Cancelled"

    class Result(models.TextChoices):
        OK = "ok", "OK"
        CENSORED = "censored", "Censored"
        CSAM = "csam", "CSAM"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    request = models.ForeignKey(TextRequest, on_delete=models.CASCADE, related_name="generations")
    worker = models.ForeignKey(Worker, on_delete=models.CASCADE, related_name="generations")
    model = models.CharField(max_length=255, blank=True, default="")
    state = models.CharField(max_length=10, choices=State.choices, default=State.PROCESSING)
    popped_at = models.DateTimeField(default=timezone.now)
    # Seconds from the pop to the end of the lease: the record the stale pass reads. Not
    # whole seconds: a renewal ends the lease 150 s after its post, to the millisecond, and
    # rounding up to a second held a dropped job up to a second past its lease and pass.
    job_ttl = models.FloatField()
    cap_seconds = models.PositiveIntegerField()
    trusted_at_pop = models.BooleanField(default=False)
    renewals = models.PositiveIntegerField(default=0, db_default=0)
    # The output relayed so far (UTF-8 bytes), copied from the lease by each post that relays:
    # a lease Redis lost is rebuilt from it, so the output bound does not restart with Redis.
    relayed_bytes = models.PositiveIntegerField(default=0, db_default=0)
    # Its output was committed to a streaming requester as one of the request's choices
    # (`jobs.services.requests.commit_stream`): its abort faults the request, for that choice
    # cannot fall back to another worker once its requester has seen some of it.
    streamed = models.BooleanField(default=False, db_default=False)
    # The speed gate at the pop: the worker's capacity then, and its tier for this job
    # (1 capable, 2 only within its own cap, 3 not even then). Tiers 2 and 3 are the
    # over-capacity assignments; the generation's state is their outcome.
    capacity_at_pop = models.PositiveIntegerField(null=True, blank=True)
    fallback_tier = models.PositiveSmallIntegerField(default=1)
    capacity_limited = models.BooleanField(default=False)
    # For a generation cancelled in a worker's hands: usage confirmed or unknown, tokens
    # relayed, any reservation and the reason. Never prompt or response text.
    settlement_information = models.JSONField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    text = models.TextField(null=True, blank=True)
    result = models.CharField(max_length=10, choices=Result.choices, blank=True, default="", db_default="")
    seed = models.BigIntegerField(null=True, blank=True)
    gen_metadata = models.JSONField(default=list, db_default=[], blank=True)
    tokens = models.PositiveIntegerField(null=True, blank=True)
    reward = models.FloatField(default=0, db_default=0)

    objects = GenerationQuerySet.as_manager()

    class Meta:
        ordering = ("-popped_at",)
        indexes = [
            models.Index(fields=["popped_at"], name="generation_processing", condition=Q(state="processing")),
            # The accepted ones by when: the load's past minute and the statistics' periods.
            models.Index(fields=["finished_at"], name="generation_done_finished", condition=Q(state="done")),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(fallback_tier__gte=1) & Q(fallback_tier__lte=3), name="generation_tier_1_3"
            ),
            models.CheckConstraint(condition=Q(job_ttl__gte=1), name="generation_ttl_positive"),
            models.CheckConstraint(
                condition=Q(job_ttl__lte=F("cap_seconds")), name="generation_ttl_within_cap"
            ),
            models.CheckConstraint(
                condition=Q(state="processing", finished_at__isnull=True)
                | (~Q(state="processing") & Q(finished_at__isnull=False)),
                name="generation_finished_iff_not_processing",
            ),
            models.CheckConstraint(
                condition=~Q(state="done") | Q(text__isnull=False), name="generation_done_has_text"
            ),
        ]

    def __str__(self) -> str:
        return str(self.id)

    @property
    def lease_expires_at(self) -> datetime:
        return self.popped_at + timedelta(seconds=self.job_ttl)

    def lease_description(self) -> str:
        """The lease this job had, in seconds, for the AbortedGen message."""
        from django.conf import settings

        renewed_end = f"{self.job_ttl:.3f}".rstrip("0").rstrip(".")  # 250, or 8.291 to the ms
        return (
            f"its lease was {settings.TEXT_JOB_LEASE_SECONDS} s from the pop, "
            f"renewed to end {renewed_end} s after the pop, "
            f"under a cap of {self.cap_seconds} s"
        )
