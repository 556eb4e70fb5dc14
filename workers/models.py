import hashlib
import secrets
import uuid
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex
from django.db import models
from django.db.models import F, Q
from django.db.models.functions import Lower
from django.utils import timezone

from hordeops.keys import ANONYMOUS_API_KEY
from workers.capacity import capacity, capacity_expression, online_since

# Models of their own module, registered with the app through this one, which callers import.
from workers.oversight import MAX_TIMEOUT_HOURS, AddressTimeout, HordeModes, Registration  # noqa: F401

ANONYMOUS_NAME = "Anonymous"


def hash_api_key(api_key: str) -> str:
    # Keys are 128 random bits, so a fast hash is enough: nothing to brute-force.
    return hashlib.sha256(api_key.encode()).hexdigest()


ANONYMOUS_API_KEY_HASH = hash_api_key(ANONYMOUS_API_KEY)


def new_api_key() -> str:
    # Never starting with "-": a command line would read such a key as an option
    # (`--apikey -x1Q...`), as the example worker's argparse did.
    while (key := secrets.token_urlsafe(16)).startswith("-"):
        pass
    return key


class Account(models.Model):
    """A requester and worker owner, identified by its API key."""

    # Not unique: an account is named by its name and id, `alice#12` (`workers.details.unique_alias`),
    # as the AI Horde names its users, so that two people may both sign up as "alice".
    name = models.CharField(max_length=100, db_index=True)
    api_key_hash = models.CharField(max_length=64, unique=True, editable=False)
    trusted = models.BooleanField(default=False, db_index=True)
    # A moderator's key may change any worker through the horde API (PUT /api/v2/workers/{id}),
    # as an AI Horde moderator's may; set in the admin.
    moderator = models.BooleanField(default=False, db_default=False)
    # A service account (the AI Horde's `service` role), set by moderators: a front end that
    # sends requests for its own users, each named in the request's `proxied_account`; with a
    # proxy passkey (`workers.proxies`) its `Proxied-For` header is taken as the client's address.
    service = models.BooleanField(
        default=False,
        db_default=False,
        help_text="A front end sending requests for its own users (proxied_account, Proxied-For).",
    )
    # The hash of the service account's proxy passkey (its Proxy-Authorization header), which
    # is shown once when made: `workers.proxies`.
    proxy_passkey_hash = models.CharField(max_length=64, null=True, blank=True, unique=True, editable=False)
    # The AI Horde's customizer role: with trust, what lets an account make styles and their
    # collections (`workers.styles`); set by moderators in the admin.
    customizer = models.BooleanField(default=False, db_default=False)
    # A per-account ceiling on X-MultiLLM-Deadline-Ms: the shorter limit wins.
    deadline_limit_ms = models.PositiveIntegerField(null=True, blank=True)
    # Set by moderators: how many waiting or running requests this account may have; empty
    # means ACCOUNT_MAX_WAITING_REQUESTS (ANONYMOUS_MAX_WAITING_REQUESTS for the anonymous one).
    max_waiting_requests = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Waiting or running requests this account may have at once; empty: the horde's default.",
    )
    created_at = models.DateTimeField(default=timezone.now)
    # Set by moderators: how many workers this account may run; empty: WORKER_LIMIT_TRUSTED if
    # trusted, else WORKER_LIMIT_UNTRUSTED (the AI Horde's 20 and 3).
    worker_limit = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Workers this account may run, in invite-only mode too (an invitation); empty: 3, or 20 if "
        "trusted.",
    )
    # Suspended by a moderator: its key is refused everywhere, with this reason.
    suspended_at = models.DateTimeField(null=True, blank=True)
    suspension_reason = models.CharField(max_length=500, blank=True, default="", db_default="")
    # Set once its suspicions reach SUSPICION_THRESHOLD (`workers.suspicion`): its workers are
    # offered no jobs and it is never trusted automatically, until a moderator clears it.
    flagged_at = models.DateTimeField(null=True, blank=True)
    # Made through the sign-up page (`front/signup.py`) with no identity behind it, as the AI
    # Horde's pseudonymous users: its kudos floor is theirs (`kudos.rates.floor`).
    pseudonymous = models.BooleanField(default=False, db_default=False)
    # The AI Horde's user settings (PUT /api/v2/users/{id}): worker ids shown to anyone, how
    # moderators reach the person (shown to it and to moderators), a note moderators keep.
    public_workers = models.BooleanField(default=False, db_default=False)
    contact = models.CharField(max_length=500, blank=True, default="", db_default="")
    admin_comment = models.CharField(
        max_length=500, blank=True, default="", db_default="", help_text="Seen by moderators only."
    )
    # The identity a person signs in with through a provider (front/oauth.py): a Django user with
    # no password, on which allauth keeps the provider's id for them; none for a key's account.
    user = models.OneToOneField(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="horde_account",
    )

    class Meta:
        ordering = ("name",)
        constraints = [
            models.CheckConstraint(
                condition=Q(service=True) | Q(proxy_passkey_hash__isnull=True),
                name="account_passkey_of_service",
            ),
        ]
        # GET /api/v2/users?sort=age pages through it, oldest first.
        indexes = [models.Index(fields=["created_at", "id"], name="account_by_age")]

    def __str__(self) -> str:
        return self.name

    @property
    def workers_allowed(self) -> int:
        """How many workers the account may run: its own limit, else the horde's."""
        if self.worker_limit is not None:
            return self.worker_limit
        return settings.WORKER_LIMIT_TRUSTED if self.trusted else settings.WORKER_LIMIT_UNTRUSTED

    @property
    def is_anonymous(self) -> bool:
        return self.api_key_hash == ANONYMOUS_API_KEY_HASH

    @property
    def waiting_requests_limit(self) -> int:
        """The most waiting or running requests this account may have (docs/reference/horde_api.md)."""
        if self.max_waiting_requests is not None:
            return self.max_waiting_requests
        if self.is_anonymous:
            return settings.ANONYMOUS_MAX_WAITING_REQUESTS
        return settings.ACCOUNT_MAX_WAITING_REQUESTS


