"""The kudos ledger: append-only postings, each event's summing to zero, and the balances kept
from them.

Every movement is an `Event` of `Posting`s between `Wallet`s: an account's, or one of the
horde's system wallets (the treasury mints, the sink burns), so that the whole ledger always
sums to zero. The database holds the invariants: an event's postings must sum to zero when its
transaction commits, postings and events are never updated or deleted (a correction is a new
event), and a business event's key is posted once.
"""

from datetime import UTC, date, datetime
from decimal import Decimal

from django.db import models
from django.db.models import Q, Sum
from django.db.models.functions import Coalesce, TruncDate
from django.utils import timezone

from workers.models import Account

ZERO = Decimal("0.00")


def amount_field(**kwargs) -> models.DecimalField:
    # Kudos to the hundredth, as the AI Horde rounds them; decimal, so that sums are exact.
    return models.DecimalField(max_digits=18, decimal_places=2, **kwargs)


class WalletQuerySet(models.QuerySet["Wallet"]):
    def drifted(self) -> "WalletQuerySet":
        """Account wallets whose kept balance differs from the sum of their postings."""
        return (
            self.filter(account__isnull=False)
            .annotate(posted=Coalesce(Sum("postings__amount"), ZERO))
            .exclude(balance=models.F("posted"))
        )


class Wallet(models.Model):
    """Whose kudos a posting moves: an account's spendable kudos, its evaluation escrow (what an
    untrusted account earns but may not spend until it is trusted), or one of the horde's system
    wallets."""

    class System(models.TextChoices):
        TREASURY = "treasury", "treasury (what is minted)"
        SINK = "sink", "sink (what is burned)"

    account = models.ForeignKey(
        Account, null=True, blank=True, on_delete=models.PROTECT, related_name="wallets"
    )
    escrow = models.BooleanField(default=False, db_default=False)
    system = models.CharField(max_length=16, choices=System.choices, null=True, blank=True, unique=True)
    # The balance as its postings sum it, kept by the event that posts to it (account wallets
    # only: a system wallet, which every event moves, keeps no row to update and wait on).
    balance = amount_field(default=ZERO, db_default=ZERO)
    # The least a spendable balance may be (`kudos.rates.floor`): a movement past it is forgiven.
    # None for an escrow or a system wallet.
    floor = amount_field(null=True, blank=True)
    # What the last movement of this wallet forgave below its floor: how the one statement that
    # posts an event learns it, to post it as minted (`kudos.sql.post_event`).
    forgiven = amount_field(default=ZERO, db_default=ZERO)
    # What its movements added up to by the AI Horde's action (`Event.action`): an account's
    # `kudos_details`, kept by the event that moves it (spendable wallets only).
    details = models.JSONField(default=dict, db_default={}, blank=True)

    objects = WalletQuerySet.as_manager()

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(account__isnull=False, system__isnull=True)
                | Q(account__isnull=True, system__isnull=False, escrow=False),
                name="wallet_account_or_system",
            ),
            models.UniqueConstraint(fields=["account", "escrow"], name="wallet_one_per_account_and_purpose"),
        ]

    def __str__(self) -> str:
        if self.system:
            return self.system
        return f"{'escrow' if self.escrow else 'wallet'} of account {self.account_id}"


class EventQuerySet(models.QuerySet["Event"]):
    def unbalanced(self) -> "EventQuerySet":
        """Events whose postings do not sum to zero (the database refuses them at commit)."""
        return self.annotate(total=Coalesce(Sum("postings__amount"), ZERO)).exclude(total=ZERO)


class Event(models.Model):
    """One business event's movement of kudos."""

    class Kind(models.TextChoices):
        GENERATION = "generation", "earned by a generation"
        UPTIME = "uptime", "earned by staying online"
        SPEND = "spend", "spent on a request"
        TRANSFER = "transfer", "transferred"
        AWARD = "award", "awarded by a moderator"
        FORGIVEN = "forgiven", "forgiven below the floor"
        TAX = "tax", "the horde tax"
        PROMOTION = "promotion", "escrow released on trust"

    # The AI Horde's `kudos_details` key a movement of a spendable balance adds to, by kind (a
    # transfer: what was gifted out or received); what the floor forgave is in none.
    ACTIONS = {
        Kind.GENERATION: "accumulated",
        Kind.UPTIME: "accumulated",
        Kind.SPEND: "accumulated",
        Kind.TAX: "accumulated",
        Kind.PROMOTION: "accumulated",
        Kind.AWARD: "awarded",
        Kind.TRANSFER: "received",
    }
    GIFTED = "gifted"
    # A horde tax's credit: the style fee its request's style's author receives.
    STYLED = "styled"
    # The keys of `records`, kept summed in the account's spendable wallet's `details` too
    # (`style_text`: a request of another account's ran under one of its styles).
    RECORDS = ("usage_tokens", "request_text", "contribution_tokens", "fulfillment_text", "style_text")

    id = models.BigAutoField(primary_key=True)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    # The business event's own key (a generation's id, a request's settlement, a hash of a transfer's
    # Idempotency-Key): a retry finds the event posted and posts nothing.
    key = models.CharField(max_length=200)
    reason = models.CharField(max_length=500, blank=True, default="", db_default="")
    created_at = models.DateTimeField(default=timezone.now)
    # The AI Horde's user records this event adds to, by account id (a generation's: its
    # requester's usage and request count, its worker owner's contribution and fulfillment).
    records = models.JSONField(null=True, blank=True)

    objects = EventQuerySet.as_manager()

    class Meta:
        permissions = [("award_kudos", "Can award kudos to an account")]
        # A constraint, not unique=True: that adds a LIKE index no query uses, to every post.
        constraints = [models.UniqueConstraint(fields=["key"], name="event_key_once")]
        # The last minute's transfers, read for the reverse-transfer guard (`kudos.transfers`);
        # partial, so that no other event adds to it.
        indexes = [
            models.Index(fields=["created_at"], name="event_recent_transfer", condition=Q(kind="transfer"))
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.key}"

    @classmethod
    def action(cls, kind: "Event.Kind", amount) -> str | None:
        """The `kudos_details` key a movement of `amount` by an event of `kind` adds to."""
        if kind == cls.Kind.TRANSFER and amount < 0:
            return cls.GIFTED
        if kind == cls.Kind.TAX and amount > 0:
            return cls.STYLED
        return cls.ACTIONS.get(kind)


