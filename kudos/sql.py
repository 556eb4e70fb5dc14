"""The statement that posts a kudos event, as common table expressions another statement can
carry: a submit posts its generation's kudos in its own one statement (`jobs.sql.posts.accept`),
a queued request its horde tax in the queueing one.

Its parameters are `kudos.ledger.event_params`; `guard` says when to post (the event is posted
only if the statement did what it pays for). One event, once for its key: its postings, the
balances it moves (account wallets created as they are first moved, locked in the order of the
entries, which `event_params` sorts, so that no two events wait on each other in a cycle), and
a floor event for what a movement past an account's floor forgave, posted as minted.
"""

from kudos import rates
from kudos.models import Event, Posting, Wallet
from workers.models import Account

WALLETS, EVENTS, POSTINGS = Wallet._meta.db_table, Event._meta.db_table, Posting._meta.db_table
ACCOUNTS = Account._meta.db_table
TREASURY = Wallet.System.TREASURY.value
FORGIVEN = Event.Kind.FORGIVEN.value
FLOOR_SUFFIX = ":floor"


def post_event(*, guard: str = "true") -> str:
    """The CTEs (`k_*`, to follow a WITH) that post the event of `kudos.ledger.event_params`
    if `guard` holds and its key was never posted; `k_event` holds its id if it was posted now."""
    # An account wallet's floor, set when it is created: the anonymous account's, or any other's.
    floor = (
        "CASE WHEN m.escrow THEN NULL "
        f"WHEN a.api_key_hash = %(k_anonymous)s THEN {rates.ANONYMOUS_FLOOR} "
        f"ELSE {rates.ACCOUNT_FLOOR} END::numeric"
    )
    # A moved wallet's proposed row holds its movement clamped at its floor and what that
    # forgave, so the movement itself is their difference.
    moved = "(EXCLUDED.balance - EXCLUDED.forgiven)"
    return f"""
        k_event AS (
            INSERT INTO {EVENTS} (kind, key, reason, created_at, records)
            SELECT %(k_kind)s, %(k_key)s, %(k_reason)s, %(k_now)s, %(k_records)s::jsonb WHERE {guard}
            ON CONFLICT (key) DO NOTHING
            RETURNING id
        ),
        k_moves AS (
            SELECT (e->>0)::bigint AS account_id, (e->>1)::boolean AS escrow, (e->>2)::numeric AS amount,
                   e->>3 AS action, i
            FROM jsonb_array_elements(%(k_moves)s::jsonb) WITH ORDINALITY AS x(e, i)
        ),
        k_moved AS (
            INSERT INTO {WALLETS} AS w (account_id, escrow, floor, balance, forgiven, details)
            SELECT m.account_id, m.escrow, f.floor, GREATEST(m.amount, f.floor),
                   GREATEST(f.floor - m.amount, 0),
                   CASE WHEN m.action IS NULL THEN '{{}}'::jsonb
                        ELSE jsonb_build_object(m.action, m.amount) END
                   || CASE WHEN m.escrow THEN '{{}}'::jsonb
                           ELSE COALESCE(%(k_records)s::jsonb -> m.account_id::text, '{{}}'::jsonb) END
            FROM k_moves AS m JOIN {ACCOUNTS} AS a ON a.id = m.account_id,
                 LATERAL (SELECT {floor} AS floor) AS f
            WHERE EXISTS (SELECT FROM k_event)
            ORDER BY m.i
            ON CONFLICT (account_id, escrow) DO UPDATE SET
                balance = GREATEST(w.balance + {moved}, w.floor),
                forgiven = GREATEST(w.floor - (w.balance + {moved}), 0),
                details = w.details || (
                    SELECT COALESCE(jsonb_object_agg(x.key, COALESCE((w.details->>x.key)::numeric, 0)
                                                            + x.value::numeric), '{{}}'::jsonb)
                    FROM jsonb_each_text(EXCLUDED.details) AS x)
            RETURNING w.id, w.account_id, w.escrow, w.forgiven
        ),
        k_posted AS (
            INSERT INTO {POSTINGS} (event_id, wallet_id, amount)
            SELECT e.id, w.id, m.amount
            FROM k_event AS e, k_moved AS w JOIN k_moves AS m USING (account_id, escrow)
            WHERE m.amount <> 0
            UNION ALL
            SELECT e.id, s.id, (x.value)::numeric
            FROM k_event AS e, jsonb_each_text(%(k_systems)s::jsonb) AS x
                 JOIN {WALLETS} AS s ON s.system = x.key
            RETURNING id
        ),
        k_floored AS (
            INSERT INTO {EVENTS} (kind, key, reason, created_at)
            SELECT '{FORGIVEN}', %(k_key)s || '{FLOOR_SUFFIX}', '', %(k_now)s
            WHERE EXISTS (SELECT FROM k_moved WHERE forgiven > 0)
            RETURNING id
        ),
        k_floor_posted AS (
            INSERT INTO {POSTINGS} (event_id, wallet_id, amount)
            SELECT f.id, w.id, w.forgiven FROM k_floored AS f, k_moved AS w WHERE w.forgiven > 0
            UNION ALL
            SELECT f.id, s.id, -(SELECT sum(forgiven) FROM k_moved)
            FROM k_floored AS f JOIN {WALLETS} AS s ON s.system = '{TREASURY}'
            RETURNING id
        )"""


