-- The shared store's schema: what migrate() builds (the bootstrap in
-- queries.sql, then migrations/ in order). tests/migration compares the two.
--
-- Everything lives in the perdure schema so that it never meets the user's
-- tables. Instants are timestamptz. Payloads, results, errors and inputs are
-- JSON text the store never parses.

CREATE SCHEMA perdure;

CREATE TABLE perdure.schema_version (
    version integer PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE TABLE perdure.runs (
    run_id text PRIMARY KEY,
    app text NOT NULL,
    workflow text NOT NULL,
    version text NOT NULL,
    state text NOT NULL,
    input text NOT NULL,
    result text,
    error text,
    key text,
    parent_id text,
    generation bigint NOT NULL DEFAULT 0,
    failures integer NOT NULL DEFAULT 0,
    worker text,
    lease_expires_at timestamptz,
    ready_at timestamptz,
    cancel_requested boolean NOT NULL DEFAULT false,
    ledger_sequence bigint NOT NULL DEFAULT 0,
    message_sequence bigint NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    -- The TTL of the run's latest lease: sweeps pull back a lease further ahead.
    lease_ttl interval,
    -- How many provenance receipts the run keeps, fixed when it is created.
    ledger_limit integer NOT NULL DEFAULT 256,
    -- 'cancel' if the run is canceled when its parent ends; NULL: it runs on.
    parent_close text,
    -- The instant by which the run must have ended, else it is canceled; NULL: none.
    deadline timestamptz,
    -- A suspend asked of a running run, applied by its owner at its next journal write.
    suspend_requested boolean NOT NULL DEFAULT false,
    -- The state a suspended run returns to on resume ('queued' or 'waiting').
    suspended_from text,
    -- The successor of a run that continued as new.
    continued_as text,
    -- The first run of the run's chain (NULL for a run outside any chain).
    origin text,
    -- The run's queue (NULL: none), its key and priority inside it, and when
    -- a claim of the queue first started it (rate limits count these).
    queue text,
    queue_key text,
    priority integer NOT NULL DEFAULT 0,
    started_at timestamptz,
    -- true if only dry-run workers claim it (once and idempotent steps are described).
    dry_run boolean NOT NULL DEFAULT false,
    -- A plan run's shape digest and scheduling policy (NULL: a workflow run).
    plan_digest text,
    plan_policy integer,
    -- Idempotent creation: one run per (app, key); runs without a key never collide.
    CONSTRAINT runs_app_key UNIQUE (app, key)
);

-- Claims of queued and waiting runs: one ordered range per (state, ready_at) case.
-- Runs in a queue are claimed through runs_queue, under their queue's limits.
CREATE INDEX runs_claim ON perdure.runs (app, state, ready_at, created_at) WHERE queue IS NULL;
CREATE INDEX runs_queue ON perdure.runs (app, queue, state, ready_at, priority, created_at)
    WHERE queue IS NOT NULL;

-- Rate limits: a queue's starts within its window.
CREATE INDEX runs_queue_starts ON perdure.runs (app, queue, started_at)
    WHERE started_at IS NOT NULL;

-- The console's runs of one queue, newest first.
CREATE INDEX runs_page_queue ON perdure.runs (app, queue, created_at, run_id)
    WHERE queue IS NOT NULL;

-- Claims that recover a run whose worker is gone.
CREATE INDEX runs_lease ON perdure.runs (app, lease_expires_at) WHERE state = 'running';

-- Sweeps: waiting runs whose ready_at passed, across apps.
CREATE INDEX runs_waiting_due ON perdure.runs (ready_at) WHERE state = 'waiting';

-- Child counts and the recursive cancel walk.
CREATE INDEX runs_parent ON perdure.runs (parent_id, state) WHERE parent_id IS NOT NULL;

-- The current run of a chain, found from any of its run ids.
CREATE INDEX runs_origin ON perdure.runs (origin, created_at) WHERE origin IS NOT NULL;


CREATE TABLE perdure.journal (
    run_id text NOT NULL,
    position integer NOT NULL,
    kind text NOT NULL,
    name text NOT NULL,
    status text NOT NULL,
    output text,
    error text,
    attempt integer NOT NULL DEFAULT 1,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    PRIMARY KEY (run_id, position)
);

CREATE TABLE perdure.ledger (
    run_id text NOT NULL,
    sequence bigint NOT NULL,
    kind text NOT NULL,
    at timestamptz NOT NULL,
    generation bigint NOT NULL,
    worker text,
    step text,
    digest text,
    note text,
    PRIMARY KEY (run_id, sequence)
);

CREATE TABLE perdure.waits (
    run_id text NOT NULL,
    name text NOT NULL,
    app text NOT NULL,
    kind text NOT NULL,
    deadline timestamptz,
    after_sequence bigint NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL,
    PRIMARY KEY (run_id, name)
);

-- Open waits of an app, oldest first.
CREATE INDEX waits_app ON perdure.waits (app, created_at);

-- Deadline sweeps.
CREATE INDEX waits_deadline ON perdure.waits (deadline) WHERE deadline IS NOT NULL;

CREATE TABLE perdure.outcomes (
    run_id text NOT NULL,
    name text NOT NULL,
    outcome text NOT NULL,
    signal_id text,
    payload text,
    payload_digest text,
    at timestamptz NOT NULL,
    PRIMARY KEY (run_id, name)
);

CREATE TABLE perdure.messages (
    run_id text NOT NULL,
    channel text NOT NULL,
    key text NOT NULL,
    sequence bigint NOT NULL,
    payload text NOT NULL,
    at timestamptz NOT NULL,
    PRIMARY KEY (run_id, channel, key)
);

-- Delivery order within a channel.
CREATE UNIQUE INDEX messages_order ON perdure.messages (run_id, channel, sequence);

-- Access tokens of the console and the HTTP API: only a digest of the secret.
CREATE TABLE perdure.tokens (
    token_id text PRIMARY KEY,
    app text NOT NULL,
    scope text NOT NULL,
    digest text NOT NULL,
    created_at timestamptz NOT NULL,
    expires_at timestamptz,
    revoked_at timestamptz
);

CREATE INDEX tokens_app ON perdure.tokens (app, created_at);

-- Pages of an app's runs by keyset: (created_at, run_id) < the last one shown.
CREATE INDEX runs_page ON perdure.runs (app, created_at, run_id);
CREATE INDEX runs_page_state ON perdure.runs (app, state, created_at, run_id);
CREATE INDEX runs_page_workflow ON perdure.runs (app, workflow, created_at, run_id);

-- A run's children by keyset, oldest first (the console's tree of a run).
CREATE INDEX runs_children ON perdure.runs (parent_id, created_at, run_id) WHERE parent_id IS NOT NULL;
CREATE TABLE perdure.updates (
    run_id text NOT NULL,
    update_id text NOT NULL,
    name text NOT NULL,
    sequence bigint NOT NULL,
    payload text NOT NULL,
    state text NOT NULL,
    response text,
    at timestamptz NOT NULL,
    settled_at timestamptz,
    PRIMARY KEY (run_id, update_id)
);

