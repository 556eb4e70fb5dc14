"""The stream lease of a generation, kept in Redis and decided by one Lua script.

The lease hash holds the pop time, the lease end, the cap, the last progress `seq` and the
length of the output relayed so far. Each post that relays copies that length to the row
(`Generation.relayed_bytes`), so that a lease Redis lost is rebuilt with it and the job's output
bound does not start again with a new Redis. One script checks the post's `seq`, relays its delta to
the requester's relay stream (with `jobs.relay.APPEND_LUA`) and moves the lease end, all
atomically: two posts at once can neither both renew nor interleave their deltas. The stale
pass marks the leases it aborts `dead`, so that no later post can renew or relay for them.
"""

import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from uuid import UUID

from django.conf import settings
from django.db import connection
from django_redis import get_redis_connection

from hordeops import metrics
from jobs import sql
from jobs.models import Generation
from jobs.relay import APPEND_LUA, FOLLOWER_GONE_LUA, KEY_GRACE_SECONDS, followed_key, relay_key


class Outcome(StrEnum):
    """What the lease script decided for one progress post (the script writes these values)."""

    GRANTED = "granted"  # new output: the lease end moved
    AT_CAP = "at_cap"  # new output, but the lease end is held at the cap
    NOT_RENEWED = "not_renewed"  # an empty delta: relayed nothing, renewed nothing
    LAPSED = "lapsed"  # new output after the lease end: relayed, not renewed
    RETRY = "retry"  # a seq already taken: nothing done again
    GAP = "gap"  # a seq past the next one: refused
    DEAD = "dead"  # the lease was ended (aborted, cancelled, submitted): refused
    TOO_LONG = "too_long"  # past the job's output bound: refused
    LOST = "lost"  # Redis lost the lease (a restart) and nobody follows the request: refused
    GONE = "gone"  # the request's follower is gone (its web process died): refused


# What a worker is told, of the outcomes it is told at all (the progress answer's `lease`).
ANSWERED = (Outcome.GRANTED, Outcome.AT_CAP, Outcome.NOT_RENEWED, Outcome.LAPSED)

# The lease hash's field that `kill` sets: no post may renew or relay once it is there.
KILLED_FIELD = "dead"


def cap_seconds(*, trusted: bool) -> int:
    """The lease cap fixed at the pop, measured from it: tighter for an untrusted worker."""
    if trusted:
        return settings.TRUSTED_TEXT_JOB_LEASE_CAP_SECONDS
    return settings.UNTRUSTED_TEXT_JOB_LEASE_CAP_SECONDS


def initial_job_ttl(cap: int) -> int:
    """The lease from the pop: TEXT_JOB_LEASE_SECONDS, never past the cap."""
    return min(settings.TEXT_JOB_LEASE_SECONDS, cap)


# Since when (Unix seconds, the posts' clock) this Redis has held leases: set by the first
# post it sees (which finds no lease: a new Redis has none), so that a lease missing from a
# Redis that started after the pop reads as lost (a restart), not as a worker's first post.
SINCE_KEY = "hordeops:leases-since"

