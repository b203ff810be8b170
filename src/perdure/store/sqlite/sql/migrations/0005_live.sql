-- 0005: updates sent to live runs. A row is the request until the run
-- answers it; it stays after the run ends, so a sender's retry with the same
-- update_id is answered with the stored response (or told it was abandoned).

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
