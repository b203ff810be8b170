-- Named queries of the shared store, used by perdure/store/postgres/store.py.
--
-- The store's "now" is written coalesce(NOW_PARAM::timestamptz,
-- statement_timestamp()): the injected clock's instant when the store was
-- given one, else the database server's clock, so that hosts never compare
-- their own clocks. statement_timestamp() (not clock_timestamp()) keeps every
-- instant written by one statement identical.
--
-- A fenced write matches its run only while the claim's generation is current,
-- the run is running and, unless the claim acknowledged it, no cancel was
-- requested. Zero rows means the claim is lost; the caller diagnoses why.

-- name: migrate_prepare
-- One migrator per database at a time (the lock is released at commit).
SELECT pg_advisory_xact_lock(31636739377689189);
CREATE SCHEMA IF NOT EXISTS perdure;
CREATE TABLE IF NOT EXISTS perdure.schema_version (
    version integer PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- name: schema_version
SELECT coalesce(max(version), 0) AS version FROM perdure.schema_version;

-- name: record_migration
INSERT INTO perdure.schema_version (version) VALUES (%(version)s);

-- name: clock
SELECT clock_timestamp() AS now;

-- name: listen
LISTEN perdure_ready;

-- name: notify
-- Delivered when the transaction commits; identical payloads are merged.
SELECT pg_notify('perdure_ready', app) FROM unnest(%(apps)s::text[]) AS app;

-- name: notify_woken
-- Runs woken by name: each payload is the app, a unit separator (U+001F) and
-- the run id, so that a worker keeping the run warm can claim it alone.
SELECT pg_notify('perdure_ready', app || chr(31) || run_id)
FROM unnest(%(apps)s::text[], %(run_ids)s::text[]) AS w(app, run_id);

-- name: create_run
-- A conflict on run_id or on (app, key) stores nothing; the caller reads back.
-- A created run gets its "initialized" receipt and is announced here, in the
-- same statement.
WITH created AS (
    INSERT INTO perdure.runs (
        run_id, app, workflow, version, state, input, key, parent_id,
        ledger_sequence, ledger_limit, created_at, updated_at, deadline, queue, queue_key,
        priority, dry_run
    )
    VALUES (
        %(run_id)s, %(app)s, %(workflow)s, %(version)s, 'queued', %(input)s, %(key)s,
        %(parent_id)s, 1, %(ledger_limit)s,
        coalesce(%(now)s::timestamptz, statement_timestamp()),
        coalesce(%(now)s::timestamptz, statement_timestamp()),
        %(deadline)s::timestamptz, %(queue)s, %(queue_key)s, %(priority)s, %(dry_run)s
    )
    ON CONFLICT DO NOTHING
    RETURNING *
), receipt AS (
    INSERT INTO perdure.ledger (run_id, sequence, kind, at, generation)
    SELECT c.run_id, 1, 'initialized', c.created_at, 0 FROM created AS c
)
SELECT c.*, pg_notify('perdure_ready', c.app)::text AS announced FROM created AS c;

-- name: create_claimed
-- create_run for a run its starter's own worker takes at once: it is stored
-- running under the worker at generation 1, as the claim would leave it, with
-- both receipts ("initialized", "claimed"; as many as its ledger_limit keeps),
-- and announced to no one: one statement, committed alone.
WITH created AS (
    INSERT INTO perdure.runs (
        run_id, app, workflow, version, state, input, key, parent_id,
        generation, worker, lease_expires_at, lease_ttl,
        ledger_sequence, ledger_limit, created_at, updated_at, deadline, queue, queue_key,
        priority, dry_run
    )
    VALUES (
        %(run_id)s, %(app)s, %(workflow)s, %(version)s, 'running', %(input)s, %(key)s,
        %(parent_id)s, 1, %(worker)s,
        coalesce(%(now)s::timestamptz, statement_timestamp())
            + make_interval(secs => %(lease_ttl)s::float8),
        make_interval(secs => %(lease_ttl)s::float8),
        2, %(ledger_limit)s,
        coalesce(%(now)s::timestamptz, statement_timestamp()),
        coalesce(%(now)s::timestamptz, statement_timestamp()),
        %(deadline)s::timestamptz, %(queue)s, %(queue_key)s, %(priority)s, %(dry_run)s
    )
    ON CONFLICT DO NOTHING
    RETURNING *
), receipts AS (
    INSERT INTO perdure.ledger (run_id, sequence, kind, at, generation, worker)
    SELECT c.run_id, r.sequence, r.kind, c.created_at, r.generation, r.worker
    FROM created AS c
    CROSS JOIN (VALUES (1, 'initialized', 0, NULL::text), (2, 'claimed', 1, %(worker)s::text))
        AS r(sequence, kind, generation, worker)
    WHERE r.sequence > 2 - c.ledger_limit
)
SELECT * FROM created;

-- name: create_children
-- One statement for the whole fan-out; children whose key exists are left as stored.
-- A child of a dry run is dry.
-- Each created child gets its "initialized" receipt and is announced here.
WITH created AS (
    INSERT INTO perdure.runs (
        run_id, app, workflow, version, state, input, key, parent_id,
        ledger_sequence, ledger_limit, created_at, updated_at, parent_close, dry_run
    )
    SELECT c.run_id, c.app, c.workflow, c.version, 'queued', c.input, c.key, %(parent_id)s,
           1, %(ledger_limit)s,
           coalesce(%(now)s::timestamptz, statement_timestamp()),
           coalesce(%(now)s::timestamptz, statement_timestamp()),
           c.parent_close,
           coalesce((SELECT dry_run FROM perdure.runs WHERE run_id = %(parent_id)s), false)
    FROM unnest(
        %(run_ids)s::text[], %(apps)s::text[], %(workflows)s::text[],
        %(versions)s::text[], %(inputs)s::text[], %(keys)s::text[], %(parent_closes)s::text[]
    ) AS c(run_id, app, workflow, version, input, key, parent_close)
    ON CONFLICT DO NOTHING
    RETURNING run_id, app, created_at
), receipt AS (
    INSERT INTO perdure.ledger (run_id, sequence, kind, at, generation)
    SELECT c.run_id, 1, 'initialized', c.created_at, 0 FROM created AS c
)
SELECT c.run_id, c.app, pg_notify('perdure_ready', c.app)::text AS announced FROM created AS c;

-- name: runs_by_key
SELECT r.*
FROM unnest(%(apps)s::text[], %(keys)s::text[]) WITH ORDINALITY AS k(app, key, ord)
JOIN perdure.runs AS r ON r.app = k.app AND r.key = k.key
ORDER BY k.ord;

-- name: run_by_id
SELECT * FROM perdure.runs WHERE run_id = %(run_id)s;

-- name: lock_run
SELECT * FROM perdure.runs WHERE run_id = %(run_id)s FOR NO KEY UPDATE;

-- name: lock_runs
-- Always in one order, so two lockers of overlapping sets queue instead of deadlocking.
SELECT * FROM perdure.runs
WHERE run_id = ANY(%(run_ids)s::text[])
ORDER BY run_id
FOR NO KEY UPDATE;

-- name: list_runs
SELECT * FROM perdure.runs
WHERE app = %(app)s
  AND (%(state)s::text IS NULL OR state = %(state)s::text)
  AND (%(workflow)s::text IS NULL OR workflow = %(workflow)s::text)
  AND (%(dry_run)s::boolean IS NULL OR dry_run = %(dry_run)s::boolean)
ORDER BY created_at DESC, run_id DESC
LIMIT %(limit)s;

-- name: child_counts
-- Answered from runs_parent (parent_id, state).
SELECT state, count(*) AS n FROM perdure.runs WHERE parent_id = %(run_id)s GROUP BY state;

-- name: run_tree
-- The run and every descendant. UNION (not UNION ALL) ends the walk even if
-- corrupt parent links formed a cycle.
WITH RECURSIVE tree(run_id) AS (
    SELECT %(run_id)s::text
    UNION
    SELECT r.run_id FROM perdure.runs AS r JOIN tree AS t ON r.parent_id = t.run_id
)
SELECT run_id FROM tree;

-- name: journal
SELECT * FROM perdure.journal WHERE run_id = %(run_id)s ORDER BY position;

-- name: journals
SELECT * FROM perdure.journal WHERE run_id = ANY(%(run_ids)s::text[]) ORDER BY run_id, position;

-- name: journal_entry
SELECT * FROM perdure.journal
WHERE run_id = %(run_id)s AND position = %(position)s
FOR UPDATE;

-- name: history
SELECT * FROM perdure.ledger WHERE run_id = %(run_id)s ORDER BY sequence;

-- name: outcomes
SELECT * FROM perdure.outcomes WHERE run_id = %(run_id)s ORDER BY at, name;

-- name: outcomes_of_runs
SELECT * FROM perdure.outcomes WHERE run_id = ANY(%(run_ids)s::text[]) ORDER BY run_id, at, name;

-- name: claim_begin
-- Opens the transaction of a claim alone in it (an app with no queues), with
-- what claim_open sets up, in one round trip: the plan setting is made before
-- the savepoint, so that undoing a corrupt candidate's claim keeps it. The
-- COMMIT after the claim ends both; claim_close is not needed.
BEGIN; SET LOCAL plan_cache_mode = force_generic_plan; SAVEPOINT perdure_claim;

-- name: claim_open
-- Run with no parameters (two statements, one round trip) before the claim.
-- The savepoint lets a corrupt candidate's claim be undone alone. The claim
-- is planned generically: planning it with its values took longer than
-- running it, on every call, and each of its ranges names its index's own
-- order, so the generic plan walks the same indexes.
SAVEPOINT perdure_claim; SET LOCAL plan_cache_mode = force_generic_plan;

-- name: claim_close
-- After the claim: what follows in its transaction (the queue queries,
-- planned with their values) is planned as configured again.
RELEASE SAVEPOINT perdure_claim; SET LOCAL plan_cache_mode = DEFAULT;

-- name: claim_undo
ROLLBACK TO SAVEPOINT perdure_claim; RELEASE SAVEPOINT perdure_claim;

-- name: claim
-- One ordered, SKIP LOCKED index range per way a run becomes claimable, each
-- cut at the limit, so workers step over each other's candidates and a large
-- backlog costs no sort. Rows locked here but not picked stay untouched.
-- Runs in a queue are claimed by queue_candidates instead; a lapsed one is
-- recovered here (it keeps its slot).
-- A dry run is claimed only by a dry-run claim, checked on the row each
-- range already reads.
WITH wanted AS (
    SELECT * FROM unnest(%(workflows)s::text[], %(versions)s::text[]) AS w(workflow, version)
), fresh AS (
    SELECT run_id, state, created_at AS due_at, created_at,
           generation AS prior_generation, worker AS prior_worker FROM perdure.runs
    WHERE app = %(app)s AND state = 'queued' AND ready_at IS NULL
      AND queue IS NULL AND (workflow, version) IN (SELECT workflow, version FROM wanted)
      AND dry_run = %(dry_run)s
      AND NOT run_id = ANY(%(exclude)s::text[])
    -- ready_at is NULL here: ordering by it too names runs_claim's order, so a
    -- backlog of other runs (in queues) cannot lure the planner onto runs_page.
    ORDER BY ready_at, created_at
    LIMIT %(limit)s
    FOR NO KEY UPDATE SKIP LOCKED
), backed_off AS (
    SELECT run_id, state, ready_at AS due_at, created_at,
           generation AS prior_generation, worker AS prior_worker FROM perdure.runs
    WHERE app = %(app)s AND state = 'queued'
      AND ready_at <= coalesce(%(now)s::timestamptz, statement_timestamp())
      AND queue IS NULL AND (workflow, version) IN (SELECT workflow, version FROM wanted)
      AND dry_run = %(dry_run)s
      AND NOT run_id = ANY(%(exclude)s::text[])
    ORDER BY ready_at
    LIMIT %(limit)s
    FOR NO KEY UPDATE SKIP LOCKED
), due AS (
    SELECT run_id, state, ready_at AS due_at, created_at,
           generation AS prior_generation, worker AS prior_worker FROM perdure.runs
    WHERE app = %(app)s AND state = 'waiting'
      AND ready_at <= coalesce(%(now)s::timestamptz, statement_timestamp())
      AND queue IS NULL AND (workflow, version) IN (SELECT workflow, version FROM wanted)
      AND dry_run = %(dry_run)s
      AND NOT run_id = ANY(%(exclude)s::text[])
    ORDER BY ready_at
    LIMIT %(limit)s
    FOR NO KEY UPDATE SKIP LOCKED
), lapsed AS (
    SELECT run_id, state, lease_expires_at AS due_at, created_at,
           generation AS prior_generation, worker AS prior_worker FROM perdure.runs
    WHERE app = %(app)s AND state = 'running'
      AND lease_expires_at <= coalesce(%(now)s::timestamptz, statement_timestamp())
      -- A lapse counts only while the caller trusts this clock (NULL: never).
      AND coalesce(%(now)s::timestamptz, statement_timestamp())
          <= %(recover_until)s::timestamptz
      AND (workflow, version) IN (SELECT workflow, version FROM wanted)
      AND dry_run = %(dry_run)s
      AND NOT run_id = ANY(%(exclude)s::text[])
    ORDER BY lease_expires_at
    LIMIT %(limit)s
    FOR NO KEY UPDATE SKIP LOCKED
), picked AS (
    SELECT * FROM (
        SELECT * FROM fresh
        UNION ALL SELECT * FROM backed_off
        UNION ALL SELECT * FROM due
        UNION ALL SELECT * FROM lapsed
    ) AS candidate
    ORDER BY due_at, created_at, run_id
    LIMIT %(limit)s
), claimed AS (
    -- SET expressions read the old row: a lapsed lease counts as a failure.
    UPDATE perdure.runs AS r SET
        generation = r.generation + 1,
        failures = r.failures + CASE WHEN p.state = 'running' THEN 1 ELSE 0 END,
        state = 'running',
        worker = %(worker)s,
        lease_expires_at = coalesce(%(now)s::timestamptz, statement_timestamp())
            + make_interval(secs => %(lease_ttl)s::float8),
        lease_ttl = make_interval(secs => %(lease_ttl)s::float8),
        ready_at = NULL,
        ledger_sequence = r.ledger_sequence + 1,
        updated_at = coalesce(%(now)s::timestamptz, statement_timestamp())
    FROM picked AS p
    WHERE r.run_id = p.run_id
    RETURNING r.*, p.state AS prior_state, p.prior_generation, p.prior_worker
), receipt AS (
    INSERT INTO perdure.ledger (run_id, sequence, kind, at, generation, worker)
    SELECT run_id, ledger_sequence,
           CASE WHEN prior_state = 'running' THEN 'recovered' ELSE 'claimed' END,
           updated_at, generation, worker
    FROM claimed
), trimmed AS (
    DELETE FROM perdure.ledger AS l USING claimed AS c
    WHERE l.run_id = c.run_id AND l.sequence <= c.ledger_sequence - c.ledger_limit
)
-- Whether each run has journal entries and outcomes, so that a claim of a
-- fresh run (whose journal, if any, came with its row) reads neither when it
-- has none. This statement's snapshot may miss what committed while it waited;
-- only a run never claimed before is judged by it (see _claim_once).
SELECT c.*,
       EXISTS (SELECT 1 FROM perdure.journal AS j WHERE j.run_id = c.run_id) AS has_journal,
       EXISTS (SELECT 1 FROM perdure.outcomes AS o WHERE o.run_id = c.run_id) AS has_outcomes
FROM claimed AS c ORDER BY updated_at, run_id;

-- name: claim_warm
-- One run its worker parked warm, claimed by that worker when a wake-up named
-- it: by key, only at the generation it was parked with (no claim since), in
-- one statement (autocommit). The conditions are the claim's for a run in no
-- queue that is queued and due or waiting past its deadline.
-- Everything is judged in this statement's snapshot, so the run's row must
-- be the version that snapshot saw (its xmin): a row changed since (the
-- claim then waited for its lock, and re-checks the newer version) is not
-- claimed, and the worker claims the ordinary way. Every write of a run's
-- journal changes its row, so the held journal's started tail (the entries
-- past %(after)s; NULL: it has none) is compared in that snapshot, each entry
-- as its row's text, and a run whose tail differs (resolve changed it) is not
-- claimed either: a claim by key is made only for the journal its worker
-- holds, so its worker may write under it before it is back (answer_ahead).
-- The run's outcomes come back as arrays (but those the worker holds,
-- %(known_outcomes)s: an outcome never changes), and nothing is read back. An
-- outcome settled without a change of the row (its run already queued) may
-- be missed; the run's next park finds it.
WITH seen AS (
    SELECT r.run_id, r.state, r.xmin AS version FROM perdure.runs AS r
    WHERE r.run_id = %(run_id)s AND r.app = %(app)s AND r.generation = %(generation)s
      AND r.queue IS NULL AND r.dry_run = %(dry_run)s
      AND (r.workflow, r.version) IN (
          SELECT * FROM unnest(%(workflows)s::text[], %(versions)s::text[])
      )
      AND (
          (r.state = 'queued' AND (r.ready_at IS NULL
              OR r.ready_at <= coalesce(%(now)s::timestamptz, statement_timestamp())))
          OR (r.state = 'waiting'
              AND r.ready_at <= coalesce(%(now)s::timestamptz, statement_timestamp()))
      )
      AND (%(after)s::integer IS NULL OR (
          SELECT coalesce(array_agg(
                     ROW(j.position, j.kind, j.name, j.status, j.output, j.error, j.attempt)::text
                     ORDER BY j.position), '{}')
          FROM perdure.journal AS j
          WHERE j.run_id = r.run_id AND j.position > %(after)s::integer
      ) = (
          SELECT coalesce(array_agg(
                     ROW(t.position, t.kind, t.name, t.status, t.output, t.error, t.attempt)::text
                     ORDER BY t.position), '{}')
          FROM unnest(%(tail_positions)s::integer[], %(tail_kinds)s::text[],
                      %(tail_names)s::text[], %(tail_statuses)s::text[],
                      %(tail_outputs)s::text[], %(tail_errors)s::text[],
                      %(tail_attempts)s::integer[])
               AS t(position, kind, name, status, output, error, attempt)
      ))
), claimed AS (
    UPDATE perdure.runs AS r SET
        generation = r.generation + 1,
        state = 'running',
        worker = %(worker)s,
        lease_expires_at = coalesce(%(now)s::timestamptz, statement_timestamp())
            + make_interval(secs => %(lease_ttl)s::float8),
        lease_ttl = make_interval(secs => %(lease_ttl)s::float8),
        ready_at = NULL,
        ledger_sequence = r.ledger_sequence + 1,
        updated_at = coalesce(%(now)s::timestamptz, statement_timestamp())
    FROM seen AS s
    WHERE r.run_id = s.run_id AND r.xmin = s.version
    RETURNING r.*, s.state AS prior_state
), receipt AS (
    INSERT INTO perdure.ledger (run_id, sequence, kind, at, generation, worker)
    SELECT run_id, ledger_sequence, 'claimed', updated_at, generation, worker FROM claimed
), trimmed AS (
    DELETE FROM perdure.ledger AS l USING claimed AS c
    WHERE l.run_id = c.run_id AND l.sequence <= c.ledger_sequence - c.ledger_limit
)
SELECT c.*, settled.*
FROM claimed AS c
CROSS JOIN LATERAL (
    SELECT array_agg(o.name ORDER BY o.at, o.name) AS outcome_names,
           array_agg(o.outcome ORDER BY o.at, o.name) AS outcome_kinds,
           array_agg(o.signal_id ORDER BY o.at, o.name) AS outcome_signal_ids,
           array_agg(o.payload ORDER BY o.at, o.name) AS outcome_payloads,
           array_agg(o.payload_digest ORDER BY o.at, o.name) AS outcome_digests,
           array_agg(o.at ORDER BY o.at, o.name) AS outcome_ats
    FROM perdure.outcomes AS o
    WHERE o.run_id = c.run_id AND NOT o.name = ANY(%(known_outcomes)s::text[])
) AS settled;

