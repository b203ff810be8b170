-- The embedded store's schema: what the migrations in migrations/ produce.
--
-- Instants are INTEGER microseconds since the Unix epoch (UTC), so that
-- indexes order them correctly; durations (lease_ttl) are microseconds too. Payloads, results, errors and inputs are
-- JSON text the store never parses.

CREATE TABLE perdure_schema (
    version INTEGER PRIMARY KEY,
    applied_at INTEGER NOT NULL
);

-- ledger_limit: how many provenance receipts the run keeps, fixed when it is created.
-- parent_close: 'cancel' if the run is canceled when its parent ends; NULL: it runs on.
-- continued_as: the successor of a run that continued as new; origin: the first
-- run of its chain (NULL for a run outside any chain).
-- dry_run: 1 if only dry-run workers claim it (once and idempotent steps are described).
-- plan_digest, plan_policy: a plan run's shape digest and scheduling policy (NULL: a workflow run).
CREATE TABLE runs (
    run_id TEXT PRIMARY KEY,
    app TEXT NOT NULL,
    workflow TEXT NOT NULL,
    version TEXT NOT NULL,
    state TEXT NOT NULL,
    input TEXT NOT NULL,
    result TEXT,
    error TEXT,
    key TEXT,
    parent_id TEXT,
    generation INTEGER NOT NULL DEFAULT 0,
    failures INTEGER NOT NULL DEFAULT 0,
    worker TEXT,
    lease_expires_at INTEGER,
    ready_at INTEGER,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    ledger_sequence INTEGER NOT NULL DEFAULT 0,
    message_sequence INTEGER NOT NULL DEFAULT 0,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    lease_ttl INTEGER,
    ledger_limit INTEGER NOT NULL DEFAULT 256,
    parent_close TEXT,
    deadline INTEGER,
    suspend_requested INTEGER NOT NULL DEFAULT 0,
    suspended_from TEXT,
    continued_as TEXT,
    origin TEXT,
    queue TEXT,
    queue_key TEXT,
    priority INTEGER NOT NULL DEFAULT 0,
    started_at INTEGER,
    dry_run INTEGER NOT NULL DEFAULT 0,
    plan_digest TEXT,
    plan_policy INTEGER
);

-- Idempotent creation: one run per (app, key).
CREATE UNIQUE INDEX runs_app_key ON runs (app, key) WHERE key IS NOT NULL;

-- Claims: each claimable (state, ready_at) range is one ordered index scan.
-- Runs in a queue are claimed through runs_queue, under their queue's limits.
CREATE INDEX runs_claim ON runs (app, state, ready_at, created_at) WHERE queue IS NULL;
CREATE INDEX runs_queue ON runs (app, queue, state, ready_at, priority, created_at)
    WHERE queue IS NOT NULL;

-- Rate limits: a queue's starts within its window.
CREATE INDEX runs_queue_starts ON runs (app, queue, started_at) WHERE started_at IS NOT NULL;

-- The console's runs of one queue, newest first.
CREATE INDEX runs_page_queue ON runs (app, queue, created_at, run_id)
    WHERE queue IS NOT NULL;

-- Sweeps: waiting runs whose ready_at passed, across apps.
CREATE INDEX runs_waiting_ready ON runs (ready_at) WHERE state = 'waiting';

-- Sweeps: leases further ahead than their TTL (the clock stepped back).
CREATE INDEX runs_running ON runs (lease_expires_at) WHERE state = 'running';

-- Child counts and recursive cancel.
CREATE INDEX runs_parent ON runs (parent_id, state) WHERE parent_id IS NOT NULL;

-- The current run of a chain, found from any of its run ids.
CREATE INDEX runs_origin ON runs (origin, created_at) WHERE origin IS NOT NULL;


CREATE TABLE journal (
    run_id TEXT NOT NULL,
    position INTEGER NOT NULL,
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    status TEXT NOT NULL,
    output TEXT,
    error TEXT,
    attempt INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (run_id, position)
) WITHOUT ROWID;

CREATE TABLE ledger (
    run_id TEXT NOT NULL,
    sequence INTEGER NOT NULL,
    kind TEXT NOT NULL,
    at INTEGER NOT NULL,
    generation INTEGER NOT NULL,
    worker TEXT,
    step TEXT,
    digest TEXT,
    note TEXT,
    PRIMARY KEY (run_id, sequence)
) WITHOUT ROWID;

