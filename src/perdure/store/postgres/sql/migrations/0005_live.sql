-- 0005: updates sent to live runs. A row is the request until the run
-- answers it; it stays after the run ends, so a sender's retry with the same
-- update_id is answered with the stored response (or told it was abandoned).

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