-- name: quarantine
-- A claim candidate whose rows cannot be read is set aside, so that it stops
-- being a candidate and no other run waits behind it. Nothing else is touched.
UPDATE perdure.runs SET
    state = 'needs_attention',
    error = %(error)s,
    worker = NULL,
    lease_expires_at = NULL,
    ready_at = NULL,
    ledger_sequence = ledger_sequence + 1,
    updated_at = coalesce(%(now)s::timestamptz, statement_timestamp())
WHERE run_id = %(run_id)s
RETURNING generation, ledger_sequence;

-- name: record_step
-- The hot path of a step, as ONE statement (one round trip, one commit in
-- autocommit mode): the fence, the journal entries and the receipts are
-- written together, or not at all when the fence matches nothing (no row is
-- returned). A position holding a settled entry aborts the whole statement.
WITH fence AS (
    UPDATE perdure.runs SET
        failures = CASE WHEN %(reset)s THEN 0 ELSE failures END,
        ledger_sequence = ledger_sequence + %(receipts)s,
        updated_at = coalesce(%(now)s::timestamptz, statement_timestamp())
    WHERE run_id = %(run_id)s AND generation = %(generation)s AND state = 'running'
      AND (NOT cancel_requested OR %(canceling)s)
  AND (NOT suspend_requested OR %(canceling)s)
    RETURNING run_id, ledger_sequence, ledger_limit
), put AS (
    INSERT INTO perdure.journal (
        run_id, position, kind, name, status, output, error, attempt, created_at, updated_at
    )
    SELECT f.run_id, e.position, e.kind, e.name, e.status, e.output, e.error, e.attempt,
           coalesce(%(now)s::timestamptz, statement_timestamp()),
           coalesce(%(now)s::timestamptz, statement_timestamp())
    FROM fence AS f, unnest(
        %(positions)s::integer[], %(kinds)s::text[], %(names)s::text[], %(statuses)s::text[],
        %(outputs)s::text[], %(errors)s::text[], %(attempts)s::integer[]
    ) AS e(position, kind, name, status, output, error, attempt)
    ON CONFLICT (run_id, position) DO UPDATE SET
        kind = EXCLUDED.kind,
        name = EXCLUDED.name,
        status = EXCLUDED.status,
        output = EXCLUDED.output,
        error = EXCLUDED.error,
        attempt = EXCLUDED.attempt,
        updated_at = EXCLUDED.updated_at
    WHERE perdure.journal.status = 'started'
    RETURNING position
), receipt AS (
    INSERT INTO perdure.ledger (run_id, sequence, kind, at, generation, worker, step, digest, note)
    SELECT f.run_id, f.ledger_sequence - %(receipts)s + r.ord, r.kind,
           coalesce(%(now)s::timestamptz, statement_timestamp()),
           %(generation)s, %(worker)s, r.step, r.digest, r.note
    FROM fence AS f, unnest(
        %(mark_kinds)s::text[], %(mark_steps)s::text[], %(mark_digests)s::text[],
        %(mark_notes)s::text[]
    ) WITH ORDINALITY AS r(kind, step, digest, note, ord)
    WHERE f.ledger_sequence - %(receipts)s + r.ord > f.ledger_sequence - f.ledger_limit
), trimmed AS (
    DELETE FROM perdure.ledger AS l USING fence AS f
    WHERE l.run_id = f.run_id AND l.sequence <= f.ledger_sequence - f.ledger_limit
)
SELECT f.ledger_sequence,
       CASE WHEN (SELECT count(*) FROM put) < %(entries)s
            THEN perdure.refuse('journal_position_taken') END AS refused
FROM fence AS f;

-- name: fence_state
SELECT generation, state, cancel_requested, suspend_requested FROM perdure.runs
WHERE run_id = %(run_id)s;

-- name: next_lapse
-- The earliest lease of the app's running runs still to lapse (runs_lease).
SELECT min(lease_expires_at) AS at FROM perdure.runs
WHERE app = %(app)s AND state = 'running'
  AND lease_expires_at > coalesce(%(now)s::timestamptz, statement_timestamp());

-- name: renew
UPDATE perdure.runs SET
    lease_expires_at = coalesce(%(now)s::timestamptz, statement_timestamp())
        + make_interval(secs => %(lease_ttl)s::float8),
    lease_ttl = make_interval(secs => %(lease_ttl)s::float8)
WHERE run_id = %(run_id)s AND generation = %(generation)s AND state = 'running'
  AND (NOT cancel_requested OR %(canceling)s)
RETURNING lease_expires_at;

-- name: fence_touch
UPDATE perdure.runs SET
    ledger_sequence = ledger_sequence + %(receipts)s,
    updated_at = coalesce(%(now)s::timestamptz, statement_timestamp())