CREATE TABLE waits (
    run_id TEXT NOT NULL,
    name TEXT NOT NULL,
    app TEXT NOT NULL,
    kind TEXT NOT NULL,
    deadline INTEGER,
    after_sequence INTEGER NOT NULL DEFAULT 0,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (run_id, name)
) WITHOUT ROWID;

-- Open waits of an app, oldest first.
CREATE INDEX waits_app ON waits (app, created_at);

-- Deadline sweeps.
CREATE INDEX waits_deadline ON waits (deadline) WHERE deadline IS NOT NULL;

CREATE TABLE outcomes (
    run_id TEXT NOT NULL,
    name TEXT NOT NULL,
    outcome TEXT NOT NULL,
    signal_id TEXT,
    payload TEXT,
    payload_digest TEXT,
    at INTEGER NOT NULL,
    PRIMARY KEY (run_id, name)
);

CREATE TABLE messages (
    run_id TEXT NOT NULL,
    channel TEXT NOT NULL,
    key TEXT NOT NULL,
    sequence INTEGER NOT NULL,
    payload TEXT NOT NULL,
    at INTEGER NOT NULL,
    PRIMARY KEY (run_id, channel, key)
);

-- Delivery order within a channel.
CREATE UNIQUE INDEX messages_order ON messages (run_id, channel, sequence);

-- Access tokens of the console and the HTTP API: only a digest of the secret.
CREATE TABLE tokens (
    token_id TEXT PRIMARY KEY,
    app TEXT NOT NULL,
    scope TEXT NOT NULL,
    digest TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER,
    revoked_at INTEGER
);

CREATE INDEX tokens_app ON tokens (app, created_at);

-- Pages of an app's runs by keyset: (created_at, run_id) < the last one shown.
CREATE INDEX runs_page ON runs (app, created_at, run_id);
CREATE INDEX runs_page_state ON runs (app, state, created_at, run_id);
CREATE INDEX runs_page_workflow ON runs (app, workflow, created_at, run_id);

-- A run's children by keyset, oldest first (the console's tree of a run).
CREATE INDEX runs_children ON runs (parent_id, created_at, run_id) WHERE parent_id IS NOT NULL;
CREATE TABLE updates (
    run_id TEXT NOT NULL,
    update_id TEXT NOT NULL,
    name TEXT NOT NULL,
    sequence INTEGER NOT NULL,
    payload TEXT NOT NULL,
    state TEXT NOT NULL,
    response TEXT,
    at INTEGER NOT NULL,
    settled_at INTEGER,
    PRIMARY KEY (run_id, update_id)
);

-- Delivery order of one name, the order a run consumes them in.
CREATE UNIQUE INDEX updates_order ON updates (run_id, name, sequence);

-- The migrations of each app's own schema (@app.migration) applied so far.
CREATE TABLE app_migrations (
    app TEXT NOT NULL,
    version INTEGER NOT NULL,
    applied_at INTEGER NOT NULL,
    PRIMARY KEY (app, version)
);

-- Schedules: one row per schedule of an app (0008).
CREATE TABLE schedules (
    app TEXT NOT NULL,
    name TEXT NOT NULL,
    workflow TEXT NOT NULL,
    version TEXT NOT NULL,
    cron TEXT NOT NULL,
    tz TEXT NOT NULL,
    catch_up TEXT NOT NULL,
    input TEXT NOT NULL,
    tick_arg INTEGER NOT NULL,
    paused INTEGER NOT NULL,
    settled_until INTEGER NOT NULL,
    last_tick INTEGER,
    last_run_id TEXT,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (app, name)
);

-- Suspending runs and run deadlines (0011).
-- deadline: the instant by which the run must have ended; suspend_requested:
-- a suspend asked of a running run; suspended_from: where resume returns it.
-- Deadline sweeps: only runs that can still pass theirs.
CREATE INDEX runs_deadline ON runs (deadline)
    WHERE deadline IS NOT NULL AND state IN ('queued', 'running', 'waiting', 'suspended');

-- One row per queue of an app: its limits (NULL: none). rate_per is microseconds.
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

-- The ownership posture serving each app, its holder and until when it holds.
CREATE TABLE app_owners (
    app TEXT PRIMARY KEY,
    posture TEXT NOT NULL,
    holder TEXT NOT NULL,
    lease_expires_at INTEGER NOT NULL,
    generation INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);

-- The tasks of plan runs (0016), each claimed on its own.
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
