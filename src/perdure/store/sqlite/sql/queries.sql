-- Named queries of the embedded store, used by perdure/store/sqlite/store.py.
--
-- Instants are integer microseconds since the epoch; a list parameter arrives
-- as a JSON array, and a batch as :batch, one JSON array of rows (read with
-- json_each, in one pass). A query may hold several statements, run in order. Every write runs inside the caller's
-- BEGIN IMMEDIATE transaction, so reads made within one see a state no other
-- writer can change before COMMIT. The names are the PostgreSQL store's,
-- query for query (see docs/store.md).

-- name: migrate_prepare
CREATE TABLE IF NOT EXISTS perdure_schema (
    version INTEGER PRIMARY KEY,
    applied_at INTEGER NOT NULL
);

-- name: schema_version
SELECT coalesce(max(version), 0) AS version FROM perdure_schema;

-- name: record_migration
INSERT INTO perdure_schema (version, applied_at) VALUES (:version, :now);

-- name: create_run
-- Conflicts on run_id or on (app, key) store nothing; the caller reads back.
INSERT INTO runs (
    run_id, app, workflow, version, state, input, key, parent_id,
    ledger_sequence, ledger_limit, created_at, updated_at, deadline, queue, queue_key, priority,
    dry_run
)
VALUES (
    :run_id, :app, :workflow, :version, 'queued', :input, :key, :parent_id,
    1, :ledger_limit, :now, :now, :deadline, :queue, :queue_key, :priority, :dry_run
)
ON CONFLICT DO NOTHING
RETURNING *;

-- name: create_claimed
-- create_run for a run its starter's own worker takes at once: it is stored
-- running under :worker at generation 1, as the claim would leave it, and
-- announced to no one. Its receipts ("initialized", "claimed") follow.
INSERT INTO runs (
    run_id, app, workflow, version, state, input, key, parent_id,
    generation, worker, lease_expires_at, lease_ttl,
    ledger_sequence, ledger_limit, created_at, updated_at, deadline, queue, queue_key, priority,
    dry_run
)
VALUES (
    :run_id, :app, :workflow, :version, 'running', :input, :key, :parent_id,
    1, :worker, :now + CAST(round(:lease_ttl * 1000000) AS INTEGER),
    CAST(round(:lease_ttl * 1000000) AS INTEGER),
    2, :ledger_limit, :now, :now, :deadline, :queue, :queue_key, :priority, :dry_run
)
ON CONFLICT DO NOTHING
RETURNING *;

-- name: create_children
-- One statement for the whole fan-out; children whose key exists are left as stored.
-- :batch rows are [run_id, app, workflow, version, input, key, parent_close].
-- A child of a dry run is dry.
INSERT INTO runs (
    run_id, app, workflow, version, state, input, key, parent_id,
    ledger_sequence, ledger_limit, created_at, updated_at, parent_close, dry_run
)
SELECT json_extract(b.value, '$[0]'), json_extract(b.value, '$[1]'), json_extract(b.value, '$[2]'), json_extract(b.value, '$[3]'), 'queued',
       json_extract(b.value, '$[4]'), json_extract(b.value, '$[5]'), :parent_id, 1, :ledger_limit, :now, :now,
       json_extract(b.value, '$[6]'),
       coalesce((SELECT dry_run FROM runs WHERE run_id = :parent_id), 0)
FROM json_each(:batch) AS b
WHERE true
ON CONFLICT DO NOTHING
RETURNING run_id, app;

-- name: runs_by_key
-- :batch rows are [app, key].
SELECT r.*
FROM json_each(:batch) AS b
JOIN runs AS r ON r.app = json_extract(b.value, '$[0]') AND r.key = json_extract(b.value, '$[1]')
ORDER BY b.key;

-- name: run_by_id
SELECT * FROM runs WHERE run_id = :run_id;

-- name: lock_run
-- The write transaction holds the database lock: a read is a locked read.
SELECT * FROM runs WHERE run_id = :run_id;

-- name: lock_runs
SELECT * FROM runs WHERE run_id IN (SELECT value FROM json_each(:run_ids)) ORDER BY run_id;

-- name: list_runs
SELECT * FROM runs
WHERE app = :app
  AND (:state IS NULL OR state = :state)
  AND (:workflow IS NULL OR workflow = :workflow)
  AND (:dry_run IS NULL OR dry_run = :dry_run)
ORDER BY created_at DESC, run_id DESC
LIMIT :limit;

-- name: child_counts
SELECT state, count(*) AS n FROM runs WHERE parent_id = :run_id GROUP BY state;

-- name: run_tree
-- The run and every descendant. UNION (not UNION ALL) ends the walk even if
-- corrupt parent links formed a cycle.
WITH RECURSIVE tree(run_id) AS (
    SELECT :run_id
    UNION
    SELECT r.run_id FROM runs AS r JOIN tree AS t ON r.parent_id = t.run_id
)
SELECT run_id FROM tree;

-- name: journal
SELECT * FROM journal WHERE run_id = :run_id ORDER BY position;

-- name: journals
SELECT * FROM journal
WHERE run_id IN (SELECT value FROM json_each(:run_ids))
ORDER BY run_id, position;

-- name: journal_entry
SELECT * FROM journal WHERE run_id = :run_id AND position = :position;

-- name: history
-- Every stored receipt: trimming happens on append, and validation on read
-- must see a ledger that holds more (or less) than it should.
SELECT * FROM ledger WHERE run_id = :run_id ORDER BY sequence;

-- name: outcomes
SELECT * FROM outcomes WHERE run_id = :run_id ORDER BY at, name;

-- name: outcomes_of_runs
SELECT * FROM outcomes
WHERE run_id IN (SELECT value FROM json_each(:run_ids))
ORDER BY run_id, at, name;

-- name: claim
-- One ordered index range per way a run becomes claimable, each cut at
-- :limit, so a large backlog costs no sort. Runs in a queue are claimed by
-- queue_candidates instead; a lapsed one is recovered here (it keeps its
-- slot). Ordered by the instant since which each run has been claimable. A
-- dry run is claimed only by a dry-run claim (:dry_run), checked on the row
-- each range already reads.
WITH wanted(workflow, version) AS (
    SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]')
    FROM json_each(:workflows)
),
due(run_id, state, due_at, created_at) AS (
    SELECT * FROM (
        SELECT run_id, state, created_at, created_at FROM runs
        WHERE app = :app AND state = 'queued' AND ready_at IS NULL
          AND dry_run = :dry_run
          AND queue IS NULL AND (workflow, version) IN (SELECT workflow, version FROM wanted)
        ORDER BY created_at LIMIT :limit
    )
    UNION ALL
    SELECT * FROM (
        SELECT run_id, state, ready_at, created_at FROM runs
        WHERE app = :app AND state = 'queued' AND ready_at <= :now
          AND dry_run = :dry_run
          AND queue IS NULL AND (workflow, version) IN (SELECT workflow, version FROM wanted)
        ORDER BY ready_at LIMIT :limit
    )
    UNION ALL
    SELECT * FROM (
        SELECT run_id, state, ready_at, created_at FROM runs
        WHERE app = :app AND state = 'waiting' AND ready_at <= :now
          AND dry_run = :dry_run
          AND queue IS NULL AND (workflow, version) IN (SELECT workflow, version FROM wanted)
        ORDER BY ready_at LIMIT :limit
    )
    UNION ALL
    SELECT * FROM (
        -- Named: with no statistics the planner would take the app's
        -- workflow page index and read every run the workflow ever had.
        SELECT run_id, state, lease_expires_at, created_at FROM runs INDEXED BY runs_running
        WHERE app = :app AND state = 'running' AND lease_expires_at <= :now
          -- A lapse counts only while the caller trusts this clock (NULL: never).
          AND :now <= :recover_until
          AND dry_run = :dry_run
          AND (workflow, version) IN (SELECT workflow, version FROM wanted)
        ORDER BY lease_expires_at LIMIT :limit
    )
)
-- Whole rows, so that the claim refuses a corrupt one instead of rewriting it.
SELECT runs.* FROM due JOIN runs ON runs.run_id = due.run_id
ORDER BY due.due_at, due.created_at, due.run_id
LIMIT :limit;