# KEYS: lease hash, relay stream, metrics hash, this minute's metrics hash, SINCE_KEY, the
#       request's followed key.
# ARGV: now, seq, delta, step, popped_at, initial lease end, cap end, trust, generation id,
#       key ttl, tokens, minute hash ttl, output limit (bytes), output relayed (bytes, the row's),
#       tool-call pieces (JSON, "" for none: output as the delta is, relayed beside it), the
#       model of a stream this post committed ("" for none: relayed with the delta, so that the
#       follower knows the stream committed).
# Returns {outcome, lease_end, last_seq, output_len} (output_len only where the delta was
# relayed); outcome is one of granted, at_cap, not_renewed, lapsed, retry, gap, dead, too_long
# (the delta would take the output past its limit: it is neither relayed nor counted, and its
# seq is not taken), lost, gone (the request had a follower and has none now: nothing is
# relayed to no one).
# A missing lease is made from the row's values (ARGV). Past a first post (seq > 1) in a Redis
# that started after the pop, it was lost: rebuilt taking this seq as the next one while a
# requester still follows the relay channel, else `lost`; its output so far is the row's.
_RENEW_LUA = """
local lease, relay, counters, minute = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local now = tonumber(ARGV[1])
local seq = tonumber(ARGV[2])
local delta = ARGV[3]
local step = tonumber(ARGV[4])
local trust = ARGV[8]
local function count(outcome)
  local field = 'horde_text_lease_renewals|' .. outcome .. '|' .. trust
  redis.call('HINCRBY', counters, field, 1)
  redis.call('HINCRBY', minute, field, 1)
  redis.call('EXPIRE', minute, tonumber(ARGV[12]))
end
if redis.call('EXISTS', lease) == 0 then
  -- Only here: after a Redis start the first post of any kind finds its lease missing.
  redis.call('SET', KEYS[5], ARGV[1], 'NX')
  local taken, relayed = 0, 0
  if seq > 1 and tonumber(redis.call('GET', KEYS[5])) > tonumber(ARGV[5]) then
    if redis.call('PUBSUB', 'NUMSUB', relay)[2] == 0 then
      return {'{LOST}', ARGV[6], 0}
    end
    taken, relayed = seq - 1, tonumber(ARGV[14])
  end
  redis.call('HSET', lease, 'popped_at', ARGV[5], 'lease_end', ARGV[6], 'cap_end', ARGV[7],
             'last_seq', taken, 'output_len', relayed)
  redis.call('EXPIRE', lease, tonumber(ARGV[10]))
end
local state = redis.call('HMGET', lease, '{KILLED_FIELD}', 'last_seq', 'lease_end', 'cap_end', 'output_len')
if state[1] then
  -- Killed, perhaps before any post created it: the other fields may be missing.
  return {'{DEAD}', state[3] or '0', tonumber(state[2]) or 0}
end
if follower_gone(relay, KEYS[6]) then
  return {'{GONE}', state[3], tonumber(state[2])}
end
local last, lease_end, cap_end = tonumber(state[2]), tonumber(state[3]), tonumber(state[4])
if seq <= last then
  return {'{RETRY}', state[3], last}
end
if seq > last + 1 then
  return {'{GAP}', state[3], last}
end
local calls = ARGV[15]
if (tonumber(state[5]) or 0) + string.len(delta) + string.len(calls) > tonumber(ARGV[13]) then
  return {'{TOO_LONG}', state[3], last}
end
redis.call('HSET', lease, 'last_seq', seq)
if ARGV[11] ~= '' then
  redis.call('HSET', lease, 'tokens', ARGV[11])
end
if delta == '' and calls == '' then
  return {'{NOT_RENEWED}', state[3], seq}
end
local relayed = redis.call('HINCRBY', lease, 'output_len', string.len(delta) + string.len(calls))
local fields = {'type', 'delta', 'generation', ARGV[9], 'seq', ARGV[2], 'text', delta}
if calls ~= '' then
  fields[#fields + 1] = 'tool_calls'
  fields[#fields + 1] = calls
end
if ARGV[16] ~= '' then
  fields[#fields + 1] = 'model'
  fields[#fields + 1] = ARGV[16]
end
relay_append(relay, tonumber(ARGV[10]), fields)
if now > lease_end then
  return {'{LAPSED}', state[3], seq, relayed}
end
local wanted = string.format('%.6f', now + step)
if tonumber(wanted) > cap_end then
  if lease_end >= cap_end then
    count('{AT_CAP}')
    return {'{AT_CAP}', state[3], seq, relayed}
  end
  -- Held at the cap: stored as the cap's own string, so that the next post compares equal.
  wanted = state[4]
end
redis.call('HSET', lease, 'lease_end', wanted)
count('{GRANTED}')
return {'{GRANTED}', wanted, seq, relayed}
"""
# The outcomes as the script writes them (the enum's values) and the killed field's name,
# put in where `{NAME}` stands.
RENEW_SCRIPT = (APPEND_LUA + FOLLOWER_GONE_LUA + _RENEW_LUA).replace("{KILLED_FIELD}", KILLED_FIELD)
for _outcome in Outcome:
    RENEW_SCRIPT = RENEW_SCRIPT.replace("{" + _outcome.name + "}", _outcome.value)
assert not re.search(r"\{[A-Z_]+\}", RENEW_SCRIPT), "a placeholder of the lease script has no value"


def lease_key(generation_id: UUID) -> str:
    return f"hordeops:lease:{generation_id}"


def _redis():
    return get_redis_connection("default")


_script = None


def _renew_script():
    global _script
    if _script is None:
        _script = _redis().register_script(RENEW_SCRIPT)
    return _script


@dataclass(frozen=True)
class Renewal:
    """What one progress post did to its lease: the outcome the worker is told (a repeated
    seq reads as what it would be now), the lease end (Unix seconds) and the last seq taken."""

    outcome: Outcome
    lease_end: float
    last_seq: int

    @property
    def expires_at(self) -> datetime:
        return datetime.fromtimestamp(self.lease_end, tz=UTC)

    def ttl(self, now: datetime) -> int:
        """Whole seconds left on the lease."""
        return max(0, math.floor(self.lease_end - now.timestamp()))