WHERE run_id = %(run_id)s AND generation = %(generation)s AND state = 'running'
  AND (NOT cancel_requested OR %(canceling)s)
  AND (NOT suspend_requested OR %(canceling)s)
RETURNING app, generation, ledger_sequence;

-- name: fence_step
-- A recorded step ends a streak of failed attempts.
UPDATE perdure.runs SET
    failures = 0,
    ledger_sequence = ledger_sequence + %(receipts)s,
    updated_at = coalesce(%(now)s::timestamptz, statement_timestamp())
WHERE run_id = %(run_id)s AND generation = %(generation)s AND state = 'running'
  AND (NOT cancel_requested OR %(canceling)s)
  AND (NOT suspend_requested OR %(canceling)s)
RETURNING app, generation, ledger_sequence;

-- name: release
-- A run whose suspend was asked is given back suspended (to resume as queued).
UPDATE perdure.runs SET
    state = CASE WHEN suspend_requested THEN 'suspended' ELSE 'queued' END,
    suspended_from = CASE WHEN suspend_requested THEN 'queued' ELSE suspended_from END,
    suspend_requested = false,
    worker = NULL,
    lease_expires_at = NULL,
    ready_at = CASE WHEN %(delay)s::float8 > 0
        THEN coalesce(%(now)s::timestamptz, statement_timestamp())
            + make_interval(secs => %(delay)s::float8)
    END,
    failures = failures + CASE WHEN %(failed)s THEN 1 ELSE 0 END,
    ledger_sequence = ledger_sequence + %(receipts)s,
    updated_at = coalesce(%(now)s::timestamptz, statement_timestamp())
WHERE run_id = %(run_id)s AND generation = %(generation)s AND state = 'running'
  AND (NOT cancel_requested OR %(canceling)s)
RETURNING app, generation, ledger_sequence;

-- name: park_run
-- Runs after the fence in the same transaction, which holds the row lock.
UPDATE perdure.runs SET
    state = 'waiting',
    worker = NULL,
    lease_expires_at = NULL,
    ready_at = %(ready_at)s::timestamptz,
    ledger_sequence = ledger_sequence + 1,
    updated_at = coalesce(%(now)s::timestamptz, statement_timestamp())
WHERE run_id = %(run_id)s
RETURNING ledger_sequence;

-- name: finish
UPDATE perdure.runs SET
    state = %(state)s,
    result = %(result)s,
    error = %(error)s,
    worker = NULL,
    lease_expires_at = NULL,
    ready_at = NULL,
    ledger_sequence = ledger_sequence + %(receipts)s,
    updated_at = coalesce(%(now)s::timestamptz, statement_timestamp())
WHERE run_id = %(run_id)s AND generation = %(generation)s AND state = 'running'
  AND (NOT cancel_requested OR %(canceling)s)
RETURNING run_id, app, parent_id, state, result, error, generation, ledger_sequence, origin,
    ledger_limit;