class SharedKey(models.Model):
    """A key an account hands out (the AI Horde's shared keys, `workers.shared_keys`): on the
    requester routes it spends its owner's kudos within its budget until it expires, each
    request within its token cap; it can do nothing else (run a worker, transfer, make keys).

    Its id is the key itself, a UUID kept in plain, as the AI Horde keeps it, not hashed as an
    account's key is (`Account.api_key_hash`): its owner lists its keys (`find_user`'s
    `sharedkey_ids`) and reads, changes or deletes each by its id, which a hash would not
    allow; what one that leaks can spend is bounded by its budget, and its owner deletes it."""

    # `kudos` and `max_text_tokens` at this value: no bound.
    UNLIMITED = -1

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    account = models.ForeignKey(Account, on_delete=models.CASCADE, related_name="shared_keys")
    name = models.CharField(max_length=255, blank=True, default="")
    # What it may still spend, taken down by each request queued with it by the request's cost
    # (`workers.sql.spend_shared_key`); UNLIMITED: its owner's balance is the only bound.
    kudos = models.DecimalField(max_digits=18, decimal_places=2, default=5000)
    # What the requests queued with it cost, added up.
    utilized = models.DecimalField(max_digits=18, decimal_places=2, default=0)
    # None: it never expires.
    expiry = models.DateTimeField(null=True, blank=True)
    # The most tokens one request may ask for (its max_length); UNLIMITED: no cap.
    max_text_tokens = models.IntegerField(default=UNLIMITED)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ("created_at",)
        constraints = [
            models.CheckConstraint(condition=Q(kudos__gte=-1), name="shared_key_kudos_at_least_unlimited"),
            models.CheckConstraint(
                condition=Q(max_text_tokens__gte=-1), name="shared_key_tokens_at_least_unlimited"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name or 'shared key'} ({self.account_id})"

    def is_expired(self, now: datetime) -> bool:
        return self.expiry is not None and self.expiry <= now


class Team(models.Model):
    """A group of workers, made by a trusted account (the AI Horde's teams): its totals are
    its workers' own counters (`workers.teams`)."""

    # The AI Horde's bounds of a team's name and info note (`CreateTeamInput`).
    NAME_LENGTH = (3, 100)
    INFO_LENGTH = (3, 1000)

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # Unique whatever its case (`team_name_unique`), as the AI Horde finds a team by name.
    name = models.CharField(max_length=100)
    info = models.CharField(max_length=1000, blank=True, default="", db_default="")
    owner = models.ForeignKey(Account, on_delete=models.CASCADE, related_name="teams")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ("name",)
        constraints = [models.UniqueConstraint(Lower("name"), name="team_name_unique")]

    def __str__(self) -> str:
        return self.name

    def may_change(self, account: Account) -> bool:
        """Its creator or a moderator may rename, describe or delete it."""
        return account.moderator or account.pk == self.owner_id


class Style(models.Model):
    """A text style (the AI Horde's `Style`; text only): a prompt template with `{p}` where a
    request's prompt goes, the params and the models that a request naming it runs under
    (`jobs.styles`). A trusted or customizer account makes it; its owner changes it; its owner
    or a moderator deletes it (`workers.styles`)."""

    # The AI Horde's bounds (`ModelStyleInputKobold`, `kobold_styles.TextStyle.post`).
    NAME_LENGTH = (1, 100)
    INFO_LENGTH = (10, 1000)
    MAX_MODELS = 5
    MAX_TAGS = 10
    TAG_LENGTH = 25

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(Account, on_delete=models.CASCADE, related_name="styles")
    # Unique per owner, case and all (`style_owner_name`), as the AI Horde's.
    name = models.CharField(max_length=100)
    info = models.CharField(max_length=1000, blank=True, default="", db_default="")
    prompt = models.TextField()
    # The sampling params a request under it runs with, as the style's author sent them.
    params = models.JSONField(default=dict, blank=True)
    model_names = ArrayField(models.CharField(max_length=255), default=list)
    tags = ArrayField(models.CharField(max_length=25), default=list, blank=True)
    public = models.BooleanField(default=True)
    nsfw = models.BooleanField(default=False)
    use_count = models.PositiveIntegerField(default=0, db_default=0)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ("name",)
        constraints = [
            models.UniqueConstraint(fields=["owner", "name"], name="style_owner_name"),
            models.CheckConstraint(
                condition=Q(model_names__len__gte=1) & Q(model_names__len__lte=5), name="style_models_1_5"
            ),
            models.CheckConstraint(condition=Q(tags__len__lte=10), name="style_tags_at_most_10"),
        ]
        indexes = [
            # The public list, by use or by age, filtered by a model or a tag.
            models.Index(fields=["-use_count", "created_at"], condition=Q(public=True), name="style_popular"),
            models.Index(fields=["created_at"], condition=Q(public=True), name="style_age"),
            GinIndex(fields=["model_names"], name="style_models_gin"),
            GinIndex(fields=["tags"], name="style_tags_gin"),
            models.Index(fields=["name"], name="style_name"),
        ]

    def __str__(self) -> str:
        return self.name

    def may_delete(self, account: Account) -> bool:
        """Its owner or a moderator deletes it; only its owner changes it (the AI Horde's)."""
        return account.moderator or account.pk == self.owner_id


class StyleCollection(models.Model):
    """Styles gathered under one name (the AI Horde's `StyleCollection`): a request naming it
    runs under one of them, picked at random (`jobs.styles`)."""

    NAME_LENGTH = (1, 100)
    INFO_LENGTH = (1, 1000)
    # hordeops' bound (the AI Horde has none): each is looked up as the collection is made.
    MAX_STYLES = 100

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(Account, on_delete=models.CASCADE, related_name="style_collections")
    name = models.CharField(max_length=100)
    info = models.CharField(max_length=1000, blank=True, default="", db_default="")
    public = models.BooleanField(default=True)
    use_count = models.PositiveIntegerField(default=0, db_default=0)
    created_at = models.DateTimeField(default=timezone.now)
    # A style deleted leaves every collection that held it (the AI Horde's cascade).
    styles = models.ManyToManyField(Style, related_name="collections")

    class Meta:
        ordering = ("name",)
        constraints = [models.UniqueConstraint(fields=["owner", "name"], name="collection_owner_name")]
        indexes = [
            models.Index(
                fields=["-use_count", "created_at"], condition=Q(public=True), name="collection_popular"
            ),
            models.Index(fields=["created_at"], condition=Q(public=True), name="collection_age"),
            models.Index(fields=["name"], name="collection_name"),
        ]

    def __str__(self) -> str:
        return self.name

    def may_delete(self, account: Account) -> bool:
        return account.moderator or account.pk == self.owner_id


class WorkerQuerySet(models.QuerySet["Worker"]):
    def live(self) -> "WorkerQuerySet":
        """Workers their owner or a moderator has not deleted."""
        return self.filter(deleted_at__isnull=True)

    def online(self, now: datetime) -> "WorkerQuerySet":
        """Workers that popped within WORKER_ONLINE_SECONDS and have not said goodbye since (the
        eligibility rule's own test, `ONLINE_SQL`)."""
        return self.live().filter(last_pop_at__gte=online_since(now), left_at__isnull=True)

    def online_chat(self, now: datetime) -> "WorkerQuerySet":
        """Online workers that serve chat jobs: the ones behind the `/v1` routes' models."""
        return self.online(now).filter(chat=True)

    def capacity_limited(self) -> "WorkerQuerySet":
        """Chat workers whose capacity is below the max_length they declare (`Worker.capacity_limited`)."""
        return (
            self.filter(chat=True)
            .alias(window_tokens=capacity_expression())
            .filter(window_tokens__lt=F("max_length"))
        )

    def chat_models(self, now: datetime) -> dict[str, tuple[datetime, frozenset[str]]]:
        """The models online chat workers serve now, sorted, each with when the first of those
        workers was created and the capabilities (`tools`, `structured_outputs`) at least one
        of them declares: what the `/v1` routes offer."""
        first: dict[str, datetime] = {}
        capable: dict[str, set[str]] = {}
        rows = self.online_chat(now).values_list("served_models", "created_at", "tools", "structured_outputs")
        for served, created_at, tools, structured in rows:
            for model in served:
                first[model] = min(first.get(model, created_at), created_at)
                declared = capable.setdefault(model, set())
                declared.update(
                    name for name, on in (("tools", tools), ("structured_outputs", structured)) if on
                )
        return {model: (first[model], frozenset(capable[model])) for model in sorted(first)}


class Worker(models.Model):
    """A volunteer's LLM server, created by its first pop under a name."""

    # How many completed jobs the rolling speed averages over (the AI Horde's window).
    SPEED_WINDOW = 20
    # Aborts are counted in windows of an hour from the first abort (the abort rule: more than
    # WORKER_ABORT_MAINTENANCE_THRESHOLD within an hour means maintenance). The window
    # includes its last instant: a start exactly an hour ago still counts, the stricter reading.
    ABORT_WINDOW = timedelta(hours=1)

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # Unique among the workers not deleted (`worker_name_unique`): a deleted worker's name is free.
    name = models.CharField(max_length=100)
    account = models.ForeignKey(Account, on_delete=models.CASCADE, related_name="workers")
    served_models = ArrayField(models.CharField(max_length=255), default=list, blank=True)
    max_length = models.PositiveIntegerField(default=512)
    max_context_length = models.PositiveIntegerField(default=2048)
    threads = models.PositiveSmallIntegerField(default=1)
    nsfw = models.BooleanField(default=False)
    chat = models.BooleanField(default=False)
    # What its model server can do beyond plain chat, declared at each pop (`CAPABILITIES`):
    # a chat job that needs one is offered only to workers that declare it (`jobs.eligibility`).
    tools = models.BooleanField(default=False, db_default=False)
    structured_outputs = models.BooleanField(default=False, db_default=False)
    bridge_agent = models.CharField(max_length=1000, default="unknown:0:unknown")
    # The client address of its last pop, as the limits count it (an IPv6 address by its /64):
    # workers of untrusted accounts from one address are limited (WORKER_LIMIT_PER_ADDRESS).
    address = models.CharField(max_length=64, blank=True, default="", db_default="")
    created_at = models.DateTimeField(default=timezone.now)
    last_pop_at = models.DateTimeField(default=timezone.now, db_index=True)
    # When it said goodbye (POST /api/v2/workers/goodbye, sent by a stopping bridge): offline
    # from then on, not for the rest of the online window; its next pop clears it.
    left_at = models.DateTimeField(null=True, blank=True)

    # Tokens per second over the last SPEED_WINDOW completed jobs; null until measured.
    # (The `db_default`s: the check-in's hand-written INSERT, workers.sql, leaves these out.)
    speed = models.FloatField(null=True, blank=True)
    speed_samples = ArrayField(models.FloatField(), default=list, db_default=[], blank=True)
    completed_jobs = models.PositiveIntegerField(default=0, db_default=0)
    # What its accepted submits added up to, kept by the submit's own statement, so that the
    # discovery routes read them from this row (no scan of the generations).
    tokens_generated = models.BigIntegerField(default=0, db_default=0)
    kudos_rewards = models.FloatField(default=0, db_default=0)
    # The largest context (prompt and reply, within the request's max_context_length) of a job
    # it completed, kept by the submit's statement: uptime counts no more context than this
    # (`kudos.uptime`), as nothing checks the max_context_length a pop declares.
    served_context = models.PositiveIntegerField(default=0, db_default=0)
    # What staying online earned it (`kudos.uptime`), and until when it was paid for; None
    # while it is not counted (before its first pass online, or after it went offline).
    kudos_uptime = models.FloatField(default=0, db_default=0)
    uptime_paid_until = models.DateTimeField(null=True, blank=True)
    # The owner's note, shown in the worker's details (PUT /api/v2/workers/{id} `info`).
    info = models.CharField(max_length=1000, blank=True, default="", db_default="")

    # Aborts in a fixed one-hour window, as the AI Horde counts them.
    aborted_jobs = models.PositiveIntegerField(default=0, db_default=0)
    aborts_window_start = models.DateTimeField(null=True, blank=True)
    uncompleted_jobs = models.PositiveIntegerField(default=0, db_default=0)
    # Jobs it gave back (a submit with state "faulted"): counted as aborts too.
    given_back = models.PositiveIntegerField(default=0, db_default=0)
    maintenance = models.BooleanField(default=False, db_default=False)
    maintenance_reason = models.CharField(max_length=500, blank=True, default="", db_default="")
    # Set by a moderator: binding, only a moderator lifts it (the owner's PUT is refused).
    maintenance_by_moderator = models.BooleanField(default=False, db_default=False)
    # Paused by a moderator: it keeps popping and is offered nothing (the AI Horde hands a
    # paused worker fake jobs instead); only a moderator unpauses it.
    paused = models.BooleanField(default=False, db_default=False)
    # Deleted by its owner or a moderator: hidden everywhere but the admin, offline, its name
    # free; the row stays for its generations' history and the jobs it still holds.
    deleted_at = models.DateTimeField(null=True, blank=True)
    # The team it is dedicated to, set by its owner or a moderator; left when the team goes.
    team = models.ForeignKey(Team, on_delete=models.SET_NULL, null=True, blank=True, related_name="workers")

    objects = WorkerQuerySet.as_manager()

    class Meta:
        ordering = ("name",)
        indexes = [
            GinIndex(fields=["served_models"], name="worker_models_gin"),
            # The per-address limit's count, made when an untrusted account's pop names a new worker.
            models.Index(
                fields=["address"], condition=Q(deleted_at__isnull=True), name="worker_live_address"
            ),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["name"], condition=Q(deleted_at__isnull=True), name="worker_name_unique"
            ),
            models.CheckConstraint(
                condition=Q(threads__gte=1) & Q(threads__lte=50), name="worker_threads_1_50"
            ),
            models.CheckConstraint(
                condition=Q(speed__isnull=True) | Q(speed__gte=0), name="worker_speed_not_negative"
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def capacity(self) -> int:
        """Chat capacity in tokens (speed x the base lease's generating window)."""
        return capacity(self.speed)

    @property
    def performance(self) -> str:
        """Its speed as the AI Horde words it, or that it has none yet."""
        if not self.completed_jobs:
            return "No requests fulfilled yet"
        return f"{round(float(self.speed or 0), 1)} tokens per second"

    def is_online(self, now: datetime) -> bool:
        return self.last_pop_at >= online_since(now) and self.left_at is None

    def aborts_in_window(self, now: datetime) -> int:
        """Aborts counted in the current one-hour window (0 once it has passed)."""
        if self.aborts_window_start is None or self.aborts_window_start < now - self.ABORT_WINDOW:
            return 0
        return self.aborted_jobs

    @property
    def capacity_limited(self) -> bool:
        """A chat worker that declares more max_length than it can produce in the base lease."""
        return self.chat and self.capacity < self.max_length


class Suspicion(models.Model):
    """One reason to suspect an untrusted account's worker (`workers.suspicion`), as the AI
    Horde records them; SUSPICION_THRESHOLD of them flag the account."""

    class Reason(models.TextChoices):
        UNREASONABLY_FAST = "unreasonably_fast", "Generation unreasonably fast for its model's size"
        ABORTS = "aborts", "Too many jobs aborted in an hour (into maintenance again)"
        GIVE_BACKS = "give_backs", "Gives back most of the jobs it takes"

    account = models.ForeignKey(Account, on_delete=models.CASCADE, related_name="suspicions")
    worker = models.ForeignKey(Worker, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    reason = models.CharField(max_length=32, choices=Reason.choices)
    # The figures behind it ("212 t/s > 100 t/s for 13B"), never a prompt or a reply.
    detail = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ("-created_at",)
        indexes = [models.Index(fields=["account", "-created_at"], name="suspicion_account_recent")]

    def __str__(self) -> str:
        return f"{self.get_reason_display()}: {self.detail}"


# The AI Horde's bound on a message (`input_model_message`).
MESSAGE_MAX_LENGTH = 10240


class WorkerMessage(models.Model):
    """A moderator's message to a worker, delivered in each of its pops' `messages` until it
    expires (the AI Horde's worker messages; `workers.messages`)."""

    worker = models.ForeignKey(Worker, on_delete=models.CASCADE, related_name="messages")
    message = models.TextField(max_length=MESSAGE_MAX_LENGTH)
    origin = models.CharField(max_length=255, default="Horde moderators")
    expiry = models.DateTimeField(db_index=True)
    created_by = models.CharField(max_length=150, blank=True, default="")
    # The account whose key wrote it through the API (the AI Horde's `user_id`): it may delete
    # it. None for a message written in the admin.
    author = models.ForeignKey(
        Account, on_delete=models.SET_NULL, null=True, blank=True, editable=False, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ("-created_at",)

    def __str__(self) -> str:
        return f"to {self.worker_id}: {self.message[:40]}"
