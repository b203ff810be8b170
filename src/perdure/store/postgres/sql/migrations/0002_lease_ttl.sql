-- 0002: each run keeps the TTL of its latest lease, so that a sweep can pull
-- back a lease that a backward step of the clock left too far ahead.

ALTER TABLE perdure.runs ADD COLUMN lease_ttl interval;