-- name: claim_warm
-- One run its worker parked warm, as a claim candidate: by key, only at the
-- generation it was parked with, and only if the claim would take it (in no
-- queue, queued and due or waiting past its deadline). claim_one takes it.
SELECT * FROM runs
WHERE run_id = :run_id AND app = :app AND generation = :generation
  AND queue IS NULL AND dry_run = :dry_run
  AND (workflow, version) IN (
      SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(:workflows)
  )
  AND ((state = 'queued' AND (ready_at IS NULL OR ready_at <= :now))
       OR (state = 'waiting' AND ready_at <= :now));

-- name: claim_one
-- SET expressions read the old row, so a lapsed 'running' lease counts as a
-- failure here.
UPDATE runs SET
    generation = generation + 1,
    failures = failures + (state = 'running'),
    state = 'running',
    worker = :worker,
    lease_expires_at = :now + CAST(round(:lease_ttl * 1000000) AS INTEGER),
    lease_ttl = CAST(round(:lease_ttl * 1000000) AS INTEGER),
    ready_at = NULL,
    ledger_sequence = ledger_sequence + 1,
    updated_at = :now
WHERE run_id = :run_id
RETURNING *;

-- name: quarantine
-- A claim candidate whose rows cannot be read is set aside, so that it stops
-- being a candidate and no other run waits behind it. Nothing else is touched.
UPDATE runs SET
    state = 'needs_attention',
    error = :error,
    worker = NULL,
    lease_expires_at = NULL,
    ready_at = NULL,
    ledger_sequence = ledger_sequence + 1,
    updated_at = :now
WHERE run_id = :run_id
RETURNING generation, ledger_sequence;

-- name: fence_state
SELECT generation, state, cancel_requested, suspend_requested FROM runs WHERE run_id = :run_id;

-- name: next_lapse
-- The earliest lease of the app's running runs still to lapse (runs_running).
SELECT min(lease_expires_at) AS at FROM runs
WHERE state = 'running' AND lease_expires_at > :now AND app = :app;

-- name: renew
UPDATE runs SET
    lease_expires_at = :now + CAST(round(:lease_ttl * 1000000) AS INTEGER),
    lease_ttl = CAST(round(:lease_ttl * 1000000) AS INTEGER)
WHERE run_id = :run_id AND generation = :generation AND state = 'running'
  AND (cancel_requested = 0 OR :canceling)
RETURNING lease_expires_at;

-- name: fence_touch
UPDATE runs SET
    ledger_sequence = ledger_sequence + :receipts,
    updated_at = :now
WHERE run_id = :run_id AND generation = :generation AND state = 'running'
  AND (cancel_requested = 0 OR :canceling)
  AND (suspend_requested = 0 OR :canceling)
RETURNING app, generation, ledger_sequence, ledger_limit;

-- name: fence_step
UPDATE runs SET
    failures = 0,
    ledger_sequence = ledger_sequence + :receipts,
    updated_at = :now
WHERE run_id = :run_id AND generation = :generation AND state = 'running'
  AND (cancel_requested = 0 OR :canceling)
  AND (suspend_requested = 0 OR :canceling)
RETURNING app, generation, ledger_sequence, ledger_limit;

-- name: release
-- A run whose suspend was asked is given back suspended (to resume as queued).
UPDATE runs SET
    state = CASE WHEN suspend_requested = 1 THEN 'suspended' ELSE 'queued' END,
    suspended_from = CASE WHEN suspend_requested = 1 THEN 'queued' ELSE suspended_from END,
    suspend_requested = 0,
    worker = NULL,
    lease_expires_at = NULL,
    ready_at = :now + CAST(round(:delay * 1000000) AS INTEGER),
    failures = failures + :failed,
    ledger_sequence = ledger_sequence + :receipts,
    updated_at = :now
WHERE run_id = :run_id AND generation = :generation AND state = 'running'
  AND (cancel_requested = 0 OR :canceling)
RETURNING app, generation, ledger_sequence;

-- name: park_run
-- Runs after the fence in the same transaction, so no condition is needed.
UPDATE runs SET
    state = 'waiting',
    worker = NULL,
    lease_expires_at = NULL,
    ready_at = :ready_at,
    ledger_sequence = ledger_sequence + 1
WHERE run_id = :run_id
RETURNING ledger_sequence;

-- name: finish
UPDATE runs SET
    state = :state,
    result = :result,
    error = :error,
    worker = NULL,
    lease_expires_at = NULL,
    ready_at = NULL,
    ledger_sequence = ledger_sequence + :receipts,
    updated_at = :now
WHERE run_id = :run_id AND generation = :generation AND state = 'running'
  AND (cancel_requested = 0 OR :canceling)
RETURNING run_id, app, parent_id, state, result, error, generation, ledger_sequence, origin,
    ledger_limit;

-- name: journal_put
-- One row per call: SQLite has no arrays, and decoding a JSON batch costs
-- more than the statement it saves. An existing position is replaced only
-- while it is 'started'; any other is left alone and changes no row, and the
-- caller refuses.
INSERT INTO journal (
    run_id, position, kind, name, status, output, error, attempt, created_at, updated_at
)
VALUES (:run_id, :position, :kind, :name, :status, :output, :error, :attempt, :now, :now)
ON CONFLICT (run_id, position) DO UPDATE SET
    kind = excluded.kind,
    name = excluded.name,
    status = excluded.status,
    output = excluded.output,
    error = excluded.error,
    attempt = excluded.attempt,
    updated_at = excluded.updated_at
WHERE journal.status = 'started';

-- name: ledger_append
-- One receipt, numbered (the run's ledger_sequence was raised by the same
-- transaction). Each run keeps its newest receipts, as many as its own
-- ledger_limit, counting the new ones: a receipt already past the bound is
-- not stored.
INSERT INTO ledger (run_id, sequence, kind, at, generation, worker, step, digest, note)
SELECT :run_id, :sequence, :kind, :now, :generation, :worker, :step, :digest, :note
FROM runs AS u
WHERE u.run_id = :run_id AND :sequence > u.ledger_sequence - u.ledger_limit
RETURNING sequence > (SELECT ledger_limit FROM runs WHERE run_id = :run_id) AS due;

-- name: ledger_put
-- One receipt of a step's write, whose fence returned the run's bound: the
-- caller stores only what the bound keeps and trims with ledger_cut.
INSERT INTO ledger (run_id, sequence, kind, at, generation, worker, step, digest, note)
VALUES (:run_id, :sequence, :kind, :now, :generation, :worker, :step, :digest, :note);

