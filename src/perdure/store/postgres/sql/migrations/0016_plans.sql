-- 0016: plans. A plan run records its shape's digest and the scheduling
-- policy's version; its tasks are rows of their own, each claimed on its own
-- and fenced by its own generation. parents is a JSON array of task names.

ALTER TABLE perdure.runs ADD COLUMN plan_digest text;
ALTER TABLE perdure.runs ADD COLUMN plan_policy integer;

CREATE TABLE perdure.tasks (
    run_id text NOT NULL,
    name text NOT NULL,
    position integer NOT NULL,
    parents jsonb NOT NULL,
    effect text NOT NULL,
    state text NOT NULL,
    generation bigint NOT NULL DEFAULT 0,
    attempt integer NOT NULL DEFAULT 0,
    recoveries integer NOT NULL DEFAULT 0,
    max_recoveries integer NOT NULL,
    worker text,
    lease_expires_at timestamptz,
    ready_at timestamptz,
    effect_started boolean NOT NULL DEFAULT false,
    output text,
    error text,
    blocked_by text,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    started_at timestamptz,
    ended_at timestamptz,
    PRIMARY KEY (run_id, name)
);

-- Claims read only the tasks that can still run.
CREATE INDEX tasks_open ON perdure.tasks (state, run_id, position)
    WHERE state IN ('pending', 'running');
