"""The statement that posts a kudos event, as common table expressions another statement can
carry: a submit posts its generation's kudos in its own one statement (`jobs.sql.posts.accept`),
a queued request its horde tax in the queueing one. Holds are placed, drawn down and released
the same way (`hold`, `draw_holds`, `release_holds`), and what an account may spend is read
under its lock (`LOCK_ACCOUNT`, `available`).

Its parameters are `kudos.ledger.event_params`; `guard` says when to post (the event is posted
only if the statement did what it pays for). One event, once for its key: its postings, the
balances it moves (account wallets created as they are first moved, locked in the order of the
entries, which `event_params` sorts, so that no two events wait on each other in a cycle), and
a floor event for what a movement past an account's floor forgave, posted as minted.
"""

from kudos import rates
from kudos.models import Event, Hold, Posting, Wallet
from workers.models import Account

WALLETS, EVENTS, POSTINGS = Wallet._meta.db_table, Event._meta.db_table, Posting._meta.db_table
HOLDS = Hold._meta.db_table
ACCOUNTS = Account._meta.db_table
TREASURY = Wallet.System.TREASURY.value
FORGIVEN = Event.Kind.FORGIVEN.value
FLOOR_SUFFIX = ":floor"


# The account's row, locked until the transaction ends: what it may spend is read and spent one
# at a time (a request queued, a transfer sent), so two cannot both spend its last kudos; the
# app that queues requests also counts them under it. NO KEY: a ledger event that creates one
# of its wallets checks the row's key meanwhile, and must not wait for the lock.
LOCK_ACCOUNT = f"SELECT 1 FROM {ACCOUNTS} WHERE id = %(account_id)s FOR NO KEY UPDATE"
# Two accounts' transfers to each other, one at a time (%(pair)s names the pair in id order):
# each reads the other's reverse-transfer guard. The two-key advisory space, apart from the
# stale pass's one-key lock; its first key (b"kt", kudos transfers) namespaces it.
LOCK_TRANSFER_PAIR = "SELECT pg_advisory_xact_lock(27508, hashtext(%(pair)s))"

# Every account's id by spendable kudos, most first (no wallet: 0), ties by id, as one array:
# the users list's order (`kudos.details`). A sort of every account: balances are not indexed,
# which would cost every posted event an index write.
ACCOUNTS_BY_KUDOS = (
    f"SELECT array_agg(a.id ORDER BY COALESCE(w.balance, 0) DESC, a.id) FROM {ACCOUNTS} AS a "
    f"LEFT JOIN {WALLETS} AS w ON w.account_id = a.id AND NOT w.escrow"
)

# What the account's (%(account_id)s) holds add up to (on `hold_by_account`).
HELD = f"(SELECT COALESCE(sum(h.amount), 0) FROM {HOLDS} AS h WHERE h.account_id = %(account_id)s)"


# The account's (%(account_id)s) spendable balance, 0 before its wallet exists.
BALANCE = f"""COALESCE((SELECT w.balance FROM {WALLETS} AS w
                       WHERE w.account_id = %(account_id)s AND NOT w.escrow), 0)"""


def available(balance: str = BALANCE) -> str:
    """What the account (%(account_id)s, its floor %(floor)s) may spend, its spendable balance
    being `balance`: that less its floor less what its holds keep. Read under LOCK_ACCOUNT."""
    return f"{balance} - %(floor)s - {HELD}"


# Whether the account %(target)s sent kudos to %(source)s since %(since)s: a transfer event of
# the ledger's with a debit of the one's spendable wallet and a credit of the other's, among
# the recent transfers (`event_recent_transfer`).
SENT_SINCE = f"""
    SELECT EXISTS (
        SELECT FROM {EVENTS} AS e
        WHERE e.kind = '{Event.Kind.TRANSFER.value}' AND e.created_at > %(since)s
          AND EXISTS (SELECT FROM {POSTINGS} AS p JOIN {WALLETS} AS w ON w.id = p.wallet_id
                      WHERE p.event_id = e.id AND p.amount < 0 AND w.account_id = %(target)s AND NOT w.escrow)
          AND EXISTS (SELECT FROM {POSTINGS} AS p JOIN {WALLETS} AS w ON w.id = p.wallet_id
                      WHERE p.event_id = e.id AND p.amount > 0 AND w.account_id = %(source)s AND NOT w.escrow)
    )"""


def hold(*, rows: str) -> str:
    """The CTE `k_held` (to follow a WITH) that places a hold for each of `rows` (a relation of
    request_id, account_id, amount): a request's cost, placed by the statement that queues it."""
    return f"""
        k_held AS (
            INSERT INTO {HOLDS} (request_id, account_id, amount)
            SELECT h.request_id, h.account_id, GREATEST(h.amount, 0) FROM ({rows}) AS h
            RETURNING request_id
        )"""


def draw_holds(*, rows: str) -> str:
    """The CTE `k_drawn` that draws each hold of `rows` (request_id, charged) down by what its
    request was charged, never below zero: a generation settled while its request is active."""
    return f"""
        k_drawn AS (
            UPDATE {HOLDS} AS h SET amount = GREATEST(h.amount - d.charged, 0)
            FROM ({rows}) AS d WHERE h.request_id = d.request_id
            RETURNING h.request_id
        )"""


def release_holds(*, rows: str) -> str:
    """The CTE `k_released` that releases the holds of `rows` (request_id): their requests ended.
    A request's hold is drawn down or released by one statement, never both (a row changes once
    per statement)."""
    return f"""
        k_released AS (
            DELETE FROM {HOLDS} AS h USING ({rows}) AS r WHERE h.request_id = r.request_id
            RETURNING h.request_id
        )"""


def post_event(*, guard: str = "true") -> str:
    """The CTEs (`k_*`, to follow a WITH) that post the event of `kudos.ledger.event_params`
    if `guard` holds and its key was never posted; `k_event` holds its id if it was posted now."""
    # An account wallet's floor, set when it is created: the anonymous account's, a
    # pseudonymous one's, or any other's (`rates.floor`).
    floor = (
        "CASE WHEN m.escrow THEN NULL "
        f"WHEN a.api_key_hash = %(k_anonymous)s THEN {rates.ANONYMOUS_FLOOR} "
        f"WHEN a.pseudonymous THEN {rates.PSEUDONYMOUS_FLOOR} "
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
    transfer, tax = Event.Kind.TRANSFER.value, Event.Kind.TAX.value
    return f"""
        WITH posted AS (
            SELECT p.wallet_id, a.action, sum(p.amount) AS total
            FROM {POSTINGS} AS p JOIN {EVENTS} AS e ON e.id = p.event_id,
                 LATERAL (SELECT CASE WHEN e.kind = '{transfer}' AND p.amount < 0 THEN '{Event.GIFTED}'
                                      WHEN e.kind = '{transfer}' THEN '{Event.ACTIONS[Event.Kind.TRANSFER]}'
                                      WHEN e.kind = '{tax}' AND p.amount > 0 THEN '{Event.STYLED}'
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