-- name: ledger_put_pair
-- The two receipts of one write (a step's start and end, most often) in one
-- statement: half the calls of two ledger_put.
INSERT INTO ledger (run_id, sequence, kind, at, generation, worker, step, digest, note)
VALUES (:run_id, :sequence, :kind, :now, :generation, :worker, :step, :digest, :note),
       (:run_id, :sequence + 1, :kind_2, :now, :generation, :worker, :step_2, :digest_2, :note_2);

-- name: ledger_cut
DELETE FROM ledger WHERE run_id = :run_id AND sequence <= :upto;

-- name: ledger_trim
-- Once per run and write, only once the run has passed its bound (ledger_append
-- says when): drops what the bound no longer keeps.
DELETE FROM ledger WHERE run_id = :run_id AND sequence <= (
    SELECT ledger_sequence - ledger_limit FROM runs WHERE run_id = :run_id
);

-- name: park_waits
-- Replaces the run's registrations. A wait registered again keeps its
-- created_at, so listings stay in order.
-- :batch rows are [name, kind, deadline, after_sequence].
DELETE FROM waits
WHERE run_id = :run_id
  AND name NOT IN (SELECT json_extract(value, '$[0]') FROM json_each(:batch));
INSERT INTO waits (run_id, name, app, kind, deadline, after_sequence, created_at)
SELECT :run_id, json_extract(b.value, '$[0]'), :app, json_extract(b.value, '$[1]'), json_extract(b.value, '$[2]'), json_extract(b.value, '$[3]'), :now
FROM json_each(:batch) AS b
WHERE true
ON CONFLICT (run_id, name) DO UPDATE SET
    kind = excluded.kind,
    deadline = excluded.deadline,
    after_sequence = excluded.after_sequence;

-- name: park_satisfied
-- A due instant, any registered wait with an outcome, or a channel (update)
-- wait with a newer message (update).
SELECT coalesce(:ready_at <= :now, 0) OR EXISTS (
    SELECT 1 FROM waits AS w
    WHERE w.run_id = :run_id
      AND (
        EXISTS (SELECT 1 FROM outcomes AS o WHERE o.run_id = w.run_id AND o.name = w.name)
        OR (w.kind = 'channel' AND EXISTS (
            SELECT 1 FROM messages AS m
            WHERE m.run_id = w.run_id AND m.channel = w.name AND m.sequence > w.after_sequence
        ))
        OR (w.kind = 'update' AND EXISTS (
            SELECT 1 FROM updates AS u
            WHERE u.run_id = w.run_id AND u.name = w.name AND u.sequence > w.after_sequence
        ))
      )
) AS satisfied;

-- name: outcome_put
-- A signal that arrives after its registered wait's deadline settles the wait
-- as timed out instead, without the payload.
INSERT INTO outcomes (run_id, name, outcome, signal_id, payload, payload_digest, at)
SELECT :run_id, :name,
       CASE WHEN x.expired THEN 'timed_out' ELSE :outcome END,
       CASE WHEN x.expired THEN NULL ELSE :signal_id END,
       CASE WHEN x.expired THEN NULL ELSE :payload END,
       CASE WHEN x.expired THEN NULL ELSE :payload_digest END,
       :now
FROM (
    SELECT :outcome = 'signaled' AND EXISTS (
        SELECT 1 FROM waits AS w
        WHERE w.run_id = :run_id AND w.name = :name AND w.deadline <= :now
    ) AS expired
) AS x
WHERE true
ON CONFLICT (run_id, name) DO NOTHING
RETURNING *;

-- name: outcome_get
SELECT * FROM outcomes WHERE run_id = :run_id AND name = :name;

-- name: child_outcomes_put
-- Only a parent that has not ended can still use its child's outcome.
-- :batch rows are [parent_id, name, payload].
INSERT INTO outcomes (run_id, name, outcome, signal_id, payload, payload_digest, at)
SELECT p.run_id, json_extract(b.value, '$[1]'), 'signaled', NULL, json_extract(b.value, '$[2]'), NULL, :now
FROM json_each(:batch) AS b
JOIN runs AS p ON p.run_id = json_extract(b.value, '$[0]')
WHERE p.state IN ('queued', 'running', 'waiting', 'suspended')
ON CONFLICT (run_id, name) DO NOTHING;

-- name: wake_parents
-- A child's end wakes its parent only when the parent is parked on that very
-- child, so a fan-out does not wake the parent once per child.
-- :batch rows are [parent_id, name].
UPDATE runs SET
    state = 'queued',
    ready_at = NULL,
    ledger_sequence = ledger_sequence + 1,
    updated_at = :now
WHERE state = 'waiting'
  AND run_id IN (
      SELECT w.run_id
      FROM json_each(:batch) AS b
      JOIN waits AS w ON w.run_id = json_extract(b.value, '$[0]') AND w.name = json_extract(b.value, '$[1]')
  )
RETURNING run_id, app, generation, ledger_sequence;

-- name: waits_of_app
SELECT * FROM waits AS w
WHERE w.app = :app
  AND NOT EXISTS (SELECT 1 FROM outcomes AS o WHERE o.run_id = w.run_id AND o.name = w.name)
ORDER BY w.created_at, w.run_id, w.name;

-- name: waits_of_run
SELECT * FROM waits AS w
WHERE w.run_id = :run_id AND w.app = :app
  AND NOT EXISTS (SELECT 1 FROM outcomes AS o WHERE o.run_id = w.run_id AND o.name = w.name)
ORDER BY w.created_at, w.name;

-- name: wake
UPDATE runs SET
    state = 'queued',
    ready_at = NULL,
    ledger_sequence = ledger_sequence + 1,
    updated_at = :now
WHERE run_id IN (SELECT value FROM json_each(:run_ids)) AND state = 'waiting'
RETURNING run_id, app, generation, ledger_sequence;

-- name: message_put
-- The next sequence comes from the run's counter, read under the write lock.
INSERT INTO messages (run_id, channel, key, sequence, payload, at)
SELECT run_id, :channel, :key, message_sequence + 1, :payload, :now FROM runs
WHERE run_id = :run_id
ON CONFLICT (run_id, channel, key) DO NOTHING
RETURNING sequence;

-- name: message_counted
UPDATE runs SET message_sequence = message_sequence + 1 WHERE run_id = :run_id;

-- name: wake_on_wait
-- A waiting run parked on the wait :kind :name (a channel, an update) is
-- made queued; any other is left alone.
UPDATE runs SET
    state = 'queued',
    ready_at = NULL,
    ledger_sequence = ledger_sequence + 1,
    updated_at = :now
WHERE run_id = :run_id AND state = 'waiting'
  AND EXISTS (
    SELECT 1 FROM waits
    WHERE waits.run_id = :run_id AND waits.kind = :kind AND waits.name = :name
  )
RETURNING run_id, app, generation, ledger_sequence;

-- name: next_message
SELECT * FROM messages
WHERE run_id = :run_id AND channel = :channel AND sequence > :after_sequence
ORDER BY sequence
LIMIT 1;

-- name: end_cleanup
-- A signal the run never applied keeps its record: its sender's retry is
-- answered with the receipt it was given (an applied one is in the journal).
DELETE FROM waits WHERE run_id IN (SELECT value FROM json_each(:run_ids));
DELETE FROM outcomes WHERE run_id IN (SELECT value FROM json_each(:run_ids))
  AND NOT (outcome = 'signaled' AND signal_id IS NOT NULL AND NOT EXISTS (
      SELECT 1 FROM journal AS j
      WHERE j.run_id = outcomes.run_id AND j.kind = 'wait' AND j.name = outcomes.name
        AND j.status <> 'started'
  ));
DELETE FROM messages WHERE run_id IN (SELECT value FROM json_each(:run_ids));

-- name: end_probe
-- Whether an end-of-run rule has anything to do for a run that just ended:
-- records to drop, children that close with it, updates to settle or
-- announce, events or streams someone may follow. Most runs have none, and
-- this read then replaces the rules' six statements. One run by equality:
-- the same test over a json_each list plans each EXISTS as a list subquery
-- and costs forty times as much.
SELECT
    EXISTS (SELECT 1 FROM waits WHERE run_id = :run_id)
    OR EXISTS (SELECT 1 FROM outcomes WHERE run_id = :run_id)
    OR EXISTS (SELECT 1 FROM messages WHERE run_id = :run_id)
    OR EXISTS (SELECT 1 FROM updates WHERE run_id = :run_id)
    OR EXISTS (
        SELECT 1 FROM runs
        WHERE parent_id = :run_id AND parent_close = 'cancel'
          AND state NOT IN ('succeeded', 'failed', 'canceled') AND cancel_requested = 0
    )
    OR EXISTS (
        SELECT 1 FROM journal
        WHERE run_id = :run_id AND kind IN ('event', 'stream', 'stream_close')
    ) AS busy;

-- name: cancel_open_waits
-- A cancel reaching a running (or needs_attention) run settles its open waits,
-- so a later signal is answered with the cancel's receipt instead of one that
-- is never applied. (Runs canceled at once lose their waits to the end-of-run
-- rules.)
INSERT INTO outcomes (run_id, name, outcome, signal_id, payload, payload_digest, at)
SELECT w.run_id, w.name, 'canceled', NULL, NULL, NULL, :now
FROM waits AS w JOIN runs AS r ON r.run_id = w.run_id
WHERE w.run_id IN (SELECT value FROM json_each(:run_ids)) AND w.kind NOT IN ('channel', 'update')
  AND r.state IN ('running', 'needs_attention') AND r.cancel_requested = 0
ON CONFLICT (run_id, name) DO NOTHING;

-- name: cancel_now
UPDATE runs SET
    state = 'canceled',
    worker = NULL,
    lease_expires_at = NULL,
    ready_at = NULL,
    ledger_sequence = ledger_sequence + 1,
    updated_at = :now
WHERE run_id IN (SELECT value FROM json_each(:run_ids)) AND state IN ('queued', 'waiting', 'suspended')
RETURNING run_id, app, parent_id, state, result, error, generation, ledger_sequence, origin;

-- name: cancel_request
-- A running run is settled by its owner; one in needs_attention keeps its
-- state, and the flag turns a later resolve with an output into canceled.
UPDATE runs SET
    cancel_requested = 1,
    ledger_sequence = ledger_sequence + 1,
    updated_at = :now
WHERE run_id IN (SELECT value FROM json_each(:run_ids))
  AND state IN ('running', 'needs_attention') AND cancel_requested = 0
RETURNING run_id, generation, ledger_sequence;

-- name: resolve_entry
UPDATE journal SET
    kind = :kind,
    name = :name,
    status = :status,
    output = :output,
    error = :error,
    attempt = :attempt,
    updated_at = :now
WHERE run_id = :run_id AND position = :position AND status = 'started';

-- name: resolve_run
UPDATE runs SET
    state = :state,
    error = :error,
    failures = 0,
    worker = NULL,
    lease_expires_at = NULL,
    ready_at = NULL,
    ledger_sequence = ledger_sequence + :receipts,
    updated_at = :now
WHERE run_id = :run_id AND generation = :generation AND state = 'needs_attention'
RETURNING run_id, app, parent_id, state, result, error, generation, ledger_sequence, origin;

-- name: sweep_expired_runs
-- Runs with a signal or child wait past its deadline and no outcome. A
-- receive's timeout is its owner's to decide (it compares the journaled
-- deadline with the messages it finds): channel waits get no outcome, their
-- runs are woken by sweep_due_runs. A suspended run's deadlines wait for its resume.
SELECT r.run_id FROM runs AS r
WHERE r.state NOT IN ('succeeded', 'failed', 'canceled', 'suspended')
  AND r.run_id IN (
      SELECT w.run_id FROM waits AS w
      WHERE w.deadline IS NOT NULL AND w.deadline <= :now AND w.kind NOT IN ('channel', 'update')
        AND NOT EXISTS (
            SELECT 1 FROM outcomes AS o WHERE o.run_id = w.run_id AND o.name = w.name
        )
  )
ORDER BY r.run_id;

-- name: sweep_expire_waits
INSERT INTO outcomes (run_id, name, outcome, signal_id, payload, payload_digest, at)
SELECT w.run_id, w.name, 'timed_out', NULL, NULL, NULL, :now
FROM waits AS w
WHERE w.run_id IN (SELECT value FROM json_each(:run_ids))
  AND w.deadline IS NOT NULL AND w.deadline <= :now AND w.kind NOT IN ('channel', 'update')
ON CONFLICT (run_id, name) DO NOTHING
RETURNING run_id;

-- name: sweep_due_runs
-- Named: to spare the sort, the planner would walk every run by its key.
SELECT run_id FROM runs INDEXED BY runs_waiting_ready
WHERE state = 'waiting' AND ready_at <= :now ORDER BY run_id;

-- name: sweep_clamp_leases
-- A lease is never further ahead than its TTL: after the clock stepped back,
-- a dead worker's run lapses one TTL from now, not when the clock catches up.
-- Served by runs_running (lease_expires_at) WHERE state = 'running'.
UPDATE runs SET lease_expires_at = :now + lease_ttl
WHERE state = 'running' AND lease_expires_at > :now + lease_ttl
RETURNING run_id;

-- name: sweep_orphans
-- Records of runs that are gone or have ended. A run that needs attention (or
-- holds a state this code cannot read) keeps them: nothing is guessed.
DELETE FROM waits WHERE NOT EXISTS (
    SELECT 1 FROM runs AS r
    WHERE r.run_id = waits.run_id AND r.state NOT IN ('succeeded', 'failed', 'canceled')
);
DELETE FROM outcomes WHERE NOT EXISTS (
    SELECT 1 FROM runs AS r
    WHERE r.run_id = outcomes.run_id AND r.state NOT IN ('succeeded', 'failed', 'canceled')
) AND NOT (
    -- an ended run's unapplied signal, kept to answer its sender (see end_cleanup)
    outcome = 'signaled' AND signal_id IS NOT NULL
    AND EXISTS (SELECT 1 FROM runs AS r WHERE r.run_id = outcomes.run_id)
    AND NOT EXISTS (
        SELECT 1 FROM journal AS j
        WHERE j.run_id = outcomes.run_id AND j.kind = 'wait' AND j.name = outcomes.name
          AND j.status <> 'started'
    )
);
DELETE FROM messages WHERE NOT EXISTS (
    SELECT 1 FROM runs AS r
    WHERE r.run_id = messages.run_id AND r.state NOT IN ('succeeded', 'failed', 'canceled')
);

-- == the operating surface: run pages and access tokens ================
-- name: page_runs
-- Keyset, newest first; with no page before, after_at is past every run.
-- One query per filter, each walking its own index in order (a filter
-- written `param IS NULL OR ...` would keep the planner off the index).
-- The time window bounds the same walk: the caller folds created_before into
-- the keyset bound, and since is before every run when no window is asked.
-- Served by runs_page (app, created_at, run_id).
SELECT * FROM runs
WHERE app = :app
  AND (created_at, run_id) < (:after_at, :after_id)
  AND created_at > :since
ORDER BY created_at DESC, run_id DESC
LIMIT :limit;

-- name: page_runs_by_state
-- Served by runs_page_state (app, state, created_at, run_id).
SELECT * FROM runs
WHERE app = :app AND state = :state
  AND (:workflow IS NULL OR workflow = :workflow)
  AND (created_at, run_id) < (:after_at, :after_id)
  AND created_at > :since
ORDER BY created_at DESC, run_id DESC
LIMIT :limit;

-- name: page_runs_by_workflow
-- Served by runs_page_workflow (app, workflow, created_at, run_id).
SELECT * FROM runs
WHERE app = :app AND workflow = :workflow
  AND (created_at, run_id) < (:after_at, :after_id)
  AND created_at > :since
ORDER BY created_at DESC, run_id DESC
LIMIT :limit;

-- name: page_runs_by_queue
-- Served by runs_page_queue (app, queue, created_at, run_id).
SELECT * FROM runs
WHERE app = :app AND queue = :queue
  AND (:state IS NULL OR state = :state)
  AND (:workflow IS NULL OR workflow = :workflow)
  AND (created_at, run_id) < (:after_at, :after_id)
  AND created_at > :since
ORDER BY created_at DESC, run_id DESC
LIMIT :limit;

-- name: page_children
-- Keyset, oldest first; with no page before, after_at is before every run.
-- Served by runs_children (parent_id, created_at, run_id).
SELECT * FROM runs
WHERE parent_id = :run_id
  AND (created_at, run_id) > (:after_at, :after_id)
ORDER BY created_at, run_id
LIMIT :limit;

-- name: run_by_key
SELECT * FROM runs WHERE app = :app AND key = :key;

-- name: create_token
INSERT INTO tokens (token_id, app, scope, digest, created_at, expires_at)
VALUES (:token_id, :app, :scope, :digest, :now, :expires_at)
ON CONFLICT (token_id) DO NOTHING
RETURNING *;

-- name: get_token
SELECT * FROM tokens WHERE token_id = :token_id;

-- name: list_tokens
SELECT * FROM tokens WHERE (:app IS NULL OR app = :app) ORDER BY created_at, token_id;

-- name: revoke_token
UPDATE tokens SET revoked_at = coalesce(revoked_at, :now)
WHERE token_id = :token_id
RETURNING *;

-- name: has_tokens
SELECT EXISTS (
    SELECT 1 FROM tokens
    WHERE app = :app AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > :now)
) AS found;

