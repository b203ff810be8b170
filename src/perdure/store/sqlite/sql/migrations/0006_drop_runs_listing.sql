-- 0006: runs_listing (app, created_at) is a prefix of runs_page
-- (app, created_at, run_id), which serves every query it served; keeping
-- both cost a write to each on every new run.

DROP INDEX IF EXISTS runs_listing;
