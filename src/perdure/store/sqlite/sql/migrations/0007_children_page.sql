-- 0007: a run's children page by keyset, oldest first, on their own index,
-- so the console shows the first children of a run with thousands of them
-- without sorting them all. Only child runs are in it.

CREATE INDEX runs_children ON runs (parent_id, created_at, run_id) WHERE parent_id IS NOT NULL;
