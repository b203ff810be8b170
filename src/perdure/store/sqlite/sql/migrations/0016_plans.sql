-- 0016: plans. A plan run records its shape's digest and the scheduling
-- policy's version; its tasks are rows of their own, each claimed on its own
-- and fenced by its own generation. parents is a JSON array of task names.

ALTER TABLE runs ADD COLUMN plan_digest TEXT;
ALTER TABLE runs ADD COLUMN plan_policy INTEGER;

CREATE TABLE tasks (
    run_id TEXT NOT NULL,
    name TEXT NOT NULL,
    position INTEGER NOT NULL,
    parents TEXT NOT NULL,
    effect TEXT NOT NULL,
    state TEXT NOT NULL,
    generation INTEGER NOT NULL DEFAULT 0,
    attempt INTEGER NOT NULL DEFAULT 0,
    recoveries INTEGER NOT NULL DEFAULT 0,
    max_recoveries INTEGER NOT NULL,
    worker TEXT,
    lease_expires_at INTEGER,
    ready_at INTEGER,
    effect_started INTEGER NOT NULL DEFAULT 0,
    output TEXT,
    error TEXT,
    blocked_by TEXT,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    started_at INTEGER,
    ended_at INTEGER,
    PRIMARY KEY (run_id, name)
) WITHOUT ROWID;

-- Claims read only the tasks that can still run.
CREATE INDEX tasks_open ON tasks (state, run_id, position) WHERE state IN ('pending', 'running');