-- name: prune_pick
-- Runs of one ended state that ended before :before, oldest created first,
-- served by runs_page_state (app, state, created_at, run_id). A run ends after
-- it is created, so created_at < :before bounds the range.
SELECT run_id FROM runs
WHERE app = :app AND state = :state AND created_at < :before AND updated_at < :before
ORDER BY created_at, run_id
LIMIT :limit;

-- name: prune_runs
-- Everything recorded for the picked runs, then the runs, checked again to
-- have ended (the pick and this run in one write transaction).
DELETE FROM journal WHERE run_id IN (SELECT value FROM json_each(:run_ids));
DELETE FROM ledger WHERE run_id IN (SELECT value FROM json_each(:run_ids));
DELETE FROM waits WHERE run_id IN (SELECT value FROM json_each(:run_ids));
DELETE FROM outcomes WHERE run_id IN (SELECT value FROM json_each(:run_ids));
DELETE FROM messages WHERE run_id IN (SELECT value FROM json_each(:run_ids));
DELETE FROM updates WHERE run_id IN (SELECT value FROM json_each(:run_ids));
DELETE FROM tasks WHERE run_id IN (SELECT value FROM json_each(:run_ids));
DELETE FROM runs
WHERE run_id IN (SELECT value FROM json_each(:run_ids))
  AND state IN ('succeeded', 'failed', 'canceled')
