-- 0013: queues. A run may belong to a queue of its app (with a key and a
-- priority inside it); a queue's limits (concurrency, per key, starts per
-- window) live in one row per queue, so that every worker enforces the same.
-- Runs in no queue keep their claim index, which no longer holds queued runs;
-- started_at is written by the claims of queued runs only (it measures rates).

ALTER TABLE runs ADD COLUMN queue TEXT;
ALTER TABLE runs ADD COLUMN queue_key TEXT;
ALTER TABLE runs ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN started_at INTEGER;

DROP INDEX runs_claim;
CREATE INDEX runs_claim ON runs (app, state, ready_at, created_at) WHERE queue IS NULL;
CREATE INDEX runs_queue ON runs (app, queue, state, ready_at, priority, created_at)
    WHERE queue IS NOT NULL;
CREATE INDEX runs_queue_starts ON runs (app, queue, started_at) WHERE started_at IS NOT NULL;

-- The console's runs of one queue, newest first.
CREATE INDEX runs_page_queue ON runs (app, queue, created_at, run_id)
    WHERE queue IS NOT NULL;

-- rate_per: the rate's window in microseconds.
CREATE TABLE queues (
    app TEXT NOT NULL,
    name TEXT NOT NULL,
    concurrency INTEGER,
    per_key INTEGER,
    rate_limit INTEGER,
    rate_per INTEGER,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (app, name)
);
