-- Named queries of the embedded store, used by perdure/store/sqlite/store.py.
--
-- Instants are integer microseconds since the epoch. Every write runs inside
-- the caller's BEGIN IMMEDIATE transaction, so reads made within one see a
-- state no other writer can change before COMMIT.

-- name: create_schema_table
CREATE TABLE IF NOT EXISTS perdure_schema (
    version INTEGER PRIMARY KEY,
    applied_at INTEGER NOT NULL
);

-- name: schema_version
SELECT coalesce(max(version), 0) FROM perdure_schema;

-- name: record_migration
INSERT INTO perdure_schema (version, applied_at) VALUES (:version, :now);

-- name: create_run
-- Conflicts on run_id or on (app, key) store nothing; the caller reads back.
INSERT INTO runs (
    run_id, app, workflow, version, state, input, key, parent_id,
    ledger_sequence, created_at, updated_at
)
VALUES (
    :run_id, :app, :workflow, :version, 'queued', :input, :key, :parent_id,
    1, :now, :now
)
ON CONFLICT DO NOTHING;

-- name: run_by_id
SELECT * FROM runs WHERE run_id = :run_id;

-- name: run_by_key
SELECT * FROM runs WHERE app = :app AND key = :key;

-- name: list_runs
SELECT * FROM runs
WHERE app = :app
  AND (:state IS NULL OR state = :state)
  AND (:workflow IS NULL OR workflow = :workflow)
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
SELECT runs.* FROM tree JOIN runs ON runs.run_id = tree.run_id;

-- name: journal
SELECT * FROM journal WHERE run_id = :run_id ORDER BY position;

-- name: journal_entry
SELECT * FROM journal WHERE run_id = :run_id AND position = :position;

-- name: journal_put
-- An existing position is replaced only while it is 'started'; otherwise the
-- statement changes no row and the caller refuses.
INSERT INTO journal (
    run_id, position, kind, name, status, output, error, attempt, created_at, updated_at
)
VALUES (
    :run_id, :position, :kind, :name, :status, :output, :error, :attempt, :now, :now
)
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
INSERT INTO ledger (run_id, sequence, kind, at, generation, worker, step, digest, note)
VALUES (:run_id, :sequence, :kind, :at, :generation, :worker, :step, :digest, :note);

-- name: ledger_trim
DELETE FROM ledger WHERE run_id = :run_id AND sequence <= :upto;

-- name: history
-- Every stored receipt: trimming happens on append, and validation on read
-- must see a ledger that holds more (or less) than it should.
SELECT * FROM ledger WHERE run_id = :run_id ORDER BY sequence;

-- name: claim_candidates
-- One ordered index range per way a run becomes claimable, each cut at
-- :limit, so a large backlog costs no sort. Ordered by the instant since
-- which each run has been claimable.
WITH wanted(workflow, version) AS (
    SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]')
    FROM json_each(:workflows)
),
due(run_id, state, due_at, created_at) AS (
    SELECT * FROM (
        SELECT run_id, state, created_at, created_at FROM runs
        WHERE app = :app AND state = 'queued' AND ready_at IS NULL
          AND (workflow, version) IN (SELECT workflow, version FROM wanted)
        ORDER BY created_at LIMIT :limit
    )
    UNION ALL
    SELECT * FROM (
        SELECT run_id, state, ready_at, created_at FROM runs
        WHERE app = :app AND state = 'queued' AND ready_at <= :now
          AND (workflow, version) IN (SELECT workflow, version FROM wanted)
        ORDER BY ready_at LIMIT :limit
    )
    UNION ALL
    SELECT * FROM (
        SELECT run_id, state, ready_at, created_at FROM runs
        WHERE app = :app AND state = 'waiting' AND ready_at <= :now
          AND (workflow, version) IN (SELECT workflow, version FROM wanted)
        ORDER BY ready_at LIMIT :limit
    )
    UNION ALL
    SELECT * FROM (
        SELECT run_id, state, lease_expires_at, created_at FROM runs
        WHERE app = :app AND state = 'running' AND lease_expires_at <= :now
          AND (workflow, version) IN (SELECT workflow, version FROM wanted)
        ORDER BY lease_expires_at LIMIT :limit
    )
)
-- Whole rows, so that the claim refuses a corrupt one instead of rewriting it.
SELECT runs.* FROM due JOIN runs ON runs.run_id = due.run_id
ORDER BY due.due_at, due.created_at, due.run_id
LIMIT :limit;

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
RETURNING ledger_sequence;

