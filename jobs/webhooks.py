"""Webhooks: the AI Horde's POST after each done generation of a text request that names one
(`webhook` on POST /api/v2/generate/text/async), and the rules a hook must pass.

A hook is an https URL whose host resolves only to public addresses: not private, loopback,
link-local, shared, reserved or multicast (`public`). The host is resolved and checked when the
request is queued (400 `BadWebhook`) and again before each call, for its DNS may change in
between; the call then connects to the address just checked, with the hook's name as its Host
header and TLS server name (certificate checked against the name), so a name that rebinds to
another address after the check is never asked again. No redirect is followed, no proxy from
the environment is used. WEBHOOK_ALLOW_INSECURE lifts both rules, for tests and private
deployments.

Delivery is off the submit path: the accepted submit queues a Celery task on WEBHOOK_QUEUE
(`queue_delivery`), dropped when WEBHOOK_QUEUE_MAX wait there already. Each try is bounded by
WEBHOOK_TIMEOUT_SECONDS as a whole (resolution aside); a failed one is queued again
WEBHOOK_RETRY_SECONDS later, TRIES in all. No log line carries the prompt, the generation's text
or the hook's path: a hook is named by its host.
"""

import asyncio
import ipaddress
import logging
import socket
from enum import StrEnum
from typing import Any
from uuid import UUID

import httpx
from django.conf import settings
from django.db.models import F

from hordeops import celery_app, clock, errors, metrics
from jobs.models import Generation
from jobs.status import generation_details

logger = logging.getLogger(__name__)

# The AI Horde's: three tries, each a POST of the generation's details.
TRIES = 3
# The task that makes one try (`jobs/tasks.py` `deliver_webhook_task`), by its Celery name.
DELIVER_TASK = "jobs.tasks.deliver_webhook_task"
DEFAULT_PORTS = {"https": 443, "http": 80}
# NAT64's well-known prefix (RFC 6052): the IPv4 address it reaches is its last 32 bits.
NAT64 = ipaddress.ip_network("64:ff9b::/96")

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class Refused(Exception):
    """The hook may not be called: the message says why, as the 400 says it."""


class Unresolved(Exception):
    """The hook's host resolves to no address now."""


class Outcome(StrEnum):
    DELIVERED = "delivered"
    FAILED = "failed"  # this try failed; another is queued
    GAVE_UP = "gave_up"  # the last try failed
    REFUSED = "refused"  # its address (or scheme) is not allowed now
    GONE = "gone"  # no such done generation, or its request names no hook


def public(address: Address) -> bool:
    """Whether a hook may reach `address`: a global unicast address, judged by the IPv4
    address it carries where it carries one (IPv4-mapped, 6to4, NAT64)."""
    if address.version == 6:
        carried = address.ipv4_mapped or address.sixtofour
        if carried is None and address in NAT64:
            carried = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if carried is not None:
            return public(carried)
    return address.is_global and not address.is_multicast


def parse(url: str, *, insecure: bool) -> httpx.URL:
    """The hook's URL, or Refused: https (http too when `insecure`), a host, no user or password."""
    try:
        hook = httpx.URL(url)
    except httpx.InvalidURL:
        raise Refused("The webhook is not a URL.") from None
    if hook.scheme != "https" and not (insecure and hook.scheme == "http"):
        raise Refused(errors.BadWebhook.default_message)
    if not hook.raw_host:
        raise Refused("The webhook's URL names no host.")
    if hook.userinfo:
        raise Refused("A webhook's URL may not carry a user name or password.")
    return hook


def _host(hook: httpx.URL) -> str:
    return hook.raw_host.decode("ascii")  # IDNA-encoded; an IPv6 address without brackets


