-- 0011: suspending runs and run deadlines.
-- deadline: the instant by which the run must have ended, else it is canceled
-- (deadline_exceeded); NULL: none. suspend_requested: a suspend asked of a
-- running run, applied by its owner at its next journal write.
-- suspended_from: the state a suspended run returns to on resume ('queued' or
-- 'waiting'); a suspended run keeps its ready_at and its waits meanwhile.

ALTER TABLE runs ADD COLUMN deadline INTEGER;
ALTER TABLE runs ADD COLUMN suspend_requested INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN suspended_from TEXT;

-- Deadline sweeps: only runs that can still pass theirs.
CREATE INDEX runs_deadline ON runs (deadline)
    WHERE deadline IS NOT NULL AND state IN ('queued', 'running', 'waiting', 'suspended');