-- name: claim_run
-- SET expressions read the old row, so a lapsed 'running' lease counts as a
-- failure here.
UPDATE runs SET
    generation = generation + 1,
    failures = failures + (state = 'running'),
    state = 'running',
    worker = :worker,
    lease_expires_at = :lease_expires_at,
    ready_at = NULL,
    ledger_sequence = ledger_sequence + 1,
    updated_at = :now
WHERE run_id = :run_id
RETURNING *;

-- name: fence_state
SELECT generation, state, cancel_requested FROM runs WHERE run_id = :run_id;

-- name: renew
UPDATE runs SET lease_expires_at = :lease_expires_at
WHERE run_id = :run_id AND generation = :generation AND state = 'running'
  AND (cancel_requested = 0 OR :canceling)
RETURNING ledger_sequence;

-- name: fence_touch
UPDATE runs SET
    ledger_sequence = ledger_sequence + :receipts,
    updated_at = :now
WHERE run_id = :run_id AND generation = :generation AND state = 'running'
  AND (cancel_requested = 0 OR :canceling)
RETURNING ledger_sequence, app;

-- name: fence_step
UPDATE runs SET
    failures = 0,
    ledger_sequence = ledger_sequence + :receipts,
    updated_at = :now
WHERE run_id = :run_id AND generation = :generation AND state = 'running'
  AND (cancel_requested = 0 OR :canceling)
RETURNING ledger_sequence;

-- name: release
UPDATE runs SET
    state = 'queued',
    worker = NULL,
    lease_expires_at = NULL,
    ready_at = :ready_at,
    failures = failures + :failed,
    ledger_sequence = ledger_sequence + :receipts,
    updated_at = :now
WHERE run_id = :run_id AND generation = :generation AND state = 'running'
  AND (cancel_requested = 0 OR :canceling)
RETURNING ledger_sequence;

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
RETURNING ledger_sequence, parent_id;

-- name: wait_register
-- A wait registered again keeps its created_at, so listings stay in order.
INSERT INTO waits (run_id, name, app, kind, deadline, after_sequence, created_at)
VALUES (:run_id, :name, :app, :kind, :deadline, :after_sequence, :now)
ON CONFLICT (run_id, name) DO UPDATE SET
    kind = excluded.kind,
    deadline = excluded.deadline,
    after_sequence = excluded.after_sequence;

-- name: waits_drop_others
DELETE FROM waits
WHERE run_id = :run_id AND name NOT IN (SELECT value FROM json_each(:names));

-- name: park_satisfied
-- Any registered wait with an outcome, or a channel wait with a newer message.
SELECT EXISTS (
    SELECT 1 FROM waits AS w
    WHERE w.run_id = :run_id
      AND (
        EXISTS (SELECT 1 FROM outcomes AS o WHERE o.run_id = w.run_id AND o.name = w.name)
        OR (w.kind = 'channel' AND EXISTS (
            SELECT 1 FROM messages AS m
            WHERE m.run_id = w.run_id AND m.channel = w.name AND m.sequence > w.after_sequence
        ))
      )
);

-- name: wait_get
SELECT * FROM waits WHERE run_id = :run_id AND name = :name;

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

-- name: outcome_put
INSERT INTO outcomes (run_id, name, outcome, signal_id, payload, payload_digest, at)
VALUES (:run_id, :name, :outcome, :signal_id, :payload, :payload_digest, :now)
ON CONFLICT (run_id, name) DO NOTHING;

-- name: outcome_get
SELECT * FROM outcomes WHERE run_id = :run_id AND name = :name;

-- name: outcomes
SELECT * FROM outcomes WHERE run_id = :run_id ORDER BY at, name;

-- name: child_outcome_put
-- Only a parent that has not ended can still use its child's outcome.
INSERT INTO outcomes (run_id, name, outcome, signal_id, payload, payload_digest, at)
SELECT run_id, :name, 'signaled', NULL, :payload, NULL, :now FROM runs
WHERE run_id = :parent_id AND state IN ('queued', 'running', 'waiting')
ON CONFLICT (run_id, name) DO NOTHING;

-- name: wake
UPDATE runs SET
    state = 'queued',
    ready_at = NULL,
    ledger_sequence = ledger_sequence + 1,
    updated_at = :now
WHERE run_id = :run_id AND state = 'waiting'
RETURNING generation, ledger_sequence;

-- name: wake_on_wait
-- A child's end wakes its parent only when the parent is parked on that child,
-- so a fan-out does not wake the parent once per child.
UPDATE runs SET
    state = 'queued',
    ready_at = NULL,
    ledger_sequence = ledger_sequence + 1,
    updated_at = :now
WHERE run_id = :run_id AND state = 'waiting'
  AND EXISTS (SELECT 1 FROM waits WHERE waits.run_id = :run_id AND waits.name = :name)
