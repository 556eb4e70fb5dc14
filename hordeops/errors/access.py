"""The refusals of who may do what: accounts, keys, shared keys, moderators' modes and
timeouts, sign-up, and the limits on workers."""

from hordeops.errors.base import BadRequest, DomainError, InvalidAPIKey


class UserNotFound(DomainError, code="UserNotFound", status=404):
    default_message = "No user with that id."


class NotOwner(DomainError, code="NotOwner", status=403):
    default_message = "Only the worker's owner or a moderator may change this."


# Status 400, as the AI Horde answers it: a 5xx would have the SDKs resend the request.
class MaintenanceMode(DomainError, code="MaintenanceMode", status=400, retry_after=60):
    default_message = "The horde has entered maintenance mode. Please try again later."


class WorkerInviteOnly(DomainError, code="WorkerInviteOnly", status=403):
    default_message = (
        "This horde has been switched to worker invite-only mode: only trusted accounts, and those "
        "a moderator invited, may start new workers. Ask a moderator."
    )


class RaidMode(DomainError, code="RaidMode", status=403):
    default_message = (
        "This horde is defending itself from a raid: new workers of untrusted accounts are refused "
        "for now. Please try again later."
    )


class SignUpClosedInRaid(RaidMode):
    # As the AI Horde, a provider's identity may still sign up (front/oauth.py).
    default_message = (
        "We cannot allow anonymous registrations at the moment: this horde is defending itself "
        "from a raid. Please try again later, or sign up with a provider where this horde offers one."
    )


class TooManyRegistrations(DomainError, code="TooManyRegistrations", status=429):
    default_message = "Too many accounts were made from your address today."

    def __init__(self, allowed: int) -> None:
        super().__init__(
            f"To prevent abuse, at most {allowed} accounts may be made from one address in a day. "
            "Please try again tomorrow."
        )


class TooManyWorkers(DomainError, code="TooManyWorkers", status=403):
    default_message = "This account runs as many workers as it may."

    def __init__(self, allowed: int) -> None:
        super().__init__(
            f"To avoid abuse, this account may run up to {allowed} distinct workers: "
            "delete one, or ask a moderator to raise the limit."
        )


class TimeoutIP(DomainError, code="TimeoutIP", status=403):
    default_message = (
        "Due to abuse prevention, your IP address has been put into timeout. Please try again "
        "later, or contact a moderator if you think this was an error."
    )

    def __init__(self, seconds: int) -> None:
        # The AI Horde's wording: the seconds left, unless it is more than four days.
        super().__init__(
            None
            if seconds > 4 * 24 * 3600
            else f"Due to abuse prevention, your IP address has been put into timeout for {seconds} "
            "more seconds. Please try again later, or contact a moderator if you think this was an error."
        )
        self.retry_after = seconds


class TooManySameIPs(DomainError, code="TooManySameIPs", status=403):
    default_message = (
        "You are running too many workers from the same location. To prevent abuse, please ask a "
        "moderator to allow more workers from this address."
    )


class AccountSuspended(DomainError, code="AccountSuspended", status=403):
    default_message = "This account has been suspended by a moderator."

    def __init__(self, reason: str = "") -> None:
        super().__init__(f"This account has been suspended by a moderator: {reason}" if reason else None)


class NotModerator(DomainError, code="NotModerator", status=403):
    default_message = "Only a moderator may change this."


class NoValidActions(DomainError, code="NoWorkerModSelected", status=400):
    default_message = "No worker modification selected!"


class WorkerNameAlreadyExists(DomainError, code="WorkerNameAlreadyExists", status=400):
    default_message = "A worker with this name already exists."


class Forbidden(DomainError, code="Forbidden", status=403):
    default_message = "This operation is not allowed."


class AnonForbidden(DomainError, code="AnonForbidden", status=403):
    default_message = "Anonymous user is forbidden from performing this operation"


class OnlyServiceAccountProxy(DomainError, code="OnlyServiceAccountProxy", status=400):
    """A `proxied_account` sent by an account that is not a service account (the AI Horde's rc
    and words)."""

    default_message = "Only service accounts can provide a proxied_account value."


class NonServiceForbidden(Forbidden, code="NonServiceForbidden"):
    default_message = "Only Service Accounts can set a proxy passkey"


class RequiresTrust(DomainError, code="RequiresTrust", status=400):
    """`disable_batching` with n above 1 from an untrusted account (the AI Horde's rc; its
    words name its patrons too, which this horde has not)."""

    default_message = "Only trusted users can disable batching."


class SharedKeyNotFound(InvalidAPIKey):
    """A shared key (a UUID) that no account has made, or that its owner deleted."""

    default_message = "No user matching sent Shared Key."