-- Delivery order of one name, the order a run consumes them in.
CREATE UNIQUE INDEX updates_order ON perdure.updates (run_id, name, sequence);

-- Aborts the statement that calls it: lets a single-statement write refuse
-- (and so roll back) everything it did, without a transaction round trip.
CREATE FUNCTION perdure.refuse(reason text) RETURNS integer
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'P0001', MESSAGE = reason;
END
$$;

-- An update's delivery in one call: the run's lock, then the delivery
-- (a statement of its own, with a snapshot taken after the lock).
CREATE FUNCTION perdure.deliver_update(
    p_run_id text, p_update_id text, p_name text, p_payload text, p_now timestamptz,
    p_terminal text[], p_app text
) RETURNS TABLE (
    run_id text, update_id text, name text, sequence bigint, payload text, state text,
    response text, at timestamptz, settled_at timestamptz, fresh boolean, refused text
)
LANGUAGE plpgsql
-- Its statements are all by run id: one generic plan per connection (0019).
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    target perdure.runs%ROWTYPE;
    refusal text;
BEGIN
    -- Orders this delivery with a park of the run. The row gets a new version
    -- (nothing in it changes): a one-statement end of the run whose snapshot
    -- predates this delivery sees it changed, and ends the run the way that
    -- reads what the delivery stored (finish_alone).
    UPDATE perdure.runs AS r SET updated_at = r.updated_at WHERE r.run_id = p_run_id
    RETURNING r.* INTO target;
    -- With the sender's app (p_app), a run of another app is not found, and one
    -- past its deadline is refused: the sender settles it first.
    IF NOT FOUND OR target.app <> coalesce(p_app, target.app) THEN
        RETURN;
    END IF;
    IF target.state = ANY(p_terminal) THEN
        refusal := target.state;
    ELSIF p_app IS NOT NULL AND target.deadline IS NOT NULL AND NOT target.cancel_requested
          AND target.deadline <= coalesce(p_now, statement_timestamp()) THEN
        refusal := 'overdue';
    END IF;
    IF refusal IS NOT NULL THEN
        RETURN QUERY SELECT p_run_id, p_update_id, p_name, NULL::bigint, NULL::text,
            NULL::text, NULL::text, NULL::timestamptz, NULL::timestamptz, false, refusal;
        RETURN;
    END IF;
    -- A statement of its own, so its snapshot is taken after the lock above.
    RETURN QUERY
    WITH created AS (
        INSERT INTO perdure.updates AS u (
            run_id, update_id, name, sequence, payload, state, response, at, settled_at
        )
        SELECT p_run_id, p_update_id, p_name, coalesce(max(o.sequence), 0) + 1, p_payload,
               'pending', NULL, coalesce(p_now, statement_timestamp()), NULL
        FROM perdure.updates AS o WHERE o.run_id = p_run_id
        ON CONFLICT (run_id, update_id) DO NOTHING
        RETURNING u.*
    ), woken AS (
        UPDATE perdure.runs AS r SET
            state = 'queued',
            ready_at = NULL,
            ledger_sequence = r.ledger_sequence + 1,
            updated_at = coalesce(p_now, statement_timestamp())
        WHERE r.run_id = p_run_id AND r.state = 'waiting'
          AND EXISTS (SELECT 1 FROM created)
          AND EXISTS (
              SELECT 1 FROM perdure.waits AS w
              WHERE w.run_id = p_run_id AND w.kind = 'update' AND w.name = p_name
          )
        RETURNING r.run_id, r.app, r.generation, r.ledger_sequence, r.ledger_limit
    ), receipt AS (
        INSERT INTO perdure.ledger (run_id, sequence, kind, at, generation)
        SELECT w.run_id, w.ledger_sequence, 'woken', coalesce(p_now, statement_timestamp()),
               w.generation
        FROM woken AS w
    ), trimmed AS (
        DELETE FROM perdure.ledger AS l USING woken AS w
        WHERE l.run_id = w.run_id AND l.sequence <= w.ledger_sequence - w.ledger_limit
    ), announced AS (
        -- The worker is told; watchers are not (no answer, event or end came).
        -- The update comes along when it fits in the notification (8,000
        -- bytes): the worker keeping the run warm then need not read it.
        SELECT (SELECT pg_notify('perdure_ready', w.app || chr(31) || w.run_id || CASE
                    WHEN octet_length(w.app) + octet_length(w.run_id)
                         + octet_length(j.carried) <= 7900
                    THEN chr(31) || j.carried ELSE '' END)::text
                FROM woken AS w) AS ready
        FROM created AS c
        CROSS JOIN LATERAL (
            SELECT json_build_object('update_id', c.update_id, 'name', c.name,
                                     'sequence', c.sequence, 'payload', c.payload,
                                     'at', c.at)::text AS carried
        ) AS j
    )
    SELECT c.run_id, c.update_id, c.name, c.sequence, c.payload, c.state, c.response, c.at,
           c.settled_at, true, NULL::text
    FROM created AS c, announced
    UNION ALL
    SELECT s.run_id, s.update_id, s.name, s.sequence, s.payload, s.state, s.response, s.at,
           s.settled_at, false, NULL::text
    FROM perdure.updates AS s
    WHERE s.run_id = p_run_id AND s.update_id = p_update_id
      AND NOT EXISTS (SELECT 1 FROM created);