RETURNING run_id;

-- name: update_put
-- Put-if-absent by (run_id, update_id); the sequence is read under the write lock.
INSERT INTO updates (run_id, update_id, name, sequence, payload, state, response, at, settled_at)
SELECT :run_id, :update_id, :name, coalesce(max(sequence), 0) + 1, :payload, 'pending', NULL, :now, NULL
FROM updates WHERE run_id = :run_id
ON CONFLICT (run_id, update_id) DO NOTHING
RETURNING *;

-- name: update_get
SELECT * FROM updates WHERE run_id = :run_id AND update_id = :update_id;

-- name: list_updates
-- The run's latest updates, newest first; a run's sequence numbers its
-- updates of every name, so (run_id, sequence) is unique.
SELECT * FROM updates
WHERE run_id = :run_id
ORDER BY sequence DESC
LIMIT :limit;

-- name: next_update
SELECT * FROM updates
WHERE run_id = :run_id AND name = :name AND sequence > :after_sequence
ORDER BY sequence
LIMIT 1;

-- name: update_answer
UPDATE updates SET state = 'answered', response = :response, settled_at = :now
WHERE run_id = :run_id AND update_id = :update_id AND state = 'pending'
RETURNING *;

-- name: updates_abandon
-- Updates a run ended without answering; their senders are told so.
UPDATE updates SET state = 'abandoned', settled_at = :now
WHERE run_id IN (SELECT value FROM json_each(:run_ids)) AND state = 'pending'
RETURNING run_id;

-- name: live_ended
-- Of runs that just ended, those someone may be following: with updates, or
-- with events or stream items in their journal.
SELECT r.value AS run_id FROM json_each(:run_ids) AS r
WHERE EXISTS (SELECT 1 FROM updates AS u WHERE u.run_id = r.value)
   OR EXISTS (
      SELECT 1 FROM journal AS j
      WHERE j.run_id = r.value AND j.kind IN ('event', 'stream', 'stream_close')
   );

-- name: journal_after
SELECT * FROM journal WHERE run_id = :run_id AND position > :after_position ORDER BY position;

-- name: census
-- One row per state of the app's runs (one row of NULLs when it has none), each
-- with the store's instant; oldest_due is the earliest due ready_at of a waiting run.
SELECT s.state AS state, s.n AS n, s.oldest_due AS oldest_due, :now AS at
FROM (SELECT 1) AS one
LEFT JOIN (
    SELECT state, count(*) AS n,
           min(CASE WHEN state = 'waiting' AND ready_at <= :now THEN ready_at END) AS oldest_due
    FROM runs WHERE app = :app GROUP BY state
) AS s ON 1;

-- == overview: read-only views for operators (perdure.store.overview) ==========

-- name: apps
SELECT DISTINCT app FROM runs ORDER BY app;

-- name: timers
-- Runs held until an instant by nothing but time: sleeping runs (waiting
-- with no registered wait) and queued runs that may not be claimed yet
-- (a retry's backoff, a release's delay).
SELECT * FROM runs AS r
WHERE r.app = :app
  AND (:run_id IS NULL OR r.run_id = :run_id)
  AND r.ready_at IS NOT NULL
  AND (
      (r.state = 'waiting' AND NOT EXISTS (SELECT 1 FROM waits AS w WHERE w.run_id = r.run_id))
      OR (r.state = 'queued' AND r.ready_at > :now)
  )
ORDER BY r.ready_at, r.run_id;

-- name: children_to_close
-- Live children of runs that just ended whose workflow cancels them when
-- their parent ends (parent_close = 'cancel'), not already told to cancel.
SELECT run_id FROM runs
WHERE parent_id IN (SELECT value FROM json_each(:run_ids))
  AND parent_close = 'cancel'
  AND state NOT IN ('succeeded', 'failed', 'canceled')
  AND cancel_requested = 0
ORDER BY run_id;

-- name: app_migration_applied
SELECT 1 AS applied FROM app_migrations WHERE app = :app AND version = :version;

-- name: app_migration_record
INSERT INTO app_migrations (app, version, applied_at) VALUES (:app, :version, :now);
-- == schedules (perdure.store.scheduleport) ==================================

-- name: save_schedule
-- A new row is settled until now; an existing one keeps its state.
INSERT INTO schedules (
    app, name, workflow, version, cron, tz, catch_up, input, tick_arg,
    paused, settled_until, created_at, updated_at
)
VALUES (
    :app, :name, :workflow, :version, :cron, :tz, :catch_up, :input, :tick_arg,
    0, :now, :now, :now
)
ON CONFLICT (app, name) DO UPDATE SET
    workflow = excluded.workflow, version = excluded.version, cron = excluded.cron,
    tz = excluded.tz, catch_up = excluded.catch_up, input = excluded.input,
    tick_arg = excluded.tick_arg, updated_at = excluded.updated_at
RETURNING *;

-- name: list_schedules
SELECT * FROM schedules WHERE (:app IS NULL OR app = :app) ORDER BY app, name;

-- name: settle_schedule
-- Only forward: two workers settling the same tick leave one answer.
UPDATE schedules SET
    settled_until = max(settled_until, :through),
    last_run_id = CASE
        WHEN :tick IS NOT NULL AND (last_tick IS NULL OR last_tick < :tick) THEN :run_id
        ELSE last_run_id END,
    last_tick = CASE
        WHEN :tick IS NOT NULL AND (last_tick IS NULL OR last_tick < :tick) THEN :tick
        ELSE last_tick END,
    updated_at = :now
WHERE app = :app AND name = :name;

-- name: pause_schedule
-- Resuming settles the ticks that passed while paused.
UPDATE schedules SET
    settled_until = CASE
        WHEN paused = 1 AND :paused = 0 THEN max(settled_until, :now)
        ELSE settled_until END,
    paused = :paused,
    updated_at = :now
