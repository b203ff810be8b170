-- 0003: each run keeps the bound of its provenance ledger, fixed when it is
-- created, so that a reader or writer with another bound neither trims it
-- nor reads it as corrupt. Runs created before keep the default bound.

ALTER TABLE runs ADD COLUMN ledger_limit INTEGER NOT NULL DEFAULT 256;
