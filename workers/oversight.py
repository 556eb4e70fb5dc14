"""What moderators set over the whole horde, and what it counts by address: its modes, the
addresses in timeout, and the sign-ups made from each address. Models of the workers app,
imported by `workers.models`, through which the rest of the code names them."""

from datetime import datetime

from django.db import models
from django.db.models import Q
from django.utils import timezone

from hordeops import timeouts


class HordeModes(models.Model):
    """The horde's modes, one row (its id is 1), set by moderators in the admin and reported by
    GET /api/v2/status/modes (`workers.modes`)."""

    maintenance = models.BooleanField(
        default=False, db_default=False, help_text="No new requests are accepted (400 MaintenanceMode)."
    )
    invite_only = models.BooleanField(
        default=False,
        db_default=False,
        help_text="Only trusted accounts may start new workers (403 WorkerInviteOnly).",
    )
    raid = models.BooleanField(
        default=False,
        db_default=False,
        help_text="New workers of untrusted accounts are refused (403 RaidMode).",
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = verbose_name_plural = "horde modes"
        constraints = [models.CheckConstraint(condition=Q(id=1), name="horde_modes_one_row")]

    def __str__(self) -> str:
        return "Horde modes"


# The longest timeout a moderator sets at once (the AI Horde's 30 days).
MAX_TIMEOUT_HOURS = 24 * 30


class AddressTimeoutQuerySet(models.QuerySet["AddressTimeout"]):
    def active(self, now: datetime) -> "AddressTimeoutQuerySet":
        return self.filter(until__gt=now)

    def holding(self, address_or_network: str) -> list["AddressTimeout"]:
        """The timeouts whose network holds this address or network (ValueError if it is
        neither): the admin's search and `/api/v2/operations/ipaddr/{ipaddr}` ask it."""
        asked = timeouts.network(address_or_network)
        return [
            row
            for row in self
            if (held := timeouts.network(row.network)).version == asked.version and asked.subnet_of(held)
        ]


class AddressTimeout(models.Model):
    """A client address or network a moderator put into timeout: every API call from it is
    refused until `until` (403 TimeoutIP, `hordeops.timeouts`). Set again, it is extended."""

    # As `hordeops.timeouts.shown` writes it: an address bare, a network as its CIDR.
    network = models.CharField(
        max_length=50,
        unique=True,
        help_text="An address (203.0.113.7, 2001:db8::1) or a network (203.0.113.0/24, 2001:db8::/48).",
    )
    until = models.DateTimeField()
    reason = models.CharField(max_length=500, blank=True, default="")
    created_by = models.CharField(max_length=150, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)

    objects = AddressTimeoutQuerySet.as_manager()

    class Meta:
        ordering = ("-until",)

    def __str__(self) -> str:
        return self.network


class Registration(models.Model):
    """An account signed up from an address (an IPv6 one by its /64), counted against
    REGISTRATIONS_PER_ADDRESS a day (`workers.services.sign_up`). Not linked to the account, and
    deleted once a day old: the horde keeps no account's address."""

    address = models.CharField(max_length=64)
    created_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["address", "created_at"], name="registration_address_recent")]

    def __str__(self) -> str:
        return f"{self.address} at {self.created_at:%Y-%m-%d %H:%M}"
