-- 0015: which ownership posture serves each app ('run-lease', 'store-lease',
-- 'none'), the worker that last renewed the record and until when it holds.
-- A worker of another posture is refused while the record is live; the
-- generation grows when a worker takes the app over from an expired holder.

CREATE TABLE app_owners (
    app TEXT PRIMARY KEY,
    posture TEXT NOT NULL,
    holder TEXT NOT NULL,
    lease_expires_at INTEGER NOT NULL,
    generation INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);
