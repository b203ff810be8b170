-- 0012: continue-as-new. A run that continued as new names its successor
-- (continued_as); every run of a chain names the chain's first run (origin),
-- NULL for a run that never continued and was not started by a continue.

ALTER TABLE runs ADD COLUMN continued_as TEXT;
ALTER TABLE runs ADD COLUMN origin TEXT;

-- The current run of a chain, found from any of its run ids.
CREATE INDEX runs_origin ON runs (origin, created_at) WHERE origin IS NOT NULL;