class PostingQuerySet(models.QuerySet["Posting"]):
    def total(self) -> Decimal:
        """The sum of these postings: zero over the whole ledger."""
        return self.aggregate(total=Coalesce(Sum("amount"), ZERO))["total"]

    def of_account(self, account_id: int) -> "PostingQuerySet":
        """The postings of an account's wallets (spendable and escrow), newest first."""
        return self.filter(wallet__account_id=account_id).order_by("-id")

    def per_day(self, *, since: datetime) -> dict[date, tuple[Decimal, Decimal]]:
        """What these postings added and took away each UTC day from `since`: (in, out), out
        positive. The escrow's release on trust is left out: it moves kudos between an
        account's own wallets, and would count once in and once out."""
        rows = (
            self.filter(event__created_at__gte=since)
            .exclude(event__kind=Event.Kind.PROMOTION)
            .annotate(day=TruncDate("event__created_at", tzinfo=UTC))
            .order_by()
            .values("day")
            .annotate(
                added=Coalesce(Sum("amount", filter=Q(amount__gt=0)), ZERO),
                taken=Coalesce(Sum("amount", filter=Q(amount__lt=0)), ZERO),
            )
        )
        return {row["day"]: (row["added"], -row["taken"]) for row in rows}


class Posting(models.Model):
    """What one event moved in or out of one wallet: credits positive, debits negative."""

    id = models.BigAutoField(primary_key=True)
    event = models.ForeignKey(Event, on_delete=models.PROTECT, related_name="postings")
    # Indexed by posting_by_wallet, which leads with it.
    wallet = models.ForeignKey(Wallet, on_delete=models.PROTECT, related_name="postings", db_index=False)
    amount = amount_field()

    objects = PostingQuerySet.as_manager()

    class Meta:
        indexes = [models.Index(fields=["wallet", "id"], name="posting_by_wallet")]
        constraints = [models.CheckConstraint(condition=~Q(amount=0), name="posting_not_zero")]

    def __str__(self) -> str:
        return f"{self.amount} to {self.wallet_id} ({self.event_id})"


class Hold(models.Model):
    """What one active request still holds of its account's kudos: its cost as reserved when it
    was queued, less what its generations were charged since (`kudos.holds`).

    Keyed by the request's id, with no foreign key: the ledger knows nothing of requests. The
    app that queues them places a hold in the statement that queues, draws it down in the one
    that charges, and releases it in the one that ends the request (as the AI Horde keeps its
    `KudosReservation` apart from users). Not part of the ledger: a hold moves no kudos.
    """

    request_id = models.UUIDField(primary_key=True)
    # Indexed by hold_by_account, which leads with it.
    account = models.ForeignKey(Account, on_delete=models.CASCADE, related_name="holds", db_index=False)
    amount = amount_field()

    class Meta:
        # What the account's holds add up to, read from the index alone where it can be.
        indexes = [models.Index(fields=["account"], include=["amount"], name="hold_by_account")]
        constraints = [models.CheckConstraint(condition=Q(amount__gte=0), name="hold_not_negative")]

    def __str__(self) -> str:
        return f"{self.amount} held by request {self.request_id}"


class TextModel(models.Model):
    """A text model's size, as the AI Horde's text model reference gives it: what kudos are
    reckoned by (`kudos.rates`). Kept by moderators; `manage.py import_text_models` loads the
    reference's JSON. Read through `kudos.sizes`."""

    name = models.CharField(max_length=255, unique=True)
    parameters = models.PositiveBigIntegerField()

    class Meta:
        ordering = ("name",)

    def __str__(self) -> str:
        return self.name
