-- 0002: no schema change.

SELECT 1;
