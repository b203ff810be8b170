-- 0013: queues. A run may belong to a queue of its app (with a key and a
-- priority inside it); a queue's limits (concurrency, per key, starts per
-- window) live in one row per queue, so that every worker enforces the same
-- and a claim locks it. Runs in no queue keep their claim index, which no
-- longer holds queued runs; started_at is written by the claims of queued
-- runs only (it measures rates).

ALTER TABLE perdure.runs ADD COLUMN queue text;
ALTER TABLE perdure.runs ADD COLUMN queue_key text;
ALTER TABLE perdure.runs ADD COLUMN priority integer NOT NULL DEFAULT 0;
ALTER TABLE perdure.runs ADD COLUMN started_at timestamptz;

DROP INDEX perdure.runs_claim;
CREATE INDEX runs_claim ON perdure.runs (app, state, ready_at, created_at) WHERE queue IS NULL;
CREATE INDEX runs_queue ON perdure.runs (app, queue, state, ready_at, priority, created_at)
    WHERE queue IS NOT NULL;
CREATE INDEX runs_queue_starts ON perdure.runs (app, queue, started_at)
    WHERE started_at IS NOT NULL;

-- The console's runs of one queue, newest first.
CREATE INDEX runs_page_queue ON perdure.runs (app, queue, created_at, run_id)
    WHERE queue IS NOT NULL;

CREATE TABLE perdure.queues (
    app text NOT NULL,
    name text NOT NULL,
    concurrency integer,
    per_key integer,
    rate_limit integer,
    rate_per interval,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    PRIMARY KEY (app, name)
);
