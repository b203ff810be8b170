-- 0010: the migrations of each app's own schema (@app.migration) applied so far.

CREATE TABLE perdure.app_migrations (
    app text NOT NULL,
    version integer NOT NULL,
    applied_at timestamptz NOT NULL,
    PRIMARY KEY (app, version)
);
