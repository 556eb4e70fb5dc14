"""The sign-up's proof of work: an ALTCHA challenge (the `altcha` package's first scheme), made
and checked here, solved by the browser (`front/static/front/proof_of_work.js`), so that
minting accounts costs CPU and no outside service is asked.

The challenge is SHA-256(salt + n) for a secret n below SIGNUP_CHALLENGE_MAX_NUMBER, signed with
an HMAC key derived from SECRET_KEY; its salt carries its expiry, so the signature covers it. A
solution is accepted once: its challenge is kept in Redis until it would have expired anyway.
"""

import base64
import binascii
import json
from datetime import datetime, timedelta

import altcha
from django.conf import settings
from django.core.cache import cache
from django.utils.crypto import salted_hmac

ALGORITHM = "SHA-256"
# Long enough to type a name after the page solved its challenge.
LIFETIME = timedelta(minutes=10)
USED_PREFIX = "hordeops:sign-up-challenge:"
# A solution is a few hundred characters of base64; anything far longer is not one.
MAX_PAYLOAD_CHARS = 2000


class Refused(ValueError):
    """A solution that is missing, malformed, forged, expired or used before; says which."""


INVALID = "The proof of work is not valid: let the page solve a new one, then submit again."


def _hmac_key() -> str:
    # Its own key, derived from SECRET_KEY: nothing else the horde signs verifies with it.
    return salted_hmac("hordeops.front.proof_of_work", "altcha").hexdigest()


def challenge(*, now: datetime) -> dict:
    """A new challenge, as the page hands it to its script."""
    made = altcha.create_challenge_v1(
        algorithm=ALGORITHM,
        max_number=settings.SIGNUP_CHALLENGE_MAX_NUMBER,
        salt_length=12,
        hmac_key=_hmac_key(),
        salt="",
        number=None,
        expires=now + LIFETIME,
        params=None,
    )
    return made.to_dict()


def verify(payload: str) -> None:
    """Accept a solution once, or raise `Refused`."""
    fields = _decoded(payload)
    ok, error = altcha.verify_solution_v1(fields, _hmac_key(), check_expires=True)
    if error == "Altcha payload expired":
        raise Refused("The proof of work expired: let the page solve a new one, then submit again.")
    if not ok:
        raise Refused(INVALID)
    # Kept until well after it expires (its salt says when), so that it can never be used again.
    if not cache.add(USED_PREFIX + fields["challenge"], 1, timeout=int(LIFETIME.total_seconds()) * 2):
        raise Refused("This proof of work was used already: let the page solve a new one, then submit again.")


def _decoded(payload: str) -> dict:
    """The solution's fields, each of the type the check expects (the package trusts them)."""
    if not payload:
        raise Refused("The page's proof of work is missing: the page needs JavaScript to solve it.")
    if len(payload) > MAX_PAYLOAD_CHARS:
        raise Refused(INVALID)
    try:
        fields = json.loads(base64.b64decode(payload, validate=True))
    except (ValueError, binascii.Error, UnicodeDecodeError):
        fields = None
    strings = ("algorithm", "challenge", "salt", "signature")
    if (
        not isinstance(fields, dict)
        or not all(isinstance(fields.get(key), str) for key in strings)
        or type(fields.get("number")) is not int
        or fields["algorithm"] != ALGORITHM
    ):
        raise Refused(INVALID)
    return {key: fields[key] for key in (*strings, "number")}