END
$$;

-- The migrations of each app's own schema (@app.migration) applied so far.
CREATE TABLE perdure.app_migrations (
    app text NOT NULL,
    version integer NOT NULL,
    applied_at timestamptz NOT NULL,
    PRIMARY KEY (app, version)
);

-- Schedules: one row per schedule of an app (0008).
CREATE TABLE perdure.schedules (
    app text NOT NULL,
    name text NOT NULL,
    workflow text NOT NULL,
    version text NOT NULL,
    cron text NOT NULL,
    tz text NOT NULL,
    catch_up text NOT NULL,
    input text NOT NULL,
    tick_arg boolean NOT NULL,
    paused boolean NOT NULL,
    settled_until timestamptz NOT NULL,
    last_tick timestamptz,
    last_run_id text,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    PRIMARY KEY (app, name)
);

-- Deadline sweeps (0011): only runs that can still pass theirs.
CREATE INDEX runs_deadline ON perdure.runs (deadline)
    WHERE deadline IS NOT NULL AND state IN ('queued', 'running', 'waiting', 'suspended');

-- One row per queue of an app: its limits (NULL: none). A claim of the
-- queue's runs locks it, so claims on every host see each other's.
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

-- The ownership posture serving each app, its holder and until when it holds.
CREATE TABLE perdure.app_owners (
    app text PRIMARY KEY,
    posture text NOT NULL,
    holder text NOT NULL,
    lease_expires_at timestamptz NOT NULL,
    generation bigint NOT NULL,
    updated_at timestamptz NOT NULL
);

-- The tasks of plan runs (0016), each claimed on its own.
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