WHERE app = :app AND name = :name
RETURNING *;

-- == suspending runs and run deadlines (perdure.store.controlport) ===========

-- name: suspend_now
-- A queued or waiting run is suspended at once; it keeps its ready_at and
-- its waits, and remembers where resume returns it.
UPDATE runs SET
    suspended_from = state,
    state = 'suspended',
    ledger_sequence = ledger_sequence + 1,
    updated_at = :now
WHERE run_id = :run_id AND state IN ('queued', 'waiting')
RETURNING run_id, generation, ledger_sequence;

-- name: suspend_request
-- A running run is suspended by its owner, at its next journal write.
UPDATE runs SET
    suspend_requested = 1,
    ledger_sequence = ledger_sequence + 1,
    updated_at = :now
WHERE run_id = :run_id AND state = 'running' AND suspend_requested = 0
RETURNING run_id, generation, ledger_sequence;

-- name: unsuspend
UPDATE runs SET
    state = coalesce(suspended_from, 'queued'),
    suspended_from = NULL,
    ledger_sequence = ledger_sequence + 1,
    updated_at = :now
WHERE run_id = :run_id AND state = 'suspended'
RETURNING run_id, app, state, ready_at, generation, ledger_sequence;

-- name: suspend_withdraw
-- Resume before the owner took the suspend: the run goes on.
UPDATE runs SET
    suspend_requested = 0,
    ledger_sequence = ledger_sequence + 1,
    updated_at = :now
WHERE run_id = :run_id AND state = 'running' AND suspend_requested = 1
RETURNING run_id, app, state, ready_at, generation, ledger_sequence;

-- name: let_go
-- The owner of a run whose suspend was asked records what it did and lets go:
-- the run becomes suspended (to resume as queued). SET expressions read the
-- old row, so a suspend withdrawn meanwhile leaves the run running and only
-- the entries are recorded. Fenced like every write; a cancel wins.
UPDATE runs SET
    state = CASE WHEN suspend_requested = 1 THEN 'suspended' ELSE state END,
    suspended_from = CASE WHEN suspend_requested = 1 THEN 'queued' ELSE suspended_from END,
    worker = CASE WHEN suspend_requested = 1 THEN NULL ELSE worker END,
    lease_expires_at = CASE WHEN suspend_requested = 1 THEN NULL ELSE lease_expires_at END,
    ready_at = CASE WHEN suspend_requested = 1 THEN NULL ELSE ready_at END,
    failures = CASE WHEN :reset THEN 0 ELSE failures END,
    ledger_sequence = ledger_sequence + :receipts + suspend_requested,
    suspend_requested = 0,
    updated_at = :now
WHERE run_id = :run_id AND generation = :generation AND state = 'running'
  AND cancel_requested = 0
RETURNING app, generation, ledger_sequence, state;

-- name: deadline_due
-- Live runs past their deadline that no cancel has reached yet, a bounded
-- batch; served by runs_deadline.
SELECT run_id FROM runs
WHERE deadline IS NOT NULL AND deadline <= :now
  AND state IN ('queued', 'running', 'waiting', 'suspended')
  AND cancel_requested = 0
  AND (:app IS NULL OR app = :app)
  AND (:run_id IS NULL OR run_id = :run_id)
ORDER BY deadline, run_id
LIMIT :limit;

-- name: deadline_error
-- The error of runs a deadline cancels at once (a running one is ended by its owner).
UPDATE runs SET error = :error
WHERE run_id IN (SELECT value FROM json_each(:run_ids))
  AND state IN ('queued', 'waiting', 'suspended');
-- == chains: continue-as-new (perdure.store.chaining) ==========================

-- name: chain_end
-- The fenced end of a run that continues as new: it gives up its key and
-- names its successor. The parent is not returned: the chain goes on, so the
-- parent's wait on it is not settled.
UPDATE runs SET
    state = 'succeeded',
    result = NULL,
    error = NULL,
    worker = NULL,
    lease_expires_at = NULL,
    ready_at = NULL,
    key = NULL,
    continued_as = :successor_id,
    origin = coalesce(origin, run_id),
    ledger_sequence = ledger_sequence + :receipts,
    updated_at = :now
WHERE run_id = :run_id AND generation = :generation AND state = 'running'
  AND (cancel_requested = 0 OR :canceling)
RETURNING run_id, app, NULL AS parent_id, state, result, error, generation, ledger_sequence, origin;

-- name: chain_create
-- The successor takes the old run's app, parent, parent_close, origin, ledger
-- bound, deadline, place in a queue (queue, key, priority) and dry_run.
INSERT INTO runs (
    run_id, app, workflow, version, state, input, key, parent_id, parent_close, origin,
    ledger_sequence, ledger_limit, created_at, updated_at, deadline, queue, queue_key, priority,
    dry_run
)
SELECT :run_id, app, :workflow, :version, 'queued', :input, :key, parent_id, parent_close,
       origin, 1, ledger_limit, :now, :now, deadline, queue, queue_key, priority, dry_run
FROM runs WHERE run_id = :old_id
ON CONFLICT DO NOTHING
RETURNING *;

-- name: chain_messages_move
-- :batch rows are [channel, last consumed sequence]. Unconsumed messages are
-- numbered from 1 in send order; consumed ones keep their key below 1 (see
-- chainport), and those the old run itself carried are dropped.
WITH consumed AS (
    SELECT json_extract(b.value, '$[0]') AS channel, json_extract(b.value, '$[1]') AS upto
    FROM json_each(:batch) AS b
), moved AS (
    SELECT m.channel, m.key, m.sequence, m.payload, m.at,
           m.sequence <= coalesce(c.upto, 0) AS done
    FROM messages AS m LEFT JOIN consumed AS c ON c.channel = m.channel
    WHERE m.run_id = :old_id AND m.sequence > 0
)
INSERT INTO messages (run_id, channel, key, sequence, payload, at)
SELECT :run_id, channel, key,
       CASE WHEN done THEN -sequence
            ELSE row_number() OVER (PARTITION BY done ORDER BY sequence) END,
       payload, at
FROM moved WHERE true;

-- name: chain_messages_counted
UPDATE runs SET message_sequence = (
    SELECT count(*) FROM messages WHERE run_id = :run_id AND sequence > 0
)
WHERE run_id = :run_id;

-- name: chain_pending_signals
-- Signals sent to waits the run never applied (the rule of end_cleanup).
SELECT o.name FROM outcomes AS o
WHERE o.run_id = :run_id AND o.outcome = 'signaled' AND o.name NOT LIKE 'child:%'
  AND NOT EXISTS (
      SELECT 1 FROM journal AS j
      WHERE j.run_id = o.run_id AND j.kind = 'wait' AND j.name = o.name
        AND j.status <> 'started'
  )
ORDER BY o.name;

-- name: chain_signals_move
-- :batch rows are [old name, new name].
UPDATE outcomes SET run_id = :run_id, name = json_extract(b.value, '$[1]')
FROM json_each(:batch) AS b
WHERE outcomes.run_id = :old_id AND outcomes.name = json_extract(b.value, '$[0]');

-- name: chain_runs
SELECT * FROM runs WHERE origin = :origin;

-- name: chain_current
SELECT * FROM runs WHERE origin = :origin AND continued_as IS NULL;

-- == queues: limits enforced at claim time (perdure.store.queueing) ==========
-- rate_per is held in microseconds and read as rate_seconds.

-- name: save_queue
-- A declaration replaces the stored limits; the row keeps its created_at.
INSERT INTO queues (
    app, name, concurrency, per_key, rate_limit, rate_per, created_at, updated_at
)
VALUES (
    :app, :name, :concurrency, :per_key, :rate_limit,
    CAST(round(:rate_seconds * 1000000) AS INTEGER), :now, :now
)
ON CONFLICT (app, name) DO UPDATE SET
    concurrency = excluded.concurrency,
    per_key = excluded.per_key,
    rate_limit = excluded.rate_limit,
    rate_per = excluded.rate_per,
    updated_at = excluded.updated_at
