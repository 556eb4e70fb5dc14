"""Fill the horde's tables fast, in set-based SQL, for benchmarks and list tests.

`fill(accounts=, workers=, requests=, generations=, queued=)` inserts rows that look like a
busy horde's: a tenth of the accounts trusted; workers serving one of 20 models, half of them
chat workers, a fifth unmeasured, the rest 2..80 tokens/s, most online, a few in maintenance
and some with aborts this hour; `generations` finished requests, each with one generation
(done, aborted, faulted or cancelled; 2% still processing, half of those lapsed), a tenth
over capacity or capacity-limited; and `queued` active requests with work to hand out. One
INSERT ... SELECT generate_series per table, so 100,000 rows take a few seconds. Names and
ids are fresh on every call, so it adds to what is there.
"""

import uuid

from django.db import connection, transaction

MODELS = 20


def fill(
    *,
    accounts: int = 0,
    workers: int = 0,
    requests: int = 0,
    generations: int = 0,
    queued: int = 0,
    n: int = 1,
) -> None:
    tag = uuid.uuid4().hex[:8]
    with transaction.atomic(), connection.cursor() as cursor:
        if accounts:
            cursor.execute(
                """
                INSERT INTO workers_account (name, api_key_hash, trusted, deadline_limit_ms, created_at)
                SELECT %(tag)s || '-account-' || i, md5(%(tag)s || i) || md5(i || %(tag)s), i %% 10 = 0,
                       CASE WHEN i %% 7 = 0 THEN 30000 END, now() - i * interval '1 minute'
                FROM generate_series(1, %(n)s) AS i
                """,
                {"tag": tag, "n": accounts},
            )
        if workers:
            cursor.execute(
                """
                INSERT INTO workers_worker (
                    id, name, account_id, served_models, max_length, max_context_length, threads, nsfw,
                    chat, bridge_agent, created_at, last_pop_at, speed, speed_samples, completed_jobs,
                    aborted_jobs, aborts_window_start, uncompleted_jobs, maintenance, maintenance_reason)
                SELECT gen_random_uuid(), %(tag)s || '-worker-' || i,
                       a.ids[1 + i %% cardinality(a.ids)],
                       ARRAY['model-' || (i %% %(models)s)], 512 * (1 + i %% 32), 32768, 1, false,
                       i %% 2 = 0, 'bench:1:fill', now() - interval '1 day',
                       now() - (i %% 600) * interval '1 second',
                       CASE WHEN i %% 5 = 0 THEN NULL ELSE 2 + (i %% 79) END, '{}', i %% 1000,
                       i %% 4, CASE WHEN i %% 4 > 0 THEN now() - interval '10 minutes' END, 0,
                       i %% 50 = 0, CASE WHEN i %% 50 = 0 THEN 'Too many aborts.' ELSE '' END
                FROM generate_series(1, %(n)s) AS i, (SELECT array_agg(id) AS ids FROM workers_account) a
                """,
                {"tag": tag, "n": workers, "models": MODELS},
            )
        if generations:
            _finished(cursor, generations)
        if queued or requests:
            _requests(cursor, queued + requests, queued_share=queued / (queued + requests), n=n)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE workers_account, workers_worker, jobs_textrequest, jobs_generation")


def _requests(cursor, count: int, *, queued_share: float, n: int) -> None:
    """Requests without generations: queued ones (active, `n` jobs to hand out each) and expired ones."""
    cursor.execute(
        """
        INSERT INTO jobs_textrequest (
            id, account_id, kind, state, prompt, messages, params, max_length, max_context_length,
            requested_models, allowed_workers, trusted_workers, slow_workers, priority, n, queued,
            finished, restarts, created_at, expires_at, stream_generation, deadline_at)
        SELECT gen_random_uuid(), a.ids[1 + i %% cardinality(a.ids)],
               CASE WHEN i %% 2 = 0 THEN 'chat' ELSE 'text' END,
               CASE WHEN i <= %(queued)s THEN 'active' ELSE 'expired' END, 'bench prompt',
               CASE WHEN i %% 2 = 0 THEN '[{"role": "user", "content": "bench prompt"}]'::jsonb END, '{}',
               64 * (1 + i %% 64), 8192, ARRAY['model-' || (i %% %(models)s)], '{}', false, true, 0, %(n)s,
               CASE WHEN i <= %(queued)s THEN %(n)s ELSE 0 END, 0, 0, now() - i * interval '10 ms',
               now() + interval '20 minutes', NULL, NULL
        FROM generate_series(1, %(count)s) AS i, (SELECT array_agg(id) AS ids FROM workers_account) a
        """,
        {"count": count, "n": n, "queued": round(count * queued_share), "models": MODELS},
    )