class SharedKeyEmpty(DomainError, code="SharedKeyEmpty", status=403):
    default_message = "This shared key has run out of kudos."


class SharedKeyExpired(DomainError, code="SharedKeyExpired", status=403):
    default_message = "This shared key has expired"


class SharedKeyInsufficientKudos(DomainError, code="SharedKeyInsufficientKudos", status=403):
    """A request that costs more than what is left of its shared key's budget."""

    def __init__(self, *, remaining: object, required: object) -> None:
        super().__init__(
            f"This shared key does not have enough remaining kudos ({remaining}) "
            f"to fulfill this request ({required})."
        )


class NoSharedKeyModSelected(DomainError, code="NoSharedKeyModSelected", status=400):
    default_message = "No shared key modification selected!"


class TeamNotFound(DomainError, code="TeamNotFound", status=404):
    default_message = "No team with that id."


class UntrustedTeamCreation(DomainError, code="UntrustedTeamCreation", status=403):
    default_message = "Only Trusted users are allowed to perform this operation"


class TeamNameAlreadyExists(DomainError, code="TeamNameAlreadyExists", status=400):
    default_message = "A team with this name already exists."


class NoTeamModSelected(DomainError, code="NoTeamModSelected", status=400):
    default_message = "No team modification selected!"


class MessagesOnlyOwnWorkers(Forbidden, code="MessagesOnlyOwnWorkers"):
    default_message = "You can only send messages to your own workers."


class WorkerMessageNotFound(DomainError, code="WorkermessageNotFound", status=404):
    """The AI Horde's `ThingNotFound("WorkerMessage", id)`, whose rc and words it capitalizes so."""

    def __init__(self, message_id: str) -> None:
        super().__init__(f"Workermessage with ID '{message_id}' not found.")


class NotAdmin(DomainError, code="NotAdmin", status=403):
    # The AI Horde's admins (its ADMINS list) are hordeops' superusers, who act in the admin.
    default_message = "Only the horde's operator may change this, in the admin."


class NotAllowedAwards(DomainError, code="NotAllowedAwards", status=403):
    default_message = "Only moderators can award kudos."


class NoUserModSelected(DomainError, code="NoUserModSelected", status=400):
    default_message = "No usermod operations selected!"


class NoHordeModSelected(DomainError, code="NoHordeModSelected", status=400):
    default_message = "No mod change selected!"


class AnonForbiddenUserMod(AnonForbidden, code="AnonForbiddenUserMod"):
    pass


class UserNotDeleted(DomainError, code="UserNotDeleted", status=400):
    # hordeops deletes no account: none can be undeleted.
    default_message = "User is not deleted, cannot undelete!"


class TooLongUserName(DomainError, code="TooLongUserName", status=400):
    def __init__(self, allowed: int) -> None:
        super().__init__(f"A username may be at most {allowed} characters long.")


class StyleNotFound(DomainError, code="StyleNotFound", status=404):
    """The AI Horde's `ThingNotFound("Style", id)`: its rc and words."""

    def __init__(self, reference: str) -> None:
        super().__init__(f"Style with ID '{reference[:255]}' not found.")


class CollectionNotFound(DomainError, code="CollectionNotFound", status=404):
    """The AI Horde's `ThingNotFound("Collection", id)` (by name too, in the same words)."""

    def __init__(self, reference: str) -> None:
        super().__init__(f"Collection with ID '{reference[:255]}' not found.")


class StylesRequiresCustomizer(Forbidden, code="StylesRequiresCustomizer"):
    default_message = (
        "Only customizers and trusted users can create new styles. You can request the customizer "
        "role in our channels."
    )


class StylesAnonForbidden(Forbidden, code="StylesAnonForbidden"):
    default_message = "Anonymous users cannot create or delete styles or collections."


class StylePromptMissingVars(BadRequest, code="StylePromptMissingVars"):
    default_message = (
        "A style prompt must include a dedicated spot where the user's positive prompt will be "
        "added, signified with '{p}'"
    )


class StylePromptInvalid(BadRequest, code="StylePromptInvalid"):
    """A prompt template the AI Horde would fail on as it applies it (a stray brace, `{0}`,
    `{p.x}`, `{p!r}`, `{p:>9}`): only `{p}`, other `{name}`s (left empty) and `{{`/`}}` are taken."""

    default_message = (
        "A style prompt may hold only {p} (the request's prompt), {name} placeholders, which are left "
        "empty, and {{ or }} for a literal brace."
    )


class StyleFieldNotServed(BadRequest, code="StyleFieldNotServed"):
    """A field horde_sdk sends that the AI Horde's source does not have (or that hordeops does
    not serve), refused rather than silently ignored."""

    def __init__(self, field: str, why: str) -> None:
        super().__init__(f"'{field}' is not served by this horde: {why} Leave it out or send null.")
