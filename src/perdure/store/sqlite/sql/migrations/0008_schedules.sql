-- 0008: schedules. One row per schedule of an app: its declaration (saved by
-- the workers that serve the app, so that a process without the code can list
-- and trigger it), whether it is paused, and the instant through which its
-- ticks are settled.

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