RETURNING generation, ledger_sequence;

-- name: wake_on_channel
UPDATE runs SET
    state = 'queued',
    ready_at = NULL,
    ledger_sequence = ledger_sequence + 1,
    updated_at = :now
WHERE run_id = :run_id AND state = 'waiting'
  AND EXISTS (
    SELECT 1 FROM waits
    WHERE waits.run_id = :run_id AND waits.kind = 'channel' AND waits.name = :channel
  )
RETURNING generation, ledger_sequence;

-- name: message_put
-- The next sequence comes from the run's counter, read under the write lock.
INSERT INTO messages (run_id, channel, key, sequence, payload, at)
SELECT run_id, :channel, :key, message_sequence + 1, :payload, :now FROM runs
WHERE run_id = :run_id
ON CONFLICT (run_id, channel, key) DO NOTHING;

-- name: message_counted
UPDATE runs SET message_sequence = message_sequence + 1 WHERE run_id = :run_id;

-- name: next_message
SELECT * FROM messages
WHERE run_id = :run_id AND channel = :channel AND sequence > :after_sequence
ORDER BY sequence
LIMIT 1;

-- name: end_waits
DELETE FROM waits WHERE run_id = :run_id;

-- name: end_outcomes
DELETE FROM outcomes WHERE run_id = :run_id;

-- name: end_messages
DELETE FROM messages WHERE run_id = :run_id;

-- name: cancel_now
UPDATE runs SET
    state = 'canceled',
    worker = NULL,
    lease_expires_at = NULL,
    ready_at = NULL,
    ledger_sequence = ledger_sequence + 1,
    updated_at = :now
WHERE run_id = :run_id AND state IN ('queued', 'waiting')
RETURNING generation, ledger_sequence;

-- name: cancel_request
UPDATE runs SET
    cancel_requested = 1,
    ledger_sequence = ledger_sequence + 1,
    updated_at = :now
WHERE run_id = :run_id AND state = 'running' AND cancel_requested = 0
RETURNING generation, ledger_sequence;

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
    ledger_sequence = ledger_sequence + 1,
    updated_at = :now
WHERE run_id = :run_id AND generation = :generation AND state = 'needs_attention'
RETURNING ledger_sequence, parent_id;

-- name: sweep_expire_waits
-- A receive's timeout is its owner's to decide (it compares the journaled
-- deadline with the messages it finds): channel waits get no outcome, their
-- runs are woken by sweep_wake_due.
INSERT INTO outcomes (run_id, name, outcome, signal_id, payload, payload_digest, at)
SELECT w.run_id, w.name, 'timed_out', NULL, NULL, NULL, :now
FROM waits AS w JOIN runs AS r ON r.run_id = w.run_id
WHERE w.deadline IS NOT NULL AND w.deadline <= :now AND w.kind <> 'channel'
  AND r.state NOT IN ('succeeded', 'failed', 'canceled')
ON CONFLICT (run_id, name) DO NOTHING;

-- name: cancel_open_waits
-- A cancel reaching a running run settles its open waits, so a later signal
-- is answered with the cancel's receipt instead of one that is never applied.
INSERT INTO outcomes (run_id, name, outcome, signal_id, payload, payload_digest, at)
SELECT run_id, name, 'canceled', NULL, NULL, NULL, :now
FROM waits WHERE run_id = :run_id AND kind <> 'channel'
ON CONFLICT (run_id, name) DO NOTHING;

-- name: sweep_wake_due
UPDATE runs SET
    state = 'queued',
    ready_at = NULL,
    ledger_sequence = ledger_sequence + 1,
    updated_at = :now
WHERE state = 'waiting' AND ready_at <= :now
RETURNING run_id, generation, ledger_sequence;

-- name: sweep_orphan_waits
-- Records of runs that are gone or have ended. A run that needs attention (or
-- holds a state this code cannot read) keeps them: nothing is guessed.
DELETE FROM waits WHERE NOT EXISTS (
    SELECT 1 FROM runs AS r
    WHERE r.run_id = waits.run_id AND r.state NOT IN ('succeeded', 'failed', 'canceled')
);

-- name: sweep_orphan_outcomes
DELETE FROM outcomes WHERE NOT EXISTS (
    SELECT 1 FROM runs AS r
    WHERE r.run_id = outcomes.run_id AND r.state NOT IN ('succeeded', 'failed', 'canceled')
);

-- name: sweep_orphan_messages
DELETE FROM messages WHERE NOT EXISTS (
    SELECT 1 FROM runs AS r
    WHERE r.run_id = messages.run_id AND r.state NOT IN ('succeeded', 'failed', 'canceled')
);
