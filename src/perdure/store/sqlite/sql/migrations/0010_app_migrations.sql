-- 0010: the migrations of each app's own schema (@app.migration) applied so far.

CREATE TABLE app_migrations (
    app TEXT NOT NULL,
    version INTEGER NOT NULL,
    applied_at INTEGER NOT NULL,
    PRIMARY KEY (app, version)
);