RETURNING *, rate_per / 1000000.0 AS rate_seconds;

-- name: queue_by_name
SELECT *, rate_per / 1000000.0 AS rate_seconds FROM queues
WHERE app = :app AND name = :name;

-- name: queue_ready
-- Whether the queue has a claimable run at all (any workflow): a claim locks
-- the queue's row only then.
SELECT EXISTS (
    SELECT 1 FROM runs WHERE app = :app AND queue = :queue AND state = 'queued'
      AND ready_at IS NULL
) OR EXISTS (
    SELECT 1 FROM runs WHERE app = :app AND queue = :queue AND state = 'queued'
      AND ready_at <= :now
) OR EXISTS (
    SELECT 1 FROM runs WHERE app = :app AND queue = :queue AND state = 'waiting'
      AND ready_at <= :now
) AS ready;

-- name: queue_lock
-- The write transaction holds the database lock: a read is a locked read.
SELECT *, rate_per / 1000000.0 AS rate_seconds FROM queues
WHERE app = :app AND name = :name;

-- name: queues_of_app
SELECT *, rate_per / 1000000.0 AS rate_seconds FROM queues WHERE app = :app ORDER BY name;

-- name: list_queues
-- Waiting: queued for a slot (held back or not); parked runs hold none.
SELECT q.*, q.rate_per / 1000000.0 AS rate_seconds,
       (SELECT count(*) FROM runs AS r
        WHERE r.app = q.app AND r.queue = q.name AND r.state = 'running') AS running,
       (SELECT count(*) FROM runs AS r
        WHERE r.app = q.app AND r.queue = q.name AND r.state = 'queued') AS waiting
FROM queues AS q
WHERE (:app IS NULL OR q.app = :app)
ORDER BY q.app, q.name;

-- name: queue_running
-- The queue's running runs by key: lapsed leases hold their slot until recovered.
SELECT queue_key, count(*) AS n FROM runs
WHERE app = :app AND queue = :queue AND state = 'running'
GROUP BY queue_key;

-- name: queue_starts
-- The queue's first claims within its rate's window, and the oldest of them.
SELECT count(*) AS n, min(started_at) AS oldest FROM runs
WHERE app = :app AND queue = :queue
  AND started_at > :now - (SELECT rate_per FROM queues WHERE app = :app AND name = :queue);

-- name: queue_candidates
-- The queue's claimable runs, lowest priority number first and then in the
-- order they became claimable; runs of the keys in :busy (at their per-key
-- limit) are stepped over. One ordered index range per way a run becomes
-- claimable, each cut at :limit.
WITH wanted(workflow, version) AS (
    SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]')
    FROM json_each(:workflows)
),
busy(key) AS (SELECT value FROM json_each(:busy)),
due(run_id, priority, due_at, created_at) AS (
    SELECT * FROM (
        SELECT run_id, priority, created_at, created_at FROM runs
        WHERE app = :app AND queue = :queue AND state = 'queued' AND ready_at IS NULL
          AND (workflow, version) IN (SELECT workflow, version FROM wanted)
          AND (queue_key IS NULL OR queue_key NOT IN (SELECT key FROM busy))
        ORDER BY priority, created_at LIMIT :limit
    )
    UNION ALL
    SELECT * FROM (
        SELECT run_id, priority, ready_at, created_at FROM runs
        WHERE app = :app AND queue = :queue AND state = 'queued' AND ready_at <= :now
          AND (workflow, version) IN (SELECT workflow, version FROM wanted)
          AND (queue_key IS NULL OR queue_key NOT IN (SELECT key FROM busy))
        ORDER BY priority, ready_at LIMIT :limit
    )
    UNION ALL
    SELECT * FROM (
        SELECT run_id, priority, ready_at, created_at FROM runs
        WHERE app = :app AND queue = :queue AND state = 'waiting' AND ready_at <= :now
          AND (workflow, version) IN (SELECT workflow, version FROM wanted)
          AND (queue_key IS NULL OR queue_key NOT IN (SELECT key FROM busy))
        ORDER BY priority, ready_at LIMIT :limit
    )
)
SELECT runs.* FROM due JOIN runs ON runs.run_id = due.run_id
ORDER BY due.priority, due.due_at, due.created_at, due.run_id
LIMIT :limit;

-- name: queue_claim
-- The candidates the queue's limits admit; started_at keeps the first claim.
UPDATE runs SET
    generation = generation + 1,
    state = 'running',
    worker = :worker,
    lease_expires_at = :now + CAST(round(:lease_ttl * 1000000) AS INTEGER),
    lease_ttl = CAST(round(:lease_ttl * 1000000) AS INTEGER),
    ready_at = NULL,
    ledger_sequence = ledger_sequence + 1,
    updated_at = :now,
    started_at = coalesce(started_at, :now)
WHERE run_id IN (SELECT value FROM json_each(:run_ids)) AND state IN ('queued', 'waiting')
RETURNING *;

-- name: owner_lock
-- The write transaction holds the database lock: a read is a locked read.
SELECT posture, holder, generation, lease_expires_at <= :now AS expired,
       (lease_expires_at - :now) / 1000000.0 AS expires_in
FROM app_owners WHERE app = :app;

-- name: owner_insert
INSERT INTO app_owners (app, posture, holder, lease_expires_at, generation, updated_at)
VALUES (:app, :posture, :holder, :now + CAST(round(:ttl * 1000000) AS INTEGER), 1, :now)
ON CONFLICT (app) DO NOTHING
RETURNING generation;

-- name: owner_update
UPDATE app_owners SET
    posture = :posture,
    holder = :holder,
    lease_expires_at = :now + CAST(round(:ttl * 1000000) AS INTEGER),
    generation = generation + :takeover,
    updated_at = :now
WHERE app = :app
RETURNING generation;

-- name: owner_lapse
-- The runs an expired holder left in flight lapse now, under a new
-- generation: the holder's writes are fenced off, and the ordinary claim
-- recovers them.
UPDATE runs SET
    generation = generation + 1,
    lease_expires_at = :now,
    updated_at = :now
WHERE app = :app AND state = 'running' AND worker = :holder
RETURNING run_id;

-- name: owner_lapse_tasks
-- Likewise the tasks it held: a claim recovers them under a new generation.
UPDATE tasks SET lease_expires_at = :now, updated_at = :now
WHERE state = 'running' AND worker = :holder
  AND run_id IN (SELECT run_id FROM runs WHERE app = :app AND state = 'running')
RETURNING run_id;

-- name: owner_drop
DELETE FROM app_owners WHERE app = :app AND holder = :holder;

-- == plans: tasks claimed one by one (perdure.store.planning) ================

-- name: plan_admit
-- A plan run has no owner of its own: it runs while its tasks do.
UPDATE runs SET
    state = 'running',
    plan_digest = :digest,
    plan_policy = :policy,
    updated_at = :now
WHERE run_id = :run_id AND state = 'queued' AND generation = 0;

-- name: task_insert
INSERT INTO tasks (
    run_id, name, position, parents, effect, state, max_recoveries, output,
    created_at, updated_at, ended_at
)
VALUES (
    :run_id, :name, :position, :parents, :effect,
    CASE WHEN :output IS NULL THEN 'pending' ELSE 'succeeded' END,
    :max_recoveries, :output, :now, :now,
    CASE WHEN :output IS NULL THEN NULL ELSE :now END
);

-- name: tasks_of_run
SELECT * FROM tasks WHERE run_id = :run_id ORDER BY position;

-- name: task_row
SELECT * FROM tasks WHERE run_id = :run_id AND name = :name;

-- name: task_open
-- Whether the run has a task still pending or running (through tasks_open).
SELECT 1 AS open FROM tasks
WHERE run_id = :run_id AND state IN ('pending', 'running')
LIMIT 1;

