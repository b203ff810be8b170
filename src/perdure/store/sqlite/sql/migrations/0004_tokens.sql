-- 0004: access tokens for the console and the HTTP API, and the index that
-- pages an app's runs by keyset (newest first) at any depth.

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

CREATE INDEX runs_page ON runs (app, created_at, run_id);
CREATE INDEX runs_page_state ON runs (app, state, created_at, run_id);
CREATE INDEX runs_page_workflow ON runs (app, workflow, created_at, run_id);
