-- 0004: access tokens for the console and the HTTP API, and the index that
-- pages an app's runs by keyset (newest first) at any depth.

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

CREATE INDEX runs_page ON perdure.runs (app, created_at, run_id);
CREATE INDEX runs_page_state ON perdure.runs (app, state, created_at, run_id);
CREATE INDEX runs_page_workflow ON perdure.runs (app, workflow, created_at, run_id);