def renew(
    generation: Generation,
    *,
    seq: int,
    delta: str,
    tokens: int | None,
    now: datetime,
    calls: str = "",
    model: str = "",
) -> Renewal:
    """Decide one progress post on `generation` (its request loaded) and write what it moved.
    `model`: the post committed the request's stream to the generation, served by it.

    The script checks the seq, relays the delta and moves the lease end in Redis; a granted
    renewal is then written to the row as its job_ttl, which is what the stale pass reads. A
    row the pass aborted in between is not written: its lease is killed and the post is DEAD,
    so that no generation is ever aborted with a live stream lease."""
    popped = generation.popped_at.timestamp()
    outcome, lease_end, last_seq, *output_len = _renew_script()(
        keys=[
            lease_key(generation.pk),
            relay_key(generation.request_id),
            metrics.METRICS_KEY,
            metrics.minute_key(now),
            SINCE_KEY,
            followed_key(generation.request_id),
        ],
        args=[
            repr(now.timestamp()),
            seq,
            delta,
            settings.TEXT_JOB_LEASE_SECONDS,
            repr(popped),
            repr(popped + generation.job_ttl),
            repr(popped + generation.cap_seconds),
            metrics.trust_label(generation.trusted_at_pop),
            str(generation.pk),
            generation.cap_seconds + KEY_GRACE_SECONDS,
            "" if tokens is None else tokens,
            metrics.MINUTE_KEY_TTL_SECONDS,
            generation.request.output_limit_bytes,
            generation.relayed_bytes,
            calls,
            model,
        ],
    )
    renewal = Renewal(outcome=Outcome(outcome.decode()), lease_end=float(lease_end), last_seq=int(last_seq))
    relayed = int(output_len[0]) if output_len else None
    if renewal.outcome == Outcome.RETRY:
        lapsed = now.timestamp() > renewal.lease_end
        return Renewal(Outcome.LAPSED if lapsed else Outcome.NOT_RENEWED, renewal.lease_end, renewal.last_seq)
    if renewal.outcome == Outcome.GRANTED:
        # To the millisecond, rounded up (never short of Redis's end; rounding to microseconds
        # first drops float noise), and never past the cap.
        seconds = math.ceil(round(renewal.lease_end - popped, 6) * 1000) / 1000
        with connection.cursor() as cursor:
            cursor.execute(sql.renew(), [min(generation.cap_seconds, seconds), relayed, generation.pk])
            written = cursor.rowcount
        if not written:
            kill([generation.pk])
            return Renewal(Outcome.DEAD, renewal.lease_end, renewal.last_seq)
    elif relayed is not None:  # relayed, not renewed (at the cap, lapsed)
        with connection.cursor() as cursor:
            cursor.execute(sql.relayed(), [relayed, generation.pk])
    return renewal


def kill(generation_ids: list[UUID]) -> None:
    """Mark leases dead: no later post may renew them or relay through them."""
    if not generation_ids:
        return
    pipe = _redis().pipeline(transaction=False)
    for generation_id in generation_ids:
        key = lease_key(generation_id)
        pipe.hset(key, KILLED_FIELD, 1)
        pipe.expire(key, KEY_GRACE_SECONDS)
    pipe.execute()


def states(generation_ids: list[UUID]) -> list[dict[str, str]]:
    """The lease hashes of several generations, in one round trip."""
    pipe = _redis().pipeline(transaction=False)
    for generation_id in generation_ids:
        pipe.hgetall(lease_key(generation_id))
    return [{k.decode(): v.decode() for k, v in raw.items()} for raw in pipe.execute()]


def at_submit(generation: Generation) -> tuple[str | None, bool]:
    """What a submit reads of a relayed generation, in one round trip: the worker's last
    reported token count (None if it sent none) and whether its request's follower is gone."""
    request_id = generation.request_id
    pipe = _redis().pipeline(transaction=False)
    pipe.hget(lease_key(generation.pk), "tokens")
    pipe.exists(followed_key(request_id))
    pipe.pubsub_numsub(relay_key(request_id))
    tokens, followed, ((_, subscribers),) = pipe.execute()
    return (tokens.decode() if tokens else None), bool(followed) and not subscribers


def state(generation_id: UUID) -> dict[str, str]:
    """The lease hash as stored (empty before the first progress post)."""
    return {k.decode(): v.decode() for k, v in _redis().hgetall(lease_key(generation_id)).items()}