-- name: finish_alone
-- The end of a run with no parent and no child that closes with it, as ONE
-- statement (one round trip, one commit in autocommit mode): the fenced end,
-- its entries and receipts, and the end-of-run rules of end_cleanup,
-- updates_abandon and live_ended (with live_ended's announcement). A run
-- with a parent or with such a child matches nothing here, as does a stale
-- claim: the caller then ends it through the transaction path, which also
-- says why a fence refused. The CTEs read the tables as they were before
-- the statement, so the entries written here are checked from the batch,
-- and the run's row must be the version this snapshot saw (its xmin): a
-- write that changed it meanwhile (an update's delivery, whose update the
-- snapshot cannot see to abandon it) sends the end the transaction path too.
WITH seen AS (
    SELECT r.xmin AS version FROM perdure.runs AS r WHERE r.run_id = %(run_id)s
), fence AS (
    UPDATE perdure.runs AS r SET
        state = %(state)s,
        result = %(result)s,
        error = %(error)s,
        worker = NULL,
        lease_expires_at = NULL,
        ready_at = NULL,
        ledger_sequence = r.ledger_sequence + %(receipts)s,
        updated_at = coalesce(%(now)s::timestamptz, statement_timestamp())
    WHERE r.run_id = %(run_id)s AND r.generation = %(generation)s AND r.state = 'running'
      AND r.xmin = (SELECT s.version FROM seen AS s)
      AND (NOT r.cancel_requested OR %(canceling)s)
      AND r.parent_id IS NULL
      AND NOT EXISTS (
          SELECT 1 FROM perdure.runs AS c
          WHERE c.parent_id = r.run_id AND c.parent_close = 'cancel'
            AND c.state NOT IN ('succeeded', 'failed', 'canceled') AND NOT c.cancel_requested
      )
    RETURNING r.run_id, r.ledger_sequence, r.ledger_limit
), batch AS (
    SELECT * FROM unnest(
        %(positions)s::integer[], %(kinds)s::text[], %(names)s::text[], %(statuses)s::text[],
        %(outputs)s::text[], %(errors)s::text[], %(attempts)s::integer[]
    ) AS e(position, kind, name, status, output, error, attempt)
), put AS (
    INSERT INTO perdure.journal (
        run_id, position, kind, name, status, output, error, attempt, created_at, updated_at
    )
    SELECT f.run_id, e.position, e.kind, e.name, e.status, e.output, e.error, e.attempt,
           coalesce(%(now)s::timestamptz, statement_timestamp()),
           coalesce(%(now)s::timestamptz, statement_timestamp())
    FROM fence AS f, batch AS e
    ON CONFLICT (run_id, position) DO UPDATE SET
        kind = EXCLUDED.kind,
        name = EXCLUDED.name,
        status = EXCLUDED.status,
        output = EXCLUDED.output,
        error = EXCLUDED.error,
        attempt = EXCLUDED.attempt,
        updated_at = EXCLUDED.updated_at
    WHERE perdure.journal.status = 'started'
    RETURNING position
), receipt AS (
    INSERT INTO perdure.ledger (run_id, sequence, kind, at, generation, worker, step, digest, note)
    SELECT f.run_id, f.ledger_sequence - %(receipts)s + r.ord, r.kind,
           coalesce(%(now)s::timestamptz, statement_timestamp()),
           %(generation)s, %(worker)s, r.step, r.digest, r.note
    FROM fence AS f, unnest(
        %(mark_kinds)s::text[], %(mark_steps)s::text[], %(mark_digests)s::text[],
        %(mark_notes)s::text[]
    ) WITH ORDINALITY AS r(kind, step, digest, note, ord)
    WHERE f.ledger_sequence - %(receipts)s + r.ord > f.ledger_sequence - f.ledger_limit
), trimmed AS (
    DELETE FROM perdure.ledger AS l USING fence AS f
    WHERE l.run_id = f.run_id AND l.sequence <= f.ledger_sequence - f.ledger_limit
), waits_gone AS (
    DELETE FROM perdure.waits AS w USING fence AS f
    WHERE w.run_id = f.run_id AND %(ending)s
), outcomes_gone AS (
    -- As end_cleanup: a signal the run never applied keeps its record.
    DELETE FROM perdure.outcomes AS o USING fence AS f
    WHERE o.run_id = f.run_id AND %(ending)s
      AND NOT (o.outcome = 'signaled' AND o.signal_id IS NOT NULL
          AND NOT EXISTS (
              SELECT 1 FROM perdure.journal AS j
              WHERE j.run_id = o.run_id AND j.kind = 'wait' AND j.name = o.name
                AND j.status <> 'started'
          )
          AND NOT EXISTS (
              SELECT 1 FROM batch AS e
              WHERE e.kind = 'wait' AND e.name = o.name AND e.status <> 'started'
          ))
), messages_gone AS (
    DELETE FROM perdure.messages AS m USING fence AS f
    WHERE m.run_id = f.run_id AND %(ending)s
), abandoned AS (
    UPDATE perdure.updates AS u SET
        state = 'abandoned',
        settled_at = coalesce(%(now)s::timestamptz, statement_timestamp())
    FROM fence AS f
    WHERE u.run_id = f.run_id AND u.state = 'pending' AND %(ending)s
)
SELECT f.ledger_sequence,
       CASE WHEN (SELECT count(*) FROM put) < %(entries)s
            THEN perdure.refuse('journal_position_taken') END AS refused,
       CASE WHEN %(ending)s AND (
                EXISTS (SELECT 1 FROM perdure.updates AS u WHERE u.run_id = f.run_id)
                OR EXISTS (
                    SELECT 1 FROM perdure.journal AS j
                    WHERE j.run_id = f.run_id AND j.kind IN ('event', 'stream', 'stream_close')
                )
                OR EXISTS (
                    SELECT 1 FROM batch AS e WHERE e.kind IN ('event', 'stream', 'stream_close')
                ))
            THEN pg_notify('perdure_live', f.run_id) END AS announced
FROM fence AS f;

-- name: journal_put
-- An existing position is replaced only while it is 'started'; any other is
-- left alone and missing from RETURNING, and the caller refuses.
INSERT INTO perdure.journal (
    run_id, position, kind, name, status, output, error, attempt, created_at, updated_at
)
SELECT %(run_id)s, e.position, e.kind, e.name, e.status, e.output, e.error, e.attempt,
       coalesce(%(now)s::timestamptz, statement_timestamp()),
       coalesce(%(now)s::timestamptz, statement_timestamp())
FROM unnest(
    %(positions)s::integer[], %(kinds)s::text[], %(names)s::text[], %(statuses)s::text[],
    %(outputs)s::text[], %(errors)s::text[], %(attempts)s::integer[]
) AS e(position, kind, name, status, output, error, attempt)
ON CONFLICT (run_id, position) DO UPDATE SET
    kind = EXCLUDED.kind,
    name = EXCLUDED.name,
    status = EXCLUDED.status,
    output = EXCLUDED.output,
    error = EXCLUDED.error,
    attempt = EXCLUDED.attempt,
    updated_at = EXCLUDED.updated_at
WHERE perdure.journal.status = 'started'
RETURNING position;

-- name: ledger_append
-- Receipts arrive numbered (the runs' ledger_sequence was raised by the same
-- transaction). Each run keeps its newest receipts, as many as its own
-- ledger_limit, counting the new ones: a transition with more receipts than
-- that stores only its last ones.
WITH receipt AS (
    SELECT * FROM unnest(
        %(run_ids)s::text[], %(sequences)s::bigint[], %(kinds)s::text[],
        %(generations)s::bigint[], %(workers)s::text[], %(steps)s::text[],
        %(digests)s::text[], %(notes)s::text[]
    ) AS r(run_id, sequence, kind, generation, worker, step, digest, note)
), bound AS (
    SELECT u.run_id, u.ledger_sequence - u.ledger_limit AS below
    FROM perdure.runs AS u WHERE u.run_id IN (SELECT run_id FROM receipt)
), trimmed AS (
    DELETE FROM perdure.ledger AS l USING bound AS b
    WHERE l.run_id = b.run_id AND l.sequence <= b.below
)
INSERT INTO perdure.ledger (run_id, sequence, kind, at, generation, worker, step, digest, note)
SELECT r.run_id, r.sequence, r.kind, coalesce(%(now)s::timestamptz, statement_timestamp()),
       r.generation, r.worker, r.step, r.digest, r.note
FROM receipt AS r JOIN bound AS b ON b.run_id = r.run_id
WHERE r.sequence > b.below;

-- name: park_waits
-- Replaces the run's registrations. A wait registered again keeps its
-- created_at, so listings stay in order.
WITH dropped AS (
    DELETE FROM perdure.waits
    WHERE run_id = %(run_id)s AND NOT name = ANY(%(names)s::text[])
)
INSERT INTO perdure.waits (run_id, name, app, kind, deadline, after_sequence, created_at)
SELECT %(run_id)s, w.name, %(app)s, w.kind, w.deadline, w.after_sequence,
       coalesce(%(now)s::timestamptz, statement_timestamp())
FROM unnest(
    %(names)s::text[], %(kinds)s::text[], %(deadlines)s::timestamptz[], %(after)s::bigint[]
) AS w(name, kind, deadline, after_sequence)
ON CONFLICT (run_id, name) DO UPDATE SET
    kind = EXCLUDED.kind,
    deadline = EXCLUDED.deadline,
    after_sequence = EXCLUDED.after_sequence;

-- name: park_satisfied
-- Read after the run's row lock was taken: a delivery committed before it is
-- seen here, one committed after it finds the run waiting and wakes it.
SELECT coalesce(%(ready_at)s::timestamptz <= coalesce(%(now)s::timestamptz, statement_timestamp()), false)
    OR EXISTS (
        SELECT 1 FROM perdure.waits AS w
        WHERE w.run_id = %(run_id)s
          AND CASE WHEN w.kind = 'channel' THEN EXISTS (
                  SELECT 1 FROM perdure.messages AS m
                  WHERE m.run_id = w.run_id AND m.channel = w.name
                    AND m.sequence > w.after_sequence
              ) WHEN w.kind = 'update' THEN EXISTS (
                  SELECT 1 FROM perdure.updates AS u
                  WHERE u.run_id = w.run_id AND u.name = w.name
                    AND u.sequence > w.after_sequence
              ) ELSE EXISTS (
                  SELECT 1 FROM perdure.outcomes AS o
                  WHERE o.run_id = w.run_id AND o.name = w.name
              ) END
    ) AS satisfied;

-- name: outcome_put
-- A signal that arrives after its registered wait's deadline settles the wait
-- as timed out instead, without the payload.
INSERT INTO perdure.outcomes (run_id, name, outcome, signal_id, payload, payload_digest, at)
SELECT %(run_id)s, %(name)s,
       CASE WHEN x.expired THEN 'timed_out' ELSE %(outcome)s::text END,
       CASE WHEN x.expired THEN NULL ELSE %(signal_id)s::text END,
       CASE WHEN x.expired THEN NULL ELSE %(payload)s::text END,
       CASE WHEN x.expired THEN NULL ELSE %(payload_digest)s::text END,
       coalesce(%(now)s::timestamptz, statement_timestamp())
FROM (
    SELECT %(outcome)s::text = 'signaled' AND EXISTS (
        SELECT 1 FROM perdure.waits AS w
        WHERE w.run_id = %(run_id)s AND w.name = %(name)s
          AND w.deadline <= coalesce(%(now)s::timestamptz, statement_timestamp())
    ) AS expired
) AS x
ON CONFLICT (run_id, name) DO NOTHING
RETURNING *;

-- name: outcome_get
SELECT * FROM perdure.outcomes WHERE run_id = %(run_id)s AND name = %(name)s;

-- name: child_outcomes_put
-- Only a parent that has not ended can still use its child's outcome; one
-- that needs attention may be re-queued by resolve, so it keeps them too.
INSERT INTO perdure.outcomes (run_id, name, outcome, payload, at)
SELECT c.parent_id, c.name, 'signaled', c.payload,
       coalesce(%(now)s::timestamptz, statement_timestamp())
FROM unnest(%(parent_ids)s::text[], %(names)s::text[], %(payloads)s::text[])
    AS c(parent_id, name, payload)
JOIN perdure.runs AS p ON p.run_id = c.parent_id
WHERE p.state IN ('queued', 'running', 'waiting', 'suspended', 'needs_attention')
ON CONFLICT (run_id, name) DO NOTHING;

-- name: wake_parents
-- A child's end wakes its parent only when the parent is parked on that very
-- child, so a fan-out does not wake the parent once per child.
UPDATE perdure.runs SET
    state = 'queued',
    ready_at = NULL,
    ledger_sequence = ledger_sequence + 1,
    updated_at = coalesce(%(now)s::timestamptz, statement_timestamp())
WHERE state = 'waiting'
  AND run_id IN (
      SELECT w.run_id
      FROM unnest(%(parent_ids)s::text[], %(names)s::text[]) AS c(parent_id, name)
      JOIN perdure.waits AS w ON w.run_id = c.parent_id AND w.name = c.name
  )
RETURNING run_id, app, generation, ledger_sequence;

-- name: waits_of_app
-- Served by waits_app (app, created_at).
SELECT w.* FROM perdure.waits AS w
WHERE w.app = %(app)s
  AND NOT EXISTS (
      SELECT 1 FROM perdure.outcomes AS o WHERE o.run_id = w.run_id AND o.name = w.name
  )
ORDER BY w.created_at, w.run_id, w.name;

-- name: waits_of_run
-- Served by the waits primary key (run_id, name).
SELECT w.* FROM perdure.waits AS w
WHERE w.run_id = %(run_id)s AND w.app = %(app)s
  AND NOT EXISTS (
      SELECT 1 FROM perdure.outcomes AS o WHERE o.run_id = w.run_id AND o.name = w.name
  )
ORDER BY w.created_at, w.name;

-- name: wake
UPDATE perdure.runs SET
    state = 'queued',
    ready_at = NULL,
    ledger_sequence = ledger_sequence + 1,
    updated_at = coalesce(%(now)s::timestamptz, statement_timestamp())
WHERE run_id = ANY(%(run_ids)s::text[]) AND state = 'waiting'
RETURNING run_id, app, generation, ledger_sequence;

-- name: message_put
-- The next sequence comes from the run's counter, read under its row lock.
INSERT INTO perdure.messages (run_id, channel, key, sequence, payload, at)
SELECT run_id, %(channel)s, %(key)s, message_sequence + 1, %(payload)s,
       coalesce(%(now)s::timestamptz, statement_timestamp())
FROM perdure.runs WHERE run_id = %(run_id)s
ON CONFLICT (run_id, channel, key) DO NOTHING
RETURNING sequence;

-- name: message_counted
UPDATE perdure.runs SET message_sequence = message_sequence + 1 WHERE run_id = %(run_id)s;

-- name: wake_on_wait
-- A waiting run parked on the wait :kind :name (a channel, an update) is
-- made queued; any other is left alone.
UPDATE perdure.runs SET
    state = 'queued',
    ready_at = NULL,
    ledger_sequence = ledger_sequence + 1,
    updated_at = coalesce(%(now)s::timestamptz, statement_timestamp())
WHERE run_id = %(run_id)s AND state = 'waiting'
  AND EXISTS (
    SELECT 1 FROM perdure.waits
    WHERE waits.run_id = %(run_id)s AND waits.kind = %(kind)s AND waits.name = %(name)s
  )
RETURNING run_id, app, generation, ledger_sequence;

-- name: next_message
SELECT * FROM perdure.messages
WHERE run_id = %(run_id)s AND channel = %(channel)s AND sequence > %(after_sequence)s
ORDER BY sequence
LIMIT 1;

-- name: end_cleanup
WITH waits_gone AS (
    DELETE FROM perdure.waits WHERE run_id = ANY(%(run_ids)s::text[])
), outcomes_gone AS (
    -- A signal the run never applied keeps its record: its sender's retry is
    -- answered with the receipt it was given (an applied one is in the journal).
    DELETE FROM perdure.outcomes AS o WHERE o.run_id = ANY(%(run_ids)s::text[])
      AND NOT (o.outcome = 'signaled' AND o.signal_id IS NOT NULL AND NOT EXISTS (
          SELECT 1 FROM perdure.journal AS j
          WHERE j.run_id = o.run_id AND j.kind = 'wait' AND j.name = o.name
            AND j.status <> 'started'
      ))
)
DELETE FROM perdure.messages WHERE run_id = ANY(%(run_ids)s::text[]);

-- name: cancel_open_waits
INSERT INTO perdure.outcomes (run_id, name, outcome, at)
SELECT w.run_id, w.name, 'canceled', coalesce(%(now)s::timestamptz, statement_timestamp())
FROM perdure.waits AS w
WHERE w.run_id = ANY(%(run_ids)s::text[])
ON CONFLICT (run_id, name) DO NOTHING;

-- name: cancel_now
UPDATE perdure.runs SET
    state = 'canceled',
    cancel_requested = true,
    worker = NULL,
    lease_expires_at = NULL,
    ready_at = NULL,
    ledger_sequence = ledger_sequence + 1,
    updated_at = coalesce(%(now)s::timestamptz, statement_timestamp())
WHERE run_id = ANY(%(run_ids)s::text[]) AND state IN ('queued', 'waiting', 'suspended')
RETURNING run_id, app, parent_id, state, result, error, generation, ledger_sequence, origin;

-- name: cancel_request
-- A running run is settled by its owner; one in needs_attention keeps its
-- state, and the flag turns a later resolve with an output into canceled.
UPDATE perdure.runs SET
    cancel_requested = true,
    ledger_sequence = ledger_sequence + 1,
    updated_at = coalesce(%(now)s::timestamptz, statement_timestamp())
WHERE run_id = ANY(%(run_ids)s::text[])
  AND state IN ('running', 'needs_attention') AND NOT cancel_requested
RETURNING run_id, generation, ledger_sequence;

-- name: resolve_entry
UPDATE perdure.journal SET
    kind = %(kind)s,
    name = %(name)s,
    status = %(status)s,
    output = %(output)s,
    error = %(error)s,
    attempt = %(attempt)s,
    updated_at = coalesce(%(now)s::timestamptz, statement_timestamp())
WHERE run_id = %(run_id)s AND position = %(position)s AND status = 'started';

-- name: resolve_run
UPDATE perdure.runs SET
    state = %(state)s,
    error = %(error)s,
    failures = 0,
    worker = NULL,
    lease_expires_at = NULL,
    ready_at = NULL,
    ledger_sequence = ledger_sequence + %(receipts)s,
    updated_at = coalesce(%(now)s::timestamptz, statement_timestamp())
WHERE run_id = %(run_id)s AND generation = %(generation)s AND state = 'needs_attention'
RETURNING run_id, app, parent_id, state, result, error, generation, ledger_sequence, origin;

-- name: sweep_expired_runs
-- Runs with a signal or child wait past its deadline and no outcome. Locked
-- like any delivery, skipping runs another transaction holds (next sweep).
-- Channel waits time out through ready_at alone: an outcome named after a
-- channel would outlive this wait and hide the next one on that channel.
SELECT r.run_id FROM perdure.runs AS r
WHERE r.state IN ('queued', 'running', 'waiting')
  AND r.run_id IN (
      SELECT w.run_id FROM perdure.waits AS w
      WHERE w.deadline <= coalesce(%(now)s::timestamptz, statement_timestamp())
        AND w.kind NOT IN ('channel', 'update')
        AND NOT EXISTS (
            SELECT 1 FROM perdure.outcomes AS o WHERE o.run_id = w.run_id AND o.name = w.name
        )
  )
ORDER BY r.run_id
FOR NO KEY UPDATE OF r SKIP LOCKED;

-- name: sweep_expire_waits
INSERT INTO perdure.outcomes (run_id, name, outcome, at)
SELECT w.run_id, w.name, 'timed_out', coalesce(%(now)s::timestamptz, statement_timestamp())
FROM perdure.waits AS w
WHERE w.run_id = ANY(%(run_ids)s::text[])
  AND w.deadline <= coalesce(%(now)s::timestamptz, statement_timestamp())
  AND w.kind NOT IN ('channel', 'update')
ON CONFLICT (run_id, name) DO NOTHING
RETURNING run_id;

-- name: sweep_due_runs
-- Served by runs_waiting_due (ready_at) WHERE state = 'waiting'.
SELECT run_id FROM perdure.runs
WHERE state = 'waiting' AND ready_at <= coalesce(%(now)s::timestamptz, statement_timestamp())
ORDER BY run_id
FOR NO KEY UPDATE SKIP LOCKED;

-- name: sweep_clamp_leases
-- A lease is never further ahead than its TTL: after the clock stepped back,
-- a dead worker's run lapses one TTL from now, not when the clock catches up.
-- Served by runs_lease; rows another transaction holds wait for the next sweep.
WITH ahead AS (
    SELECT run_id FROM perdure.runs
    WHERE state = 'running'
      AND lease_expires_at > coalesce(%(now)s::timestamptz, statement_timestamp()) + lease_ttl
    ORDER BY run_id
    FOR NO KEY UPDATE SKIP LOCKED
)
UPDATE perdure.runs AS r SET
    lease_expires_at = coalesce(%(now)s::timestamptz, statement_timestamp()) + r.lease_ttl
FROM ahead
WHERE r.run_id = ahead.run_id
RETURNING r.run_id;

-- name: sweep_orphans
-- Records of runs that are gone or ended. A run that needs attention keeps
-- them (resolve may re-queue it), and so does one whose state this code
-- cannot read: nothing is guessed.
WITH waits_gone AS (
    DELETE FROM perdure.waits AS x WHERE NOT EXISTS (
        SELECT 1 FROM perdure.runs AS r
        WHERE r.run_id = x.run_id
          AND r.state NOT IN ('succeeded', 'failed', 'canceled')
    )
    RETURNING 1
), outcomes_gone AS (
    DELETE FROM perdure.outcomes AS x WHERE NOT EXISTS (
        SELECT 1 FROM perdure.runs AS r
        WHERE r.run_id = x.run_id
          AND r.state NOT IN ('succeeded', 'failed', 'canceled')
    ) AND NOT (
        -- an ended run's unapplied signal, kept to answer its sender (see end_cleanup)
        x.outcome = 'signaled' AND x.signal_id IS NOT NULL
        AND EXISTS (SELECT 1 FROM perdure.runs AS r WHERE r.run_id = x.run_id)
        AND NOT EXISTS (
            SELECT 1 FROM perdure.journal AS j
            WHERE j.run_id = x.run_id AND j.kind = 'wait' AND j.name = x.name
              AND j.status <> 'started'
        )
    )
    RETURNING 1
), messages_gone AS (
    DELETE FROM perdure.messages AS x WHERE NOT EXISTS (
        SELECT 1 FROM perdure.runs AS r
        WHERE r.run_id = x.run_id
          AND r.state NOT IN ('succeeded', 'failed', 'canceled')
    )
    RETURNING 1
)
SELECT (SELECT count(*) FROM waits_gone)
     + (SELECT count(*) FROM outcomes_gone)
     + (SELECT count(*) FROM messages_gone) AS n;

-- == the operating surface: run pages and access tokens ================
-- name: page_runs
-- Keyset, newest first; with no page before, after_at is past every run.
-- One query per filter, each walking its own index in order (a filter
-- written `param IS NULL OR ...` would keep the planner off the index).
-- The time window bounds the same walk: the caller folds created_before into
-- the keyset bound, and since is before every run when no window is asked.
-- Served by runs_page (app, created_at, run_id).
SELECT * FROM perdure.runs
WHERE app = %(app)s
  AND (created_at, run_id) < (%(after_at)s::timestamptz, %(after_id)s::text)
  AND created_at > %(since)s::timestamptz
ORDER BY created_at DESC, run_id DESC
LIMIT %(limit)s;

-- name: page_runs_by_state
-- Served by runs_page_state (app, state, created_at, run_id).
SELECT * FROM perdure.runs
WHERE app = %(app)s AND state = %(state)s
  AND (%(workflow)s::text IS NULL OR workflow = %(workflow)s::text)
  AND (created_at, run_id) < (%(after_at)s::timestamptz, %(after_id)s::text)
  AND created_at > %(since)s::timestamptz
ORDER BY created_at DESC, run_id DESC
LIMIT %(limit)s;

-- name: page_runs_by_workflow
-- Served by runs_page_workflow (app, workflow, created_at, run_id).
SELECT * FROM perdure.runs
WHERE app = %(app)s AND workflow = %(workflow)s
  AND (created_at, run_id) < (%(after_at)s::timestamptz, %(after_id)s::text)
  AND created_at > %(since)s::timestamptz
ORDER BY created_at DESC, run_id DESC
LIMIT %(limit)s;

-- name: page_runs_by_queue
-- Served by runs_page_queue (app, queue, created_at, run_id).
SELECT * FROM perdure.runs
WHERE app = %(app)s AND queue = %(queue)s
  AND (%(state)s::text IS NULL OR state = %(state)s::text)
  AND (%(workflow)s::text IS NULL OR workflow = %(workflow)s::text)
  AND (created_at, run_id) < (%(after_at)s::timestamptz, %(after_id)s::text)
  AND created_at > %(since)s::timestamptz
ORDER BY created_at DESC, run_id DESC
LIMIT %(limit)s;

-- name: page_children
-- Keyset, oldest first; with no page before, after_at is before every run.
-- Served by runs_children (parent_id, created_at, run_id).
SELECT * FROM perdure.runs
WHERE parent_id = %(run_id)s
  AND (created_at, run_id) > (%(after_at)s::timestamptz, %(after_id)s::text)
ORDER BY created_at, run_id
LIMIT %(limit)s;

-- name: run_by_key
SELECT * FROM perdure.runs WHERE app = %(app)s AND key = %(key)s;

-- name: create_token
INSERT INTO perdure.tokens (token_id, app, scope, digest, created_at, expires_at)
VALUES (
    %(token_id)s, %(app)s, %(scope)s, %(digest)s,
    coalesce(%(now)s::timestamptz, statement_timestamp()), %(expires_at)s::timestamptz
)
ON CONFLICT (token_id) DO NOTHING
RETURNING *;

-- name: get_token
SELECT * FROM perdure.tokens WHERE token_id = %(token_id)s;

-- name: list_tokens
SELECT * FROM perdure.tokens
WHERE (%(app)s::text IS NULL OR app = %(app)s::text)
ORDER BY created_at, token_id;

-- name: revoke_token
UPDATE perdure.tokens
SET revoked_at = coalesce(revoked_at, %(now)s::timestamptz, statement_timestamp())
WHERE token_id = %(token_id)s
RETURNING *;

-- name: has_tokens
SELECT EXISTS (
    SELECT 1 FROM perdure.tokens
    WHERE app = %(app)s AND revoked_at IS NULL
      AND (expires_at IS NULL OR expires_at > coalesce(%(now)s::timestamptz, statement_timestamp()))
) AS found;

-- name: prune_pick
-- Runs of one ended state that ended before :before, oldest created first,
-- locked, skipping runs another transaction holds. Only runs_page_state
-- (app, state, created_at, run_id) can serve it, whatever the statistics say:
-- state >= :state starts the walk at the state's first entry and
-- (state, created_at) <= (:state, :before) stops it at the cutoff (a run ends
-- after it is created, so updated_at < :before leaves out one created at the
-- cutoff itself). Written as state = :state, the planner drops state from the
-- order as a constant, and then runs_page (app, created_at, run_id) serves the
-- order too: with statistics that still counted pruned runs it walked
-- runs_page past every other run of the app. Here state stays in the order,
-- which runs_page cannot give.
SELECT run_id FROM perdure.runs
WHERE app = %(app)s AND state >= %(state)s
  AND (state, created_at) <= (%(state)s, %(before)s::timestamptz)
  AND updated_at < %(before)s::timestamptz
ORDER BY state, created_at, run_id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;

-- name: prune_runs
-- Everything recorded for the picked runs, then the runs, checked again to
-- have ended.
WITH journal_gone AS (
    DELETE FROM perdure.journal WHERE run_id = ANY(%(run_ids)s::text[])
), ledger_gone AS (
    DELETE FROM perdure.ledger WHERE run_id = ANY(%(run_ids)s::text[])
), waits_gone AS (
    DELETE FROM perdure.waits WHERE run_id = ANY(%(run_ids)s::text[])
), outcomes_gone AS (
    DELETE FROM perdure.outcomes WHERE run_id = ANY(%(run_ids)s::text[])
), messages_gone AS (
    DELETE FROM perdure.messages WHERE run_id = ANY(%(run_ids)s::text[])
), updates_gone AS (
    DELETE FROM perdure.updates WHERE run_id = ANY(%(run_ids)s::text[])
), tasks_gone AS (
    DELETE FROM perdure.tasks WHERE run_id = ANY(%(run_ids)s::text[])
)
DELETE FROM perdure.runs
WHERE run_id = ANY(%(run_ids)s::text[]) AND state IN ('succeeded', 'failed', 'canceled')
RETURNING run_id;

-- name: update_put
-- Put-if-absent by (run_id, update_id); the sequence is read under the run's row lock.
INSERT INTO perdure.updates (run_id, update_id, name, sequence, payload, state, response, at, settled_at)
SELECT %(run_id)s, %(update_id)s, %(name)s, coalesce(max(sequence), 0) + 1, %(payload)s, 'pending', NULL,
       coalesce(%(now)s::timestamptz, statement_timestamp()), NULL
FROM perdure.updates WHERE run_id = %(run_id)s
ON CONFLICT (run_id, update_id) DO NOTHING
RETURNING *;

-- name: update_deliver
-- perdure.deliver_update (migration 0017): the run's lock, then update_put,
-- wake_on_wait, the woken receipt and the worker's wake-up as one statement
-- whose snapshot holds every wait a park registered. No row: no such run (of
-- the app, when one is given). A row with a refusal: the run had ended (its
-- state) or is past its deadline ('overdue'); nothing was stored. A stored id
-- comes back as it is (fresh is false) and nothing else happens.
SELECT * FROM perdure.deliver_update(
    %(run_id)s, %(update_id)s, %(name)s, %(payload)s, %(now)s::timestamptz,
    %(terminal)s::text[], %(app)s
);

-- name: update_get
SELECT * FROM perdure.updates WHERE run_id = %(run_id)s AND update_id = %(update_id)s;

-- name: list_updates
-- The run's latest updates, newest first; a run's sequence numbers its
-- updates of every name, so (run_id, sequence) is unique.
SELECT * FROM perdure.updates
WHERE run_id = %(run_id)s
ORDER BY sequence DESC
LIMIT %(limit)s;

-- name: next_update
SELECT * FROM perdure.updates
WHERE run_id = %(run_id)s AND name = %(name)s AND sequence > %(after_sequence)s
ORDER BY sequence
LIMIT 1;

-- name: update_answer
UPDATE perdure.updates SET state = 'answered', response = %(response)s, settled_at = coalesce(%(now)s::timestamptz, statement_timestamp())
WHERE run_id = %(run_id)s AND update_id = %(update_id)s AND state = 'pending'
RETURNING *;

-- name: answer_alone
-- answer_update as ONE statement (one round trip, one commit in autocommit
-- mode): the fence (fence_touch's, and the claim's worker), the entries and
-- receipts, the answer of the pending update and its announcement. The
-- run's row is locked first, before the update's, as a cancel that abandons
-- it locks them, and the fence judges the row as that lock found it: an
-- answer sent while its claim is still committing (answer_ahead: a claim
-- by key of a warm run) waits for that claim and writes under it. No row
-- comes back when the fence matches nothing (nothing is written); answered
-- is 0 when the update was not pending. A claim that commits after this
-- statement's snapshot was taken wrote a receipt this statement cannot
-- see to trim: an answer sent ahead of its claim is sent only when the
-- run's bound keeps that receipt anyway.
WITH locked AS (
    SELECT l.run_id, l.generation, l.worker, l.state, l.cancel_requested, l.suspend_requested
    FROM perdure.runs AS l WHERE l.run_id = %(run_id)s FOR UPDATE
), fence AS (
    UPDATE perdure.runs AS r SET
        ledger_sequence = r.ledger_sequence + %(receipts)s,
        updated_at = coalesce(%(now)s::timestamptz, statement_timestamp())
    FROM locked AS l
    WHERE r.run_id = l.run_id AND l.generation = %(generation)s AND l.worker = %(worker)s
      AND l.state = 'running'
      AND (NOT l.cancel_requested OR %(canceling)s)
      AND (NOT l.suspend_requested OR %(canceling)s)
    RETURNING r.run_id, r.ledger_sequence, r.ledger_limit
), put AS (
    INSERT INTO perdure.journal (
        run_id, position, kind, name, status, output, error, attempt, created_at, updated_at
    )
    SELECT f.run_id, e.position, e.kind, e.name, e.status, e.output, e.error, e.attempt,
           coalesce(%(now)s::timestamptz, statement_timestamp()),
           coalesce(%(now)s::timestamptz, statement_timestamp())
    FROM fence AS f, unnest(
        %(positions)s::integer[], %(kinds)s::text[], %(names)s::text[], %(statuses)s::text[],
        %(outputs)s::text[], %(errors)s::text[], %(attempts)s::integer[]
    ) AS e(position, kind, name, status, output, error, attempt)
    ON CONFLICT (run_id, position) DO UPDATE SET
        kind = EXCLUDED.kind,
        name = EXCLUDED.name,
        status = EXCLUDED.status,
        output = EXCLUDED.output,
        error = EXCLUDED.error,
        attempt = EXCLUDED.attempt,
        updated_at = EXCLUDED.updated_at
    WHERE perdure.journal.status = 'started'
    RETURNING position
), receipt AS (
    INSERT INTO perdure.ledger (run_id, sequence, kind, at, generation, worker, step, digest, note)
    SELECT f.run_id, f.ledger_sequence - %(receipts)s + r.ord, r.kind,
           coalesce(%(now)s::timestamptz, statement_timestamp()),
           %(generation)s, %(worker)s, r.step, r.digest, r.note
    FROM fence AS f, unnest(
        %(mark_kinds)s::text[], %(mark_steps)s::text[], %(mark_digests)s::text[],
        %(mark_notes)s::text[]
    ) WITH ORDINALITY AS r(kind, step, digest, note, ord)
    WHERE f.ledger_sequence - %(receipts)s + r.ord > f.ledger_sequence - f.ledger_limit
), trimmed AS (
    DELETE FROM perdure.ledger AS l USING fence AS f
    WHERE l.run_id = f.run_id AND l.sequence <= f.ledger_sequence - f.ledger_limit
), answered AS (
    UPDATE perdure.updates AS u SET
        state = 'answered',
        response = %(response)s,
        settled_at = coalesce(%(now)s::timestamptz, statement_timestamp())
    FROM fence AS f
    WHERE u.run_id = f.run_id AND u.update_id = %(update_id)s AND u.state = 'pending'
    RETURNING u.run_id
)
SELECT f.ledger_sequence,
       CASE WHEN (SELECT count(*) FROM put) < %(entries)s
            THEN perdure.refuse('journal_position_taken') END AS refused,
       (SELECT count(*) FROM answered) AS answered,
       -- The answer itself, for its sender, when it fits a notification (told
       -- before the run's announcement, which wakes the sender).
       CASE WHEN EXISTS (SELECT 1 FROM answered) AND octet_length(t.payload) <= 7000
            THEN pg_notify('perdure_answer', t.payload)::text END AS told,
       CASE WHEN EXISTS (SELECT 1 FROM answered)
            THEN pg_notify('perdure_live', f.run_id)::text END AS announced
FROM fence AS f, LATERAL (
    SELECT json_build_object(
        'run_id', f.run_id, 'update_id', %(update_id)s::text, 'response', %(response)s::text
    )::text AS payload
) AS t;

-- name: updates_abandon
-- Updates a run ended without answering; their senders are told so.
UPDATE perdure.updates SET state = 'abandoned', settled_at = coalesce(%(now)s::timestamptz, statement_timestamp())
WHERE run_id = ANY(%(run_ids)s::text[]) AND state = 'pending'
RETURNING run_id;

-- name: live_ended
-- Of runs that just ended, those someone may be following: with updates, or
-- with events or stream items in their journal.
SELECT r.run_id FROM unnest(%(run_ids)s::text[]) AS r(run_id)
WHERE EXISTS (SELECT 1 FROM perdure.updates AS u WHERE u.run_id = r.run_id)
   OR EXISTS (
      SELECT 1 FROM perdure.journal AS j
      WHERE j.run_id = r.run_id AND j.kind IN ('event', 'stream', 'stream_close')
   );

-- name: journal_after
SELECT * FROM perdure.journal
WHERE run_id = %(run_id)s AND position > %(after_position)s
ORDER BY position;

-- name: announce
-- Delivered when the transaction commits: the runs whose updates, events or
-- streams changed, for callers that watch them.
SELECT pg_notify('perdure_live', run_id) FROM unnest(%(run_ids)s::text[]) AS run_id;

-- name: listen_live
-- Changes of live runs, and the answers of updates (whose senders return with
-- the answer heard instead of reading it).
LISTEN perdure_live; LISTEN perdure_answer;

-- name: census
-- One row per state of the app's runs (one row of NULLs when it has none), each
-- with the store's instant; oldest_due is the earliest due ready_at of a waiting run.
SELECT s.state, s.n, s.oldest_due, c.at
FROM (SELECT coalesce(%(now)s::timestamptz, statement_timestamp()) AS at) AS c
LEFT JOIN LATERAL (
    SELECT state, count(*) AS n,
           min(ready_at) FILTER (WHERE state = 'waiting' AND ready_at <= c.at) AS oldest_due
    FROM perdure.runs WHERE app = %(app)s GROUP BY state
) AS s ON true;

-- == overview: read-only views for operators (perdure.store.overview) ==========

-- name: apps
SELECT DISTINCT app FROM perdure.runs ORDER BY app;

-- name: timers
-- Runs held until an instant by nothing but time: sleeping runs (waiting
-- with no registered wait) and queued runs that may not be claimed yet
-- (a retry's backoff, a release's delay).
SELECT * FROM perdure.runs AS r
WHERE r.app = %(app)s
  AND (%(run_id)s::text IS NULL OR r.run_id = %(run_id)s::text)
  AND r.ready_at IS NOT NULL
  AND (
      (r.state = 'waiting'
       AND NOT EXISTS (SELECT 1 FROM perdure.waits AS w WHERE w.run_id = r.run_id))
      OR (r.state = 'queued'
          AND r.ready_at > coalesce(%(now)s::timestamptz, statement_timestamp()))
  )
ORDER BY r.ready_at, r.run_id;

-- name: children_to_close
-- Live children of runs that just ended whose workflow cancels them when
-- their parent ends (parent_close = 'cancel'), not already told to cancel.
SELECT run_id FROM perdure.runs
WHERE parent_id = ANY(%(run_ids)s::text[])
  AND parent_close = 'cancel'
  AND state NOT IN ('succeeded', 'failed', 'canceled')
  AND NOT cancel_requested
ORDER BY run_id;

-- name: app_migration_applied
SELECT 1 AS applied FROM perdure.app_migrations WHERE app = %(app)s AND version = %(version)s;

-- name: app_migration_record
INSERT INTO perdure.app_migrations (app, version, applied_at)
VALUES (%(app)s, %(version)s, coalesce(%(now)s::timestamptz, statement_timestamp()));

-- name: app_migrations_lock
-- Processes that start together apply each of an app's migrations once.
SELECT pg_advisory_xact_lock(hashtext('perdure app migrations ' || %(app)s));
-- == schedules (perdure.store.scheduleport) ==================================

-- name: save_schedule
-- A new row is settled until now; an existing one keeps its state.
INSERT INTO perdure.schedules (
    app, name, workflow, version, cron, tz, catch_up, input, tick_arg,
    paused, settled_until, created_at, updated_at
)
SELECT %(app)s, %(name)s, %(workflow)s, %(version)s, %(cron)s, %(tz)s, %(catch_up)s,
       %(input)s, %(tick_arg)s, false, c.at, c.at, c.at
FROM (SELECT coalesce(%(now)s::timestamptz, statement_timestamp()) AS at) AS c
ON CONFLICT (app, name) DO UPDATE SET
    workflow = excluded.workflow, version = excluded.version, cron = excluded.cron,
    tz = excluded.tz, catch_up = excluded.catch_up, input = excluded.input,
    tick_arg = excluded.tick_arg, updated_at = excluded.updated_at
RETURNING *;

-- name: list_schedules
SELECT * FROM perdure.schedules
WHERE (%(app)s::text IS NULL OR app = %(app)s::text)
ORDER BY app, name;

-- name: settle_schedule
-- Only forward: two workers settling the same tick leave one answer.
UPDATE perdure.schedules SET
    settled_until = greatest(settled_until, %(through)s::timestamptz),
    last_run_id = CASE
        WHEN %(tick)s::timestamptz IS NOT NULL
             AND (last_tick IS NULL OR last_tick < %(tick)s::timestamptz)
        THEN %(run_id)s::text ELSE last_run_id END,
    last_tick = CASE
        WHEN %(tick)s::timestamptz IS NOT NULL
             AND (last_tick IS NULL OR last_tick < %(tick)s::timestamptz)
        THEN %(tick)s::timestamptz ELSE last_tick END,
    updated_at = coalesce(%(now)s::timestamptz, statement_timestamp())
WHERE app = %(app)s AND name = %(name)s;

-- name: pause_schedule
-- Resuming settles the ticks that passed while paused.
UPDATE perdure.schedules SET
    settled_until = CASE
        WHEN paused AND NOT %(paused)s::boolean
        THEN greatest(settled_until, coalesce(%(now)s::timestamptz, statement_timestamp()))
        ELSE settled_until END,
    paused = %(paused)s::boolean,
    updated_at = coalesce(%(now)s::timestamptz, statement_timestamp())
WHERE app = %(app)s AND name = %(name)s
RETURNING *;

-- == suspending runs and run deadlines (perdure.store.controlport) ===========

-- name: suspend_now
-- A queued or waiting run is suspended at once; it keeps its ready_at and
-- its waits, and remembers where resume returns it.
UPDATE perdure.runs SET
    suspended_from = state,
    state = 'suspended',
    ledger_sequence = ledger_sequence + 1,
    updated_at = coalesce(%(now)s::timestamptz, statement_timestamp())
WHERE run_id = %(run_id)s AND state IN ('queued', 'waiting')
RETURNING run_id, generation, ledger_sequence;

-- name: suspend_request
-- A running run is suspended by its owner, at its next journal write.
UPDATE perdure.runs SET
    suspend_requested = true,
    ledger_sequence = ledger_sequence + 1,
    updated_at = coalesce(%(now)s::timestamptz, statement_timestamp())
WHERE run_id = %(run_id)s AND state = 'running' AND NOT suspend_requested
RETURNING run_id, generation, ledger_sequence;

-- name: unsuspend
UPDATE perdure.runs SET
    state = coalesce(suspended_from, 'queued'),
    suspended_from = NULL,
    ledger_sequence = ledger_sequence + 1,
    updated_at = coalesce(%(now)s::timestamptz, statement_timestamp())
WHERE run_id = %(run_id)s AND state = 'suspended'
RETURNING run_id, app, state, ready_at, generation, ledger_sequence;

-- name: suspend_withdraw
-- Resume before the owner took the suspend: the run goes on.
UPDATE perdure.runs SET
    suspend_requested = false,
    ledger_sequence = ledger_sequence + 1,
    updated_at = coalesce(%(now)s::timestamptz, statement_timestamp())
WHERE run_id = %(run_id)s AND state = 'running' AND suspend_requested
RETURNING run_id, app, state, ready_at, generation, ledger_sequence;

-- name: let_go
-- The owner of a run whose suspend was asked records what it did and lets go:
-- the run becomes suspended (to resume as queued). SET expressions read the
-- old row, so a suspend withdrawn meanwhile leaves the run running and only
-- the entries are recorded. Fenced like every write; a cancel wins.
UPDATE perdure.runs SET
    state = CASE WHEN suspend_requested THEN 'suspended' ELSE state END,
    suspended_from = CASE WHEN suspend_requested THEN 'queued' ELSE suspended_from END,
    worker = CASE WHEN suspend_requested THEN NULL ELSE worker END,
    lease_expires_at = CASE WHEN suspend_requested THEN NULL ELSE lease_expires_at END,
    ready_at = CASE WHEN suspend_requested THEN NULL ELSE ready_at END,
    failures = CASE WHEN %(reset)s THEN 0 ELSE failures END,
    ledger_sequence = ledger_sequence + %(receipts)s
        + CASE WHEN suspend_requested THEN 1 ELSE 0 END,
    suspend_requested = false,
    updated_at = coalesce(%(now)s::timestamptz, statement_timestamp())
WHERE run_id = %(run_id)s AND generation = %(generation)s AND state = 'running'
  AND NOT cancel_requested
RETURNING app, generation, ledger_sequence, state;

-- name: deadline_due
-- Live runs past their deadline that no cancel has reached yet, a bounded
-- batch; served by runs_deadline.
SELECT run_id FROM perdure.runs
WHERE deadline IS NOT NULL AND deadline <= coalesce(%(now)s::timestamptz, statement_timestamp())
  AND state IN ('queued', 'running', 'waiting', 'suspended')
  AND NOT cancel_requested
  AND (%(app)s::text IS NULL OR app = %(app)s::text)
  AND (%(run_id)s::text IS NULL OR run_id = %(run_id)s::text)
ORDER BY deadline, run_id
LIMIT %(limit)s;

-- name: deadline_error
-- The error of runs a deadline cancels at once (a running one is ended by its owner).
UPDATE perdure.runs SET error = %(error)s
WHERE run_id = ANY(%(run_ids)s::text[])
  AND state IN ('queued', 'waiting', 'suspended');
-- == chains: continue-as-new (perdure.store.chaining) ==========================

-- name: chain_end
-- The fenced end of a run that continues as new: it gives up its key and
-- names its successor. The parent is not returned: the chain goes on, so the
-- parent's wait on it is not settled.
UPDATE perdure.runs SET
    state = 'succeeded',
    result = NULL,
    error = NULL,
    worker = NULL,
    lease_expires_at = NULL,
    ready_at = NULL,
    key = NULL,
    continued_as = %(successor_id)s,
    origin = coalesce(origin, run_id),
    ledger_sequence = ledger_sequence + %(receipts)s,
    updated_at = coalesce(%(now)s::timestamptz, statement_timestamp())
WHERE run_id = %(run_id)s AND generation = %(generation)s AND state = 'running'
  AND (NOT cancel_requested OR %(canceling)s)
RETURNING run_id, app, NULL::text AS parent_id, state, result, error, generation,
          ledger_sequence, origin;

-- name: chain_create
-- The successor takes the old run's app, parent, parent_close, origin, ledger
-- bound, deadline, place in a queue (queue, key, priority) and dry_run.
INSERT INTO perdure.runs (
    run_id, app, workflow, version, state, input, key, parent_id, parent_close, origin,
    ledger_sequence, ledger_limit, created_at, updated_at, deadline, queue, queue_key, priority,
    dry_run
)
SELECT %(run_id)s, app, %(workflow)s, %(version)s, 'queued', %(input)s, %(key)s, parent_id,
       parent_close, origin, 1, ledger_limit,
       coalesce(%(now)s::timestamptz, statement_timestamp()),
       coalesce(%(now)s::timestamptz, statement_timestamp()),
       deadline, queue, queue_key, priority, dry_run
FROM perdure.runs WHERE run_id = %(old_id)s
ON CONFLICT DO NOTHING
RETURNING *;

-- name: chain_messages_move
-- Unconsumed messages are numbered from 1 in send order; consumed ones keep
-- their key below 1 (see chainport), and those the old run itself carried
-- are dropped.
INSERT INTO perdure.messages (run_id, channel, key, sequence, payload, at)
SELECT %(run_id)s, m.channel, m.key,
       CASE WHEN m.done THEN -m.sequence
            ELSE row_number() OVER (PARTITION BY m.done ORDER BY m.sequence) END,
       m.payload, m.at
FROM (
    SELECT x.channel, x.key, x.sequence, x.payload, x.at,
           x.sequence <= coalesce(c.upto, 0) AS done
    FROM perdure.messages AS x
    LEFT JOIN unnest(%(channels)s::text[], %(sequences)s::bigint[]) AS c(channel, upto)
      ON c.channel = x.channel
    WHERE x.run_id = %(old_id)s AND x.sequence > 0
) AS m;

-- name: chain_messages_counted
UPDATE perdure.runs SET message_sequence = (
    SELECT count(*) FROM perdure.messages WHERE run_id = %(run_id)s AND sequence > 0
)
WHERE run_id = %(run_id)s;

-- name: chain_pending_signals
-- Signals sent to waits the run never applied (the rule of end_cleanup).
SELECT o.name FROM perdure.outcomes AS o
WHERE o.run_id = %(run_id)s AND o.outcome = 'signaled' AND o.name NOT LIKE 'child:%%'
  AND NOT EXISTS (
      SELECT 1 FROM perdure.journal AS j
      WHERE j.run_id = o.run_id AND j.kind = 'wait' AND j.name = o.name
        AND j.status <> 'started'
  )
ORDER BY o.name;

-- name: chain_signals_move
UPDATE perdure.outcomes AS o SET run_id = %(run_id)s, name = b.name
FROM unnest(%(olds)s::text[], %(names)s::text[]) AS b(old, name)
WHERE o.run_id = %(old_id)s AND o.name = b.old;

-- name: chain_runs
SELECT * FROM perdure.runs WHERE origin = %(origin)s;

-- name: chain_current
SELECT * FROM perdure.runs WHERE origin = %(origin)s AND continued_as IS NULL;

-- == queues: limits enforced at claim time (perdure.store.queueing) ==========
-- rate_per is an interval, read as rate_seconds.

-- name: save_queue
-- A declaration replaces the stored limits; the row keeps its created_at.
INSERT INTO perdure.queues (
    app, name, concurrency, per_key, rate_limit, rate_per, created_at, updated_at
)
VALUES (
    %(app)s, %(name)s, %(concurrency)s, %(per_key)s, %(rate_limit)s,
    make_interval(secs => %(rate_seconds)s::float8),
    coalesce(%(now)s::timestamptz, statement_timestamp()),
    coalesce(%(now)s::timestamptz, statement_timestamp())
)
ON CONFLICT (app, name) DO UPDATE SET
    concurrency = excluded.concurrency,
    per_key = excluded.per_key,
    rate_limit = excluded.rate_limit,
    rate_per = excluded.rate_per,
    updated_at = excluded.updated_at
RETURNING *, extract(epoch FROM rate_per)::float8 AS rate_seconds;

-- name: queue_by_name
SELECT *, extract(epoch FROM rate_per)::float8 AS rate_seconds FROM perdure.queues
WHERE app = %(app)s AND name = %(name)s;

-- name: queue_ready
-- Whether the queue has a claimable run at all (any workflow): a claim locks
-- the queue's row only then.
SELECT EXISTS (
    SELECT 1 FROM perdure.runs WHERE app = %(app)s AND queue = %(queue)s AND state = 'queued'
      AND ready_at IS NULL
) OR EXISTS (
    SELECT 1 FROM perdure.runs WHERE app = %(app)s AND queue = %(queue)s AND state = 'queued'
      AND ready_at <= coalesce(%(now)s::timestamptz, statement_timestamp())
) OR EXISTS (
    SELECT 1 FROM perdure.runs WHERE app = %(app)s AND queue = %(queue)s AND state = 'waiting'
      AND ready_at <= coalesce(%(now)s::timestamptz, statement_timestamp())
) AS ready;

-- name: queue_lock
-- Claims of the queue's runs queue up here, so each counts the others' slots.
SELECT *, extract(epoch FROM rate_per)::float8 AS rate_seconds FROM perdure.queues
WHERE app = %(app)s AND name = %(name)s
FOR UPDATE;

-- name: queues_of_app
SELECT *, extract(epoch FROM rate_per)::float8 AS rate_seconds FROM perdure.queues
WHERE app = %(app)s ORDER BY name;

-- name: list_queues
-- Waiting: queued for a slot (held back or not); parked runs hold none.
SELECT q.*, extract(epoch FROM q.rate_per)::float8 AS rate_seconds,
       (SELECT count(*) FROM perdure.runs AS r
        WHERE r.app = q.app AND r.queue = q.name AND r.state = 'running') AS running,
       (SELECT count(*) FROM perdure.runs AS r
        WHERE r.app = q.app AND r.queue = q.name AND r.state = 'queued') AS waiting
FROM perdure.queues AS q
WHERE (%(app)s::text IS NULL OR q.app = %(app)s::text)
ORDER BY q.app, q.name;

-- name: queue_running
-- The queue's running runs by key: lapsed leases hold their slot until recovered.
SELECT queue_key, count(*) AS n FROM perdure.runs
WHERE app = %(app)s AND queue = %(queue)s AND state = 'running'
GROUP BY queue_key;

-- name: queue_starts
-- The queue's first claims within its rate's window, and the oldest of them.
SELECT count(*) AS n, min(started_at) AS oldest FROM perdure.runs
WHERE app = %(app)s AND queue = %(queue)s
  AND started_at > coalesce(%(now)s::timestamptz, statement_timestamp())
      - (SELECT rate_per FROM perdure.queues WHERE app = %(app)s AND name = %(queue)s);

-- name: queue_candidates
-- The queue's claimable runs, lowest priority number first and then in the
-- order they became claimable; runs of the keys in busy (at their per-key
-- limit) are stepped over. One ordered, SKIP LOCKED index range per way a run
-- becomes claimable, each cut at the limit.
WITH wanted AS (
    SELECT * FROM unnest(%(workflows)s::text[], %(versions)s::text[]) AS w(workflow, version)
), fresh AS (
    SELECT run_id, priority, created_at AS due_at, created_at FROM perdure.runs
    WHERE app = %(app)s AND queue = %(queue)s AND state = 'queued' AND ready_at IS NULL
      AND (workflow, version) IN (SELECT workflow, version FROM wanted)
      AND (queue_key IS NULL OR NOT queue_key = ANY(%(busy)s::text[]))
    ORDER BY priority, created_at
    LIMIT %(limit)s
    FOR NO KEY UPDATE SKIP LOCKED
), backed_off AS (
    SELECT run_id, priority, ready_at AS due_at, created_at FROM perdure.runs
    WHERE app = %(app)s AND queue = %(queue)s AND state = 'queued'
      AND ready_at <= coalesce(%(now)s::timestamptz, statement_timestamp())
      AND (workflow, version) IN (SELECT workflow, version FROM wanted)
      AND (queue_key IS NULL OR NOT queue_key = ANY(%(busy)s::text[]))
    ORDER BY priority, ready_at
    LIMIT %(limit)s
    FOR NO KEY UPDATE SKIP LOCKED
), due AS (
    SELECT run_id, priority, ready_at AS due_at, created_at FROM perdure.runs
    WHERE app = %(app)s AND queue = %(queue)s AND state = 'waiting'
      AND ready_at <= coalesce(%(now)s::timestamptz, statement_timestamp())
      AND (workflow, version) IN (SELECT workflow, version FROM wanted)
      AND (queue_key IS NULL OR NOT queue_key = ANY(%(busy)s::text[]))
    ORDER BY priority, ready_at
    LIMIT %(limit)s
    FOR NO KEY UPDATE SKIP LOCKED
)
SELECT r.* FROM (
    SELECT * FROM fresh UNION ALL SELECT * FROM backed_off UNION ALL SELECT * FROM due
) AS p
JOIN perdure.runs AS r ON r.run_id = p.run_id
ORDER BY p.priority, p.due_at, p.created_at, p.run_id
LIMIT %(limit)s;

-- name: queue_claim
-- The candidates the queue's limits admit; started_at keeps the first claim.
UPDATE perdure.runs SET
    generation = generation + 1,
    state = 'running',
    worker = %(worker)s,
    lease_expires_at = coalesce(%(now)s::timestamptz, statement_timestamp())
        + make_interval(secs => %(lease_ttl)s::float8),
    lease_ttl = make_interval(secs => %(lease_ttl)s::float8),
    ready_at = NULL,
    ledger_sequence = ledger_sequence + 1,
    updated_at = coalesce(%(now)s::timestamptz, statement_timestamp()),
    started_at = coalesce(started_at, coalesce(%(now)s::timestamptz, statement_timestamp()))
WHERE run_id = ANY(%(run_ids)s::text[]) AND state IN ('queued', 'waiting')
RETURNING *;

-- name: owner_lock
SELECT posture, holder, generation,
       lease_expires_at <= coalesce(%(now)s::timestamptz, statement_timestamp()) AS expired,
       extract(epoch FROM lease_expires_at
           - coalesce(%(now)s::timestamptz, statement_timestamp()))::float8 AS expires_in
FROM perdure.app_owners WHERE app = %(app)s
FOR UPDATE;

-- name: owner_insert
INSERT INTO perdure.app_owners (app, posture, holder, lease_expires_at, generation, updated_at)
VALUES (
    %(app)s, %(posture)s, %(holder)s,
    coalesce(%(now)s::timestamptz, statement_timestamp()) + make_interval(secs => %(ttl)s::float8),
    1, coalesce(%(now)s::timestamptz, statement_timestamp())
)
ON CONFLICT (app) DO NOTHING
RETURNING generation;

-- name: owner_update
UPDATE perdure.app_owners SET
    posture = %(posture)s,
    holder = %(holder)s,
    lease_expires_at = coalesce(%(now)s::timestamptz, statement_timestamp())
        + make_interval(secs => %(ttl)s::float8),
    generation = generation + %(takeover)s,
    updated_at = coalesce(%(now)s::timestamptz, statement_timestamp())
WHERE app = %(app)s
RETURNING generation;

-- name: owner_lapse
-- The runs an expired holder left in flight lapse now, under a new
-- generation: the holder's writes are fenced off, and the ordinary claim
-- recovers them.
UPDATE perdure.runs SET
    generation = generation + 1,
    lease_expires_at = coalesce(%(now)s::timestamptz, statement_timestamp()),
    updated_at = coalesce(%(now)s::timestamptz, statement_timestamp())
WHERE app = %(app)s AND state = 'running' AND worker = %(holder)s
RETURNING run_id;

-- name: owner_lapse_tasks
-- Likewise the tasks it held: a claim recovers them under a new generation.
UPDATE perdure.tasks SET lease_expires_at = coalesce(%(now)s::timestamptz, statement_timestamp()), updated_at = coalesce(%(now)s::timestamptz, statement_timestamp())
WHERE state = 'running' AND worker = %(holder)s
  AND run_id IN (SELECT run_id FROM perdure.runs WHERE app = %(app)s AND state = 'running')
RETURNING run_id;

-- name: owner_drop
DELETE FROM perdure.app_owners WHERE app = %(app)s AND holder = %(holder)s;

-- == plans: tasks claimed one by one (perdure.store.planning) ================

-- name: plan_admit
-- A plan run has no owner of its own: it runs while its tasks do.
UPDATE perdure.runs SET
    state = 'running',
    plan_digest = %(digest)s,
    plan_policy = %(policy)s,
    updated_at = coalesce(%(now)s::timestamptz, statement_timestamp())
WHERE run_id = %(run_id)s AND state = 'queued' AND generation = 0;

-- name: task_insert
INSERT INTO perdure.tasks (
    run_id, name, position, parents, effect, state, max_recoveries, output,
    created_at, updated_at, ended_at
)
VALUES (
    %(run_id)s, %(name)s, %(position)s, %(parents)s::jsonb, %(effect)s,
    CASE WHEN %(output)s::text IS NULL THEN 'pending' ELSE 'succeeded' END,
    %(max_recoveries)s, %(output)s::text, coalesce(%(now)s::timestamptz, statement_timestamp()), coalesce(%(now)s::timestamptz, statement_timestamp()),
    CASE WHEN %(output)s::text IS NULL THEN NULL ELSE coalesce(%(now)s::timestamptz, statement_timestamp()) END
);

-- name: tasks_of_run
SELECT * FROM perdure.tasks WHERE run_id = %(run_id)s ORDER BY position;

-- name: task_row
SELECT * FROM perdure.tasks WHERE run_id = %(run_id)s AND name = %(name)s;

-- name: task_open
-- Whether the run has a task still pending or running (through tasks_open).
SELECT 1 AS open FROM perdure.tasks
WHERE run_id = %(run_id)s AND state IN ('pending', 'running')
LIMIT 1;

-- name: task_candidates
-- Pending tasks whose parents all succeeded (each read again by task_claim
-- under the lock), then lapsed ones, of running plan runs of the served
-- names and versions; the caller compares digests.
WITH wanted AS (
    SELECT e->>0 AS workflow, e->>1 AS version
    FROM jsonb_array_elements(%(plans)s::jsonb) AS e
)
SELECT * FROM (
    SELECT t.run_id, t.name, t.state, r.workflow, r.version, r.plan_digest,
           r.created_at AS run_created_at, t.position
    FROM perdure.tasks AS t JOIN perdure.runs AS r ON r.run_id = t.run_id
    WHERE t.state = 'pending' AND (t.ready_at IS NULL OR t.ready_at <= coalesce(%(now)s::timestamptz, statement_timestamp()))
      AND r.app = %(app)s AND r.state = 'running' AND NOT r.cancel_requested
      AND (r.workflow, r.version) IN (SELECT workflow, version FROM wanted)
      AND NOT EXISTS (
          -- Parents that are no JSON array make the task a candidate, so that
          -- the caller's read of the run refuses it rather than this query fail.
          -- Each parent is found by its key: a missing one holds the task back.
          SELECT 1 FROM jsonb_array_elements_text(CASE WHEN jsonb_typeof(t.parents) = 'array'
              THEN t.parents ELSE '[]'::jsonb END) AS p(name)
          WHERE coalesce((SELECT up.state FROM perdure.tasks AS up
                          WHERE up.run_id = t.run_id AND up.name = p.name), '') <> 'succeeded'
      )
    UNION ALL
    SELECT t.run_id, t.name, t.state, r.workflow, r.version, r.plan_digest,
           r.created_at, t.position
    FROM perdure.tasks AS t JOIN perdure.runs AS r ON r.run_id = t.run_id
    WHERE t.state = 'running' AND t.lease_expires_at <= coalesce(%(now)s::timestamptz, statement_timestamp())
      AND coalesce(%(now)s::timestamptz, statement_timestamp()) <= %(recover_until)s::timestamptz
      AND r.app = %(app)s AND r.state = 'running' AND NOT r.cancel_requested
      AND (r.workflow, r.version) IN (SELECT workflow, version FROM wanted)
) AS c
ORDER BY run_created_at, run_id, position
LIMIT %(limit)s;

-- name: task_lapsed_canceling
-- Tasks whose worker is gone, of runs being canceled: no claim will take them.
SELECT t.run_id, t.name FROM perdure.tasks AS t JOIN perdure.runs AS r ON r.run_id = t.run_id
WHERE t.state = 'running' AND t.lease_expires_at <= coalesce(%(now)s::timestamptz, statement_timestamp())
  AND coalesce(%(now)s::timestamptz, statement_timestamp()) <= %(recover_until)s::timestamptz
  AND r.app = %(app)s AND r.state = 'running' AND r.cancel_requested
ORDER BY t.run_id, t.position;

-- name: task_claim
-- Every precondition again, after the run's row is locked.
UPDATE perdure.tasks SET
    state = 'running',
    generation = generation + 1,
    attempt = attempt + 1,
    recoveries = recoveries + (state = 'running')::integer,
    worker = %(worker)s,
    lease_expires_at = coalesce(%(now)s::timestamptz, statement_timestamp()) + make_interval(secs => %(lease_ttl)s::float8),
    ready_at = NULL,
    effect_started = false,
    started_at = coalesce(%(now)s::timestamptz, statement_timestamp()),
    updated_at = coalesce(%(now)s::timestamptz, statement_timestamp())
WHERE run_id = %(run_id)s AND name = %(name)s
  AND EXISTS (
      SELECT 1 FROM perdure.runs AS r
      WHERE r.run_id = tasks.run_id AND r.state = 'running' AND NOT r.cancel_requested
  )
  AND (
      (state = 'pending' AND (ready_at IS NULL OR ready_at <= coalesce(%(now)s::timestamptz, statement_timestamp())) AND NOT EXISTS (
          SELECT 1 FROM jsonb_array_elements_text(tasks.parents) AS p(name)
          WHERE coalesce((SELECT up.state FROM perdure.tasks AS up
                          WHERE up.run_id = tasks.run_id AND up.name = p.name), '') <> 'succeeded'
      ))
      OR (state = 'running' AND lease_expires_at <= coalesce(%(now)s::timestamptz, statement_timestamp()))
  )
RETURNING *;

-- name: task_parent_outputs
SELECT up.name, up.output
FROM perdure.tasks AS t
CROSS JOIN LATERAL jsonb_array_elements_text(t.parents) AS p(name)
JOIN perdure.tasks AS up ON up.run_id = t.run_id AND up.name = p.name
WHERE t.run_id = %(run_id)s AND t.name = %(name)s;

-- name: task_renew
UPDATE perdure.tasks SET
    lease_expires_at = coalesce(%(now)s::timestamptz, statement_timestamp()) + make_interval(secs => %(lease_ttl)s::float8)
WHERE run_id = %(run_id)s AND name = %(name)s AND generation = %(generation)s
  AND state = 'running'
RETURNING lease_expires_at;

-- name: task_effect
UPDATE perdure.tasks SET effect_started = true, attempt = %(attempt)s, updated_at = coalesce(%(now)s::timestamptz, statement_timestamp())
WHERE run_id = %(run_id)s AND name = %(name)s AND generation = %(generation)s
  AND state = 'running'
RETURNING name;

-- name: task_retry
UPDATE perdure.tasks SET effect_started = false, attempt = %(attempt)s, error = %(error)s,
    updated_at = coalesce(%(now)s::timestamptz, statement_timestamp())
WHERE run_id = %(run_id)s AND name = %(name)s AND generation = %(generation)s
  AND state = 'running'
RETURNING name;

-- name: task_end
-- The fenced final write of a claimed task (and of a lapsed one, by the
-- claim that settles it: generation is then the one read under the lock).
UPDATE perdure.tasks SET
    state = %(state)s,
    output = %(output)s,
    error = %(error)s,
    worker = CASE WHEN %(state)s = 'pending' THEN NULL ELSE worker END,
    lease_expires_at = NULL,
    ready_at = CASE WHEN %(delay)s::float8 IS NULL THEN NULL
        ELSE coalesce(%(now)s::timestamptz, statement_timestamp()) + make_interval(secs => %(delay)s::float8) END,
    attempt = CASE WHEN %(state)s = 'pending' THEN attempt - 1 ELSE attempt END,
    ended_at = CASE WHEN %(state)s = 'pending' THEN NULL ELSE coalesce(%(now)s::timestamptz, statement_timestamp()) END,
    updated_at = coalesce(%(now)s::timestamptz, statement_timestamp())
WHERE run_id = %(run_id)s AND name = %(name)s AND generation = %(generation)s
  AND state = 'running'
RETURNING name;

-- name: task_block
-- Every pending descendant of the task, at any depth, is blocked by it.
WITH RECURSIVE below(name) AS (
    SELECT t.name FROM perdure.tasks AS t
    WHERE t.run_id = %(run_id)s AND t.parents ? %(name)s
    UNION
    SELECT t.name FROM perdure.tasks AS t JOIN below AS b ON t.parents ? b.name
    WHERE t.run_id = %(run_id)s
)
UPDATE perdure.tasks SET state = 'blocked', blocked_by = %(name)s, ended_at = coalesce(%(now)s::timestamptz, statement_timestamp()),
    updated_at = coalesce(%(now)s::timestamptz, statement_timestamp())
WHERE run_id = %(run_id)s AND state = 'pending' AND name IN (SELECT name FROM below)
RETURNING name;

-- name: task_unblock
UPDATE perdure.tasks SET state = 'pending', blocked_by = NULL, ended_at = NULL, updated_at = coalesce(%(now)s::timestamptz, statement_timestamp())
WHERE run_id = %(run_id)s AND state = 'blocked' AND blocked_by = %(name)s
RETURNING name;

-- name: task_cancel_pending
UPDATE perdure.tasks SET state = 'canceled', ended_at = coalesce(%(now)s::timestamptz, statement_timestamp()), updated_at = coalesce(%(now)s::timestamptz, statement_timestamp())
WHERE run_id = %(run_id)s AND state = 'pending'
RETURNING name;

-- name: task_resolve
UPDATE perdure.tasks SET state = 'succeeded', output = %(output)s, error = NULL,
    ended_at = coalesce(%(now)s::timestamptz, statement_timestamp()), updated_at = coalesce(%(now)s::timestamptz, statement_timestamp())
WHERE run_id = %(run_id)s AND name = %(name)s AND state = 'needs_attention'
RETURNING name;

-- name: plan_touch
-- Receipts of a task transition are numbered on its run.
UPDATE perdure.runs SET ledger_sequence = ledger_sequence + %(receipts)s, updated_at = coalesce(%(now)s::timestamptz, statement_timestamp())
WHERE run_id = %(run_id)s
RETURNING ledger_sequence, generation;

-- name: plan_end
UPDATE perdure.runs SET
    state = %(state)s,
    result = %(result)s,
    error = %(error)s,
    ledger_sequence = ledger_sequence + 1,
    updated_at = coalesce(%(now)s::timestamptz, statement_timestamp())
WHERE run_id = %(run_id)s AND state = 'running' AND plan_digest IS NOT NULL
RETURNING run_id, app, parent_id, state, result, error, generation, ledger_sequence, origin;

-- name: plan_reopen
UPDATE perdure.runs SET state = 'running', error = NULL, ledger_sequence = ledger_sequence + 1,
    updated_at = coalesce(%(now)s::timestamptz, statement_timestamp())
WHERE run_id = %(run_id)s AND state = 'needs_attention' AND plan_digest IS NOT NULL
RETURNING ledger_sequence, generation;

-- name: plan_mismatch
UPDATE perdure.runs SET state = 'needs_attention', error = %(error)s,
    ledger_sequence = ledger_sequence + 1, updated_at = coalesce(%(now)s::timestamptz, statement_timestamp())
WHERE run_id = %(run_id)s AND state = 'running' AND plan_digest IS NOT NULL
RETURNING ledger_sequence, generation;
