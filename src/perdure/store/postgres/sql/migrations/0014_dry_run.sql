-- 0014: a dry run is claimed only by workers started with dry_run=True, and
-- its once and idempotent steps are described in the journal, not performed.
-- Fixed when the run is created; a child takes its parent's.

ALTER TABLE perdure.runs ADD COLUMN dry_run boolean NOT NULL DEFAULT false;
