"""Reading one setting from the environment: the helpers `hordeops.settings` reads through.

Each takes the variable's name and its default, and refuses a malformed value with
ImproperlyConfigured (naming the variable, never echoing a secret), except where a rule says
a malformed value turns a feature off.
"""

import logging
import os
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from hordeops.parsing import ascii_int

logger = logging.getLogger("hordeops.settings")


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def _env_parsed(name: str, default, parse, what: str):
    """The variable through `parse` (int, float), or `default` when it is unset or blank."""
    raw = os.environ.get(name, "")
    if raw.strip() == "":
        return default
    try:
        return parse(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be {what}") from None


def env_int(name: str, default: int) -> int:
    return _env_parsed(name, default, int, "an integer")


def env_optional_int(name: str) -> int | None:
    """An integer, or None when the variable is unset or empty."""
    if os.environ.get(name, "").strip() == "":
        return None
    return env_int(name, 0)


def env_never_or_int(name: str, default: int) -> int | None:
    """A count at least 0, or None ("never") when the variable is set and empty; unset: `default`."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    if raw.strip() == "":
        return None
    value = env_int(name, default)
    if value < 0:
        raise ImproperlyConfigured(f"{name} must be 0 or more, or empty for never")
    return value


def env_float(name: str, default: float) -> float:
    return _env_parsed(name, default, float, "a number")


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name, "")
    if raw == "":
        return default
    if raw.lower() in {"1", "true", "yes", "on"}:
        return True
    if raw.lower() in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name} must be true or false")


# The largest maximum accepted: about 24 days, far beyond any generation, and safe for
# the date arithmetic a deadline goes through.
DEADLINE_MS_CEILING = 2**31 - 1


def _ascii_int(raw: str) -> int | None:
    return ascii_int(raw, max_digits=15)


def env_gc_thresholds(name: str, default: tuple[int, int, int]) -> tuple[int, int, int]:
    """Three positive whole numbers, comma-separated: `gc.set_threshold`'s (0 would turn collection off)."""
    raw = os.environ.get(name, "")
    if raw.strip() == "":
        return default
    values = [_ascii_int(part.strip()) for part in raw.split(",")]
    if len(values) != 3 or not all(values):  # None (not a number) or 0
        raise ImproperlyConfigured(
            f"{name} must be three positive whole numbers, comma-separated (e.g. 700,100,10)"
        )
    return values[0], values[1], values[2]


def env_deadline_max_ms(name: str, default: int) -> int | None:
    """Return the largest accepted deadline, or None when deadlines are disabled.

    An empty value uses the default; a malformed one disables deadlines and
    logs one warning that does not contain the value.
    """
    raw = os.environ.get(name, "")
    if raw.strip() == "":
        return default
    value = _ascii_int(raw)
    if value is not None and 1 <= value <= DEADLINE_MS_CEILING:
        return value
    logger.warning("%s is malformed; generation deadlines are disabled", name)
    return None


def env_route_limits(name: str) -> dict[str, int]:
    """`/v1/messages=30000,/v1/responses=60000`: per-route deadline ceilings in ms."""
    limits = {}
    for item in filter(None, (part.strip() for part in os.environ.get(name, "").split(","))):
        path, _, raw_ms = item.partition("=")
        ms = _ascii_int(raw_ms.strip())
        if ms is None or not 1 <= ms <= DEADLINE_MS_CEILING:
            raise ImproperlyConfigured(f"{name} must be path=milliseconds pairs")
        limits[path.strip().rstrip("/")] = ms
    return limits


DEVELOPMENT_SECRET_KEY = "hordeops-development-key-not-secret"


def env_secret_key(name: str, path: Path) -> str:
    """The key that signs sessions and CSRF tokens: the variable, else the file `bin/stack` writes.

    A public default would let anyone forge a moderator's session, so without either one only
    a debug process starts, on a key that is marked as not secret.
    """
    key = os.environ.get(name, "").strip()
    if not key and path.is_file():
        key = path.read_text().strip()
    if key:
        return key
    if env_bool("DJANGO_DEBUG", False):
        return DEVELOPMENT_SECRET_KEY
    raise ImproperlyConfigured(
        f"{name} is not set and {path} does not exist: set {name}, or run bin/stack once to "
        "generate that file (DJANGO_DEBUG=true runs on a development key)"
    )


def env_list(name: str, default: tuple[str, ...] = ()) -> list[str]:
    """Comma-separated values, stripped, empty ones left out; `default` when the variable is
    not set at all (set and empty: none)."""
    if name not in os.environ:
        return list(default)
    return [item.strip() for item in os.environ[name].split(",") if item.strip()]


def env_host_ports(name: str) -> list[tuple[str, int]]:
    """`10.0.0.1:26379,10.0.0.2:26379`: hosts with their ports (Redis Sentinel's)."""
    found = []
    for item in env_list(name):
        host, _, port = item.rpartition(":")
        if not host or not port.isdigit():
            raise ImproperlyConfigured(f"{name} must be host:port pairs separated by commas")
        found.append((host.strip("[]"), int(port)))
    return found


def env_proxy_ssl_header(name: str) -> tuple[str, str] | None:
    """A header name (`X-Forwarded-Proto`) as Django's SECURE_PROXY_SSL_HEADER: (its META key, "https")."""
    header = os.environ.get(name, "").strip()
    if not header:
        return None
    if not header.replace("-", "").isascii() or not header.replace("-", "").isalnum():
        raise ImproperlyConfigured(f"{name} must be a header name, such as X-Forwarded-Proto")
    return "HTTP_" + header.upper().replace("-", "_"), "https"


def env_networks(name: str) -> tuple:
    """`10.0.0.1,192.168.0.0/16`: addresses and networks, as ip_network objects."""
    import ipaddress

    networks = []
    for item in filter(None, (part.strip() for part in os.environ.get(name, "").split(","))):
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ImproperlyConfigured(f"{name} must be IP addresses or networks, comma-separated") from None
    return tuple(networks)