-- name: task_candidates
-- Pending tasks whose parents all succeeded (each read again by task_claim
-- under the lock), then lapsed ones, of running plan runs of the served
-- names and versions; the caller compares digests.
WITH wanted(workflow, version) AS (
    SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(:plans)
)
SELECT * FROM (
    SELECT t.run_id, t.name, t.state, r.workflow, r.version, r.plan_digest,
           r.created_at AS run_created_at, t.position
    FROM tasks AS t JOIN runs AS r ON r.run_id = t.run_id
    WHERE t.state = 'pending' AND (t.ready_at IS NULL OR t.ready_at <= :now)
      AND r.app = :app AND r.state = 'running' AND r.cancel_requested = 0
      AND (r.workflow, r.version) IN (SELECT workflow, version FROM wanted)
      AND NOT EXISTS (
          -- Parents that are no JSON array make the task a candidate, so that
          -- the caller's read of the run refuses it rather than this query fail.
          -- Each parent is found by its key: a missing one holds the task back.
          SELECT 1 FROM json_each(CASE WHEN NOT json_valid(t.parents) THEN '[]'
              WHEN json_type(t.parents) <> 'array' THEN '[]' ELSE t.parents END) AS p
          WHERE coalesce((SELECT up.state FROM tasks AS up
                          WHERE up.run_id = t.run_id AND up.name = p.value), '') <> 'succeeded'
      )
    UNION ALL
    SELECT t.run_id, t.name, t.state, r.workflow, r.version, r.plan_digest,
           r.created_at, t.position
    FROM tasks AS t JOIN runs AS r ON r.run_id = t.run_id
    WHERE t.state = 'running' AND t.lease_expires_at <= :now AND :now <= :recover_until
      AND r.app = :app AND r.state = 'running' AND r.cancel_requested = 0
      AND (r.workflow, r.version) IN (SELECT workflow, version FROM wanted)
)
ORDER BY run_created_at, run_id, position
LIMIT :limit;

-- name: task_lapsed_canceling
-- Tasks whose worker is gone, of runs being canceled: no claim will take them.
SELECT t.run_id, t.name FROM tasks AS t JOIN runs AS r ON r.run_id = t.run_id
WHERE t.state = 'running' AND t.lease_expires_at <= :now AND :now <= :recover_until
  AND r.app = :app AND r.state = 'running' AND r.cancel_requested = 1
ORDER BY t.run_id, t.position;

-- name: task_claim
-- Every precondition again, under the write lock.
UPDATE tasks SET
    state = 'running',
    generation = generation + 1,
    attempt = attempt + 1,
    recoveries = recoveries + (state = 'running'),
    worker = :worker,
    lease_expires_at = :now + CAST(round(:lease_ttl * 1000000) AS INTEGER),
    ready_at = NULL,
    effect_started = 0,
    started_at = :now,
    updated_at = :now
WHERE run_id = :run_id AND name = :name
  AND EXISTS (
      SELECT 1 FROM runs AS r
      WHERE r.run_id = tasks.run_id AND r.state = 'running' AND r.cancel_requested = 0
  )
  AND (
      (state = 'pending' AND (ready_at IS NULL OR ready_at <= :now) AND NOT EXISTS (
          SELECT 1 FROM json_each(tasks.parents) AS p
          WHERE coalesce((SELECT up.state FROM tasks AS up
                          WHERE up.run_id = tasks.run_id AND up.name = p.value), '') <> 'succeeded'
      ))
      OR (state = 'running' AND lease_expires_at <= :now)
  )
RETURNING *;

-- name: task_parent_outputs
SELECT up.name, up.output FROM tasks AS t, json_each(t.parents) AS p
JOIN tasks AS up ON up.run_id = t.run_id AND up.name = p.value
WHERE t.run_id = :run_id AND t.name = :name;

-- name: task_renew
UPDATE tasks SET
    lease_expires_at = :now + CAST(round(:lease_ttl * 1000000) AS INTEGER)
WHERE run_id = :run_id AND name = :name AND generation = :generation AND state = 'running'
RETURNING lease_expires_at;

-- name: task_effect
UPDATE tasks SET effect_started = 1, attempt = :attempt, updated_at = :now
WHERE run_id = :run_id AND name = :name AND generation = :generation AND state = 'running'
RETURNING name;

-- name: task_retry
UPDATE tasks SET effect_started = 0, attempt = :attempt, error = :error, updated_at = :now
WHERE run_id = :run_id AND name = :name AND generation = :generation AND state = 'running'
RETURNING name;

-- name: task_end
-- The fenced final write of a claimed task (and of a lapsed one, by the
-- claim that settles it: generation is then the one read under the lock).
UPDATE tasks SET
    state = :state,
    output = :output,
    error = :error,
    worker = CASE WHEN :state = 'pending' THEN NULL ELSE worker END,
    lease_expires_at = NULL,
    ready_at = CASE WHEN :delay IS NULL THEN NULL
        ELSE :now + CAST(round(:delay * 1000000) AS INTEGER) END,
    attempt = CASE WHEN :state = 'pending' THEN attempt - 1 ELSE attempt END,
    ended_at = CASE WHEN :state = 'pending' THEN NULL ELSE :now END,
    updated_at = :now
WHERE run_id = :run_id AND name = :name AND generation = :generation AND state = 'running'
RETURNING name;

-- name: task_block
-- Every pending descendant of :name, at any depth, is blocked by it.
WITH RECURSIVE below(name) AS (
    SELECT t.name FROM tasks AS t, json_each(t.parents) AS p
    WHERE t.run_id = :run_id AND p.value = :name
    UNION
    SELECT t.name FROM tasks AS t, json_each(t.parents) AS p JOIN below AS b ON p.value = b.name
    WHERE t.run_id = :run_id
)
UPDATE tasks SET state = 'blocked', blocked_by = :name, ended_at = :now, updated_at = :now
WHERE run_id = :run_id AND state = 'pending' AND name IN (SELECT name FROM below)
RETURNING name;

-- name: task_unblock
UPDATE tasks SET state = 'pending', blocked_by = NULL, ended_at = NULL, updated_at = :now
WHERE run_id = :run_id AND state = 'blocked' AND blocked_by = :name
RETURNING name;

-- name: task_cancel_pending
UPDATE tasks SET state = 'canceled', ended_at = :now, updated_at = :now
WHERE run_id = :run_id AND state = 'pending'
RETURNING name;

-- name: task_resolve
UPDATE tasks SET state = 'succeeded', output = :output, error = NULL, ended_at = :now,
    updated_at = :now
WHERE run_id = :run_id AND name = :name AND state = 'needs_attention'
RETURNING name;

-- name: plan_touch
-- Receipts of a task transition are numbered on its run.
UPDATE runs SET ledger_sequence = ledger_sequence + :receipts, updated_at = :now
WHERE run_id = :run_id
RETURNING ledger_sequence, generation;

-- name: plan_end
UPDATE runs SET
    state = :state,
    result = :result,
    error = :error,
    ledger_sequence = ledger_sequence + 1,
    updated_at = :now
WHERE run_id = :run_id AND state = 'running' AND plan_digest IS NOT NULL
RETURNING run_id, app, parent_id, state, result, error, generation, ledger_sequence, origin;

-- name: plan_reopen
UPDATE runs SET state = 'running', error = NULL, ledger_sequence = ledger_sequence + 1,
    updated_at = :now
WHERE run_id = :run_id AND state = 'needs_attention' AND plan_digest IS NOT NULL
RETURNING ledger_sequence, generation;

-- name: plan_mismatch
UPDATE runs SET state = 'needs_attention', error = :error,
    ledger_sequence = ledger_sequence + 1, updated_at = :now
WHERE run_id = :run_id AND state = 'running' AND plan_digest IS NOT NULL
RETURNING ledger_sequence, generation;
