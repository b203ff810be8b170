-- 0008: schedules. One row per schedule of an app: its declaration (saved by
-- the workers that serve the app, so that a process without the code can list
-- and trigger it), whether it is paused, and the instant through which its
-- ticks are settled.

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