def post() -> str:
    """`post_event` on its own: the event's id if it was posted now, else NULL; and what it forgave."""
    return f"""
        WITH {post_event()}
        SELECT (SELECT id FROM k_event), COALESCE((SELECT sum(forgiven) FROM k_moved), 0)
    """


def drifted_details() -> str:
    """Spendable wallets whose `details` differ from their postings summed by action
    (`Event.action`) and their events' `records`: (account id, kept, posted)."""
    action = "CASE " + " ".join(
        f"WHEN e.kind = '{kind.value}' THEN '{name}'"
        for kind, name in Event.ACTIONS.items()
        if kind != Event.Kind.TRANSFER
    )
    transfer = Event.Kind.TRANSFER.value
    return f"""
        WITH posted AS (
            SELECT p.wallet_id, a.action, sum(p.amount) AS total
            FROM {POSTINGS} AS p JOIN {EVENTS} AS e ON e.id = p.event_id,
                 LATERAL (SELECT CASE WHEN e.kind = '{transfer}' AND p.amount < 0 THEN '{Event.GIFTED}'
                                      WHEN e.kind = '{transfer}' THEN '{Event.ACTIONS[Event.Kind.TRANSFER]}'
                                      ELSE ({action} END) END AS action) AS a
            WHERE a.action IS NOT NULL
            GROUP BY p.wallet_id, a.action
            UNION ALL
            SELECT w.id, x.key, sum(x.value::numeric)
            FROM {EVENTS} AS e
                 CROSS JOIN LATERAL jsonb_each(e.records) AS r(account, kept)
                 CROSS JOIN LATERAL jsonb_each_text(r.kept) AS x
                 JOIN {WALLETS} AS w ON w.account_id = r.account::bigint AND NOT w.escrow
            WHERE e.records IS NOT NULL
            GROUP BY w.id, x.key
        ),
        expected AS (
            SELECT w.id, COALESCE((SELECT jsonb_object_agg(action, total) FROM posted WHERE wallet_id = w.id),
                                  '{{}}'::jsonb) AS details
            FROM {WALLETS} AS w WHERE w.account_id IS NOT NULL AND NOT w.escrow
        )
        SELECT w.account_id, w.details, x.details FROM {WALLETS} AS w JOIN expected AS x ON x.id = w.id
        WHERE (SELECT COALESCE(jsonb_object_agg(k, v::numeric), '{{}}'::jsonb)
               FROM jsonb_each_text(w.details) AS d(k, v) WHERE v::numeric <> 0)
           <> (SELECT COALESCE(jsonb_object_agg(k, v::numeric), '{{}}'::jsonb)
               FROM jsonb_each_text(x.details) AS d(k, v) WHERE v::numeric <> 0)
    """
