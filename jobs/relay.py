"""The relay from workers to requesters: one Redis stream per request, announced on pub/sub.

Every event is appended to the request's stream, the log a follower reads from its start,
and published with its stream id on a channel of the same name, by one Lua function
(`APPEND_LUA`) that the lease script (progress deltas) and `publish_many` (done, restarted,
failed) share. Any web process can serve a requester's stream, whichever process the worker
posted to: nothing is held in one process's memory but who is following what. This module
writes the streams and names their keys; `jobs.relay_hub` follows them for a web process.

A follower is known to be alive, not assumed: once its subscription holds it marks the request
followed (`followed_key`), and unmarks it before it unsubscribes when it leaves; a request that
is marked but whose channel has no subscriber has lost its follower (its web process died:
Redis drops a dead process's connection, and with it the subscription). `FOLLOWER_GONE_LUA`
and `followers_gone` tell; the progress posts, the submit and the stale pass cancel such a
request.
"""

import hashlib
from dataclasses import dataclass
from uuid import UUID

import redis.exceptions
from django.conf import settings
from django_redis import get_redis_connection

# Event types besides "delta" (written by the lease script).
DONE = "done"  # the generation was submitted: text is the whole reply
RESTARTED = "restarted"  # the generation was aborted or given back and its job requeued
FAILED = "failed"  # the request ended without a reply: code says why

# How long (an hour) a lease or relay key outlives its cap, so that late posts still find it dead.
KEY_GRACE_SECONDS = 3600
# How long a request's relay stream is kept once its last event (done, failed) is written:
# long enough for a follower that is just starting to read it, and no longer.
FINISHED_RELAY_SECONDS = 60
FINAL_EVENTS = frozenset({DONE, FAILED})

# relay_append(key, ttl, fields): XADD the flat field list, renew the key's ttl, publish
# [id, fields] as JSON on the channel named like the key; returns the id.
APPEND_LUA = """
local function relay_append(key, ttl, fields)
  local id = redis.call('XADD', key, '*', unpack(fields))
  redis.call('EXPIRE', key, ttl)
  redis.call('PUBLISH', key, cjson.encode({id, fields}))
  return id
end
"""

# KEYS: relay stream. ARGV: key ttl, then field, value, ... (all strings).
PUBLISH_SCRIPT = (
    APPEND_LUA
    + """
local fields = {}
for i = 2, #ARGV do fields[#fields + 1] = ARGV[i] end
return relay_append(KEYS[1], tonumber(ARGV[1]), fields)
"""
)


def relay_key(request_id: UUID | str) -> str:
    return f"hordeops:relay:{request_id}"


def followed_key(request_id: UUID | str) -> str:
    """Set once a follower's subscription to the request's channel holds."""
    return f"hordeops:followed:{request_id}"


# follower_gone(relay, followed): whether the request had a follower and its channel has none now.
FOLLOWER_GONE_LUA = """
local function follower_gone(relay, followed)
  return redis.call('EXISTS', followed) == 1 and redis.call('PUBSUB', 'NUMSUB', relay)[2] == 0
end
"""


def followers_gone(request_ids: list[UUID]) -> set[UUID]:
    """Those of the requests that had a follower and have none now, in one round trip."""
    if not request_ids:
        return set()
    pipe = get_redis_connection("default").pipeline(transaction=False)
    for request_id in request_ids:
        pipe.exists(followed_key(request_id))
    pipe.pubsub_numsub(*(relay_key(request_id) for request_id in request_ids))
    *marked, subscribers = pipe.execute()
    followed = {channel.decode(): count for channel, count in subscribers}
    return {
        request_id
        for request_id, was_followed in zip(request_ids, marked, strict=True)
        if was_followed and not followed.get(relay_key(request_id))
    }


def useful(text: str, calls) -> bool:
    """Output that may commit a stream: text that is not only white space, or a piece of a tool
    call. White space alone is held in preflight (`jobs.follower`)."""
    return bool(text.strip() or calls)


@dataclass(frozen=True)
class Event:
    id: str
    type: str
    generation: str
    fields: dict[str, str]

    @property
    def text(self) -> str:
        return self.fields.get("text", "")

    @classmethod
    def from_entry(cls, entry_id: str, fields: dict[str, str]) -> "Event":
        rest = dict(fields)
        return cls(id=entry_id, type=rest.pop("type"), generation=rest.pop("generation", ""), fields=rest)


_PUBLISH_SHA = hashlib.sha1(PUBLISH_SCRIPT.encode()).hexdigest()


def publish(request_id: UUID, type_: str, generation_id: UUID | str = "", **fields: str | int) -> None:
    """Append one event to the request's relay stream."""
    publish_many([(request_id, type_, str(generation_id), {k: str(v) for k, v in fields.items()})])


def publish_many(events: list[tuple[UUID, str, str, dict[str, str]]]) -> None:
    """Append several events in one round trip: (request id, type, generation id, fields).

    EVALSHA by hand: redis-py's pipelined Script asks SCRIPT EXISTS on every execute, a
    second round trip. Redis answers NOSCRIPT to every call of a script it does not hold,
    so none of them ran, and the pipeline is sent again once the script is loaded.
    """
    if not events:
        return
    client = get_redis_connection("default")
    live_ttl = settings.TEXT_REQUEST_LIFETIME_SECONDS + KEY_GRACE_SECONDS
    calls = []
    for request_id, type_, generation_id, fields in events:
        flat = ["type", type_, "generation", generation_id]
        for name, value in fields.items():
            flat += [name, value]
        ttl = FINISHED_RELAY_SECONDS if type_ in FINAL_EVENTS else live_ttl
        calls.append((relay_key(request_id), ttl, *flat))

    def send() -> None:
        pipe = client.pipeline(transaction=False)
        for key, *args in calls:
            pipe.evalsha(_PUBLISH_SHA, 1, key, *args)
        pipe.execute()

    try:
        send()
    except redis.exceptions.NoScriptError:
        client.script_load(PUBLISH_SCRIPT)
        send()
