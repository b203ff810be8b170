-- 0015: which ownership posture serves each app ('run-lease', 'store-lease',
-- 'none'), the worker that last renewed the record and until when it holds.
-- A worker of another posture is refused while the record is live; the
-- generation grows when a worker takes the app over from an expired holder.

CREATE TABLE perdure.app_owners (
    app text PRIMARY KEY,
    posture text NOT NULL,
    holder text NOT NULL,
    lease_expires_at timestamptz NOT NULL,
    generation bigint NOT NULL,
    updated_at timestamptz NOT NULL
);