def resolve(hook: httpx.URL) -> list[Address]:
    """Every address the hook's host names now (an address literal: itself), or Unresolved."""
    host = _host(hook)
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    try:
        found = socket.getaddrinfo(host, hook.port or DEFAULT_PORTS[hook.scheme], type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        raise Unresolved() from None
    addresses = list(dict.fromkeys(ipaddress.ip_address(info[4][0]) for info in found))
    if not addresses:
        raise Unresolved()
    return addresses


def checked_address(hook: httpx.URL, *, insecure: bool) -> Address:
    """The address to call the hook at: the first its host resolves to, every one of which must
    be public unless `insecure`; else Refused (or Unresolved)."""
    addresses = resolve(hook)
    if not insecure:
        for address in addresses:
            if not public(address):
                raise Refused(
                    "webhooks may not point to a private, loopback or link-local address: "
                    f"{_host(hook)[:255]} is {address}."
                )
    return addresses[0]


def checked(url: str | None) -> str:
    """The webhook a request keeps ("" for none), checked as it is queued: BadWebhook where a
    call now would be refused, or its host does not resolve."""
    if not url:
        return ""
    insecure = settings.WEBHOOK_ALLOW_INSECURE
    try:
        hook = parse(url, insecure=insecure)
        checked_address(hook, insecure=insecure)
    except Refused as refusal:
        raise errors.BadWebhook(str(refusal)) from None
    except Unresolved:
        raise errors.BadWebhook(f"The webhook's host {_host(hook)[:255]} does not resolve.") from None
    return url


def queue_delivery(generation_id: UUID) -> None:
    """Queue the first try of a done generation's webhook (after the submit's commit): never
    fails the submit, which has happened whatever becomes of its hook."""
    try:
        send_later(generation_id)
    except Exception as error:
        logger.warning("Webhook of generation %s not queued (%s).", generation_id, type(error).__name__)


def send_later(generation_id: UUID, *, attempt: int = 1, countdown: float = 0) -> None:
    """Queue try `attempt` of the generation's webhook, `countdown` seconds from now. A first
    try is dropped when WEBHOOK_QUEUE_MAX deliveries wait already: one unreachable hook's
    backlog must not grow without bound."""
    if attempt == 1 and backlog() >= settings.WEBHOOK_QUEUE_MAX:
        logger.warning("Webhook of generation %s dropped: the webhook queue is full.", generation_id)
        metrics.increment(metrics.WEBHOOK_DELIVERIES, "dropped", now=clock.now())
        return
    # Sent by name: importing `jobs.tasks` here would tie the submit's modules into a circle.
    celery_app.send_task(
        DELIVER_TASK,
        (str(generation_id), attempt),
        queue=settings.WEBHOOK_QUEUE,
        countdown=countdown or None,
        retry=False,  # one publish: Redis gone, the submit answers at once all the same
    )


def backlog() -> int:
    """Deliveries waiting in WEBHOOK_QUEUE: kombu's Redis transport keeps a queue's messages in
    a list of its name (the ones with a countdown are held by a worker, not counted)."""
    from django_redis import get_redis_connection

    return get_redis_connection("default").llen(settings.WEBHOOK_QUEUE)


def body(generation: Generation) -> dict[str, Any]:
    """What the AI Horde posts for a text generation (`kobold` `get_details` with the request,
    the generation's id and its kudos): the status route's fields, and `id`, `request`, `kudos`."""
    details = generation_details(generation)
    return {
        "text": details["text"],
        "seed": details["seed"],
        "worker_id": str(details["worker_id"]),
        "worker_name": details["worker_name"],
        "model": details["model"],
        "id": str(generation.pk),
        "state": details["state"],
        "gen_metadata": details["gen_metadata"] or [],
        "request": str(generation.request_id),
        "kudos": generation.reward,
    }


def deliver(*, generation_id: UUID, attempt: int) -> Outcome:
    """Try `attempt` (of TRIES) of the generation's webhook: checked, then posted to the address
    checked; a failed try queues the next, WEBHOOK_RETRY_SECONDS later."""
    generation = (
        Generation.objects.filter(pk=generation_id, state=Generation.State.DONE)
        .select_related("worker")
        .annotate(webhook=F("request__webhook"))
        .only(*DETAILS, "worker__name")
        .first()
    )
    if generation is None or not generation.webhook:
        return Outcome.GONE
    insecure = settings.WEBHOOK_ALLOW_INSECURE
    status = None
    try:
        hook = parse(generation.webhook, insecure=insecure)
        status = post(hook, checked_address(hook, insecure=insecure), body(generation))
    except Refused as refusal:
        logger.warning("Webhook of generation %s refused: %s", generation_id, refusal)
        metrics.increment(metrics.WEBHOOK_DELIVERIES, "refused", now=clock.now())
        return Outcome.REFUSED
    except Exception as error:  # unresolved, unreachable, too slow, not HTTP: a failed try
        failure = type(error).__name__
    else:
        failure = f"HTTP {status}"
    # Named by its host alone: a hook's path or query may hold its owner's secret.
    what = f"Webhook of generation {generation_id} to {_host(hook)[:255]}"
    if status is not None and 200 <= status < 300:
        logger.info("%s delivered (try %s).", what, attempt)
        metrics.increment(metrics.WEBHOOK_DELIVERIES, "delivered", now=clock.now())
        return Outcome.DELIVERED
    if attempt < TRIES:
        logger.info("%s failed (try %s: %s).", what, attempt, failure)
        send_later(generation_id, attempt=attempt + 1, countdown=settings.WEBHOOK_RETRY_SECONDS)
        return Outcome.FAILED
    logger.warning("%s failed %s times (%s): given up.", what, TRIES, failure)
    metrics.increment(metrics.WEBHOOK_DELIVERIES, "gave_up", now=clock.now())
    return Outcome.GAVE_UP


# The generation's fields its body reads.
DETAILS = ("text", "seed", "gen_metadata", "worker", "model", "result", "request", "reward")


def post(hook: httpx.URL, address: Address, payload: dict[str, Any]) -> int:
    """POST `payload` as JSON to `hook` at `address`; the answer's status. The whole exchange,
    up to the answer's head, within WEBHOOK_TIMEOUT_SECONDS; its body is never read."""
    timeout = settings.WEBHOOK_TIMEOUT_SECONDS
    return asyncio.run(asyncio.wait_for(_post(hook, address, payload, timeout=timeout), timeout))


async def _post(hook: httpx.URL, address: Address, payload: dict[str, Any], *, timeout: float) -> int:
    # Connected to the address checked, named as the hook names its host: the Host header
    # (with any port), and for https the TLS server name the certificate is checked against.
    target = hook.copy_with(host=str(address))
    extensions = {"sni_hostname": _host(hook)} if hook.scheme == "https" else {}
    headers = {"Host": hook.netloc.decode("ascii"), "User-Agent": "hordeops-webhook"}
    async with httpx.AsyncClient(timeout=timeout, follow_redirects=False, trust_env=False) as client:
        request = client.build_request("POST", target, json=payload, headers=headers, extensions=extensions)
        response = await client.send(request, stream=True)
        await response.aclose()
        return response.status_code
