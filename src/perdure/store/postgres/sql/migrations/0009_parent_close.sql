-- 0009: what happens to a child run when its parent ends, fixed when the
-- child is created from its workflow's parent_close: 'cancel' (canceled with
-- its descendants) or NULL (abandoned: it runs on, the default).

ALTER TABLE perdure.runs ADD COLUMN parent_close TEXT;