def _finished(cursor, n: int) -> None:
    """`n` requests with one generation each, in the states a day of traffic leaves."""
    cursor.execute(
        """
        CREATE TEMP TABLE fill_rows AS
        SELECT i, gen_random_uuid() AS request_id, gen_random_uuid() AS generation_id,
               now() - i * interval '500 ms' AS popped_at,
               CASE WHEN i %% 50 = 0 THEN 'processing'
                    WHEN i %% 17 = 0 THEN 'aborted'
                    WHEN i %% 23 = 0 THEN 'faulted'
                    WHEN i %% 29 = 0 THEN 'cancelled'
                    ELSE 'done' END AS gen_state
        FROM generate_series(1, %(n)s) AS i
        """,
        {"n": n},
    )
    cursor.execute(
        """
        INSERT INTO jobs_textrequest (
            id, account_id, kind, state, prompt, messages, params, max_length, max_context_length,
            requested_models, allowed_workers, trusted_workers, slow_workers, priority, n, queued,
            finished, restarts, created_at, expires_at, stream_generation, deadline_at)
        SELECT r.request_id, a.ids[1 + r.i %% cardinality(a.ids)],
               CASE WHEN r.i %% 2 = 0 THEN 'chat' ELSE 'text' END,
               CASE WHEN r.gen_state IN ('processing', 'aborted') THEN 'active'
                    WHEN r.gen_state = 'faulted' THEN 'faulted'
                    WHEN r.gen_state = 'cancelled' THEN 'cancelled'
                    ELSE 'done' END,
               'bench prompt',
               CASE WHEN r.i %% 2 = 0 THEN '[{"role": "user", "content": "bench prompt"}]'::jsonb END,
               '{}', 64 * (1 + r.i %% 64), 8192,
               ARRAY['model-' || (r.i %% %(models)s)], '{}', false, true, 0, 1, 0,
               CASE WHEN r.gen_state = 'done' THEN 1 ELSE 0 END,
               CASE WHEN r.gen_state = 'aborted' THEN 1 ELSE 0 END,
               r.popped_at - interval '2 seconds', r.popped_at + interval '20 minutes', NULL, NULL
        FROM fill_rows r, (SELECT array_agg(id) AS ids FROM workers_account) a
        """,
        {"models": MODELS},
    )
    cursor.execute(
        """
        INSERT INTO jobs_generation (
            id, request_id, worker_id, model, state, popped_at, job_ttl, cap_seconds, trusted_at_pop,
            renewals, capacity_at_pop, fallback_tier, capacity_limited, settlement_information,
            finished_at, text, result, seed, gen_metadata, tokens, reward)
        SELECT r.generation_id, r.request_id, w.ids[1 + r.i %% cardinality(w.ids)],
               'model-' || (r.i %% %(models)s), r.gen_state,
               -- Processing ones: the even half still within their lease, the odd half lapsed.
               CASE WHEN r.gen_state <> 'processing' THEN r.popped_at
                    WHEN r.i %% 100 = 0 THEN now() - interval '30 seconds'
                    ELSE now() - interval '1 hour' - r.i * interval '1 second' END,
               150 + (r.i %% 3) * 30, CASE WHEN r.i %% 10 = 0 THEN 600 ELSE 300 END, r.i %% 10 = 0,
               r.i %% 3, 1200, CASE WHEN r.i %% 10 = 1 THEN 2 WHEN r.i %% 30 = 2 THEN 3 ELSE 1 END,
               r.i %% 10 = 3, NULL,
               CASE WHEN r.gen_state = 'processing' THEN NULL ELSE r.popped_at + interval '20 seconds' END,
               CASE WHEN r.gen_state = 'done' THEN 'bench text' END,
               CASE WHEN r.gen_state = 'done' THEN 'ok' ELSE '' END, NULL, '[]', 200, 10
        FROM fill_rows r, (SELECT array_agg(id) AS ids FROM workers_worker) w
        """,
        {"models": MODELS},
    )
    cursor.execute("DROP TABLE fill_rows")
