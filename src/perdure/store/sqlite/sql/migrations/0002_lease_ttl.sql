-- 0002: each run keeps the TTL of its latest lease (microseconds), so that a
-- sweep can pull back a lease that a backward clock step left too far ahead.

ALTER TABLE runs ADD COLUMN lease_ttl INTEGER;

-- Sweeps: leases further ahead than their TTL (the clock stepped back).
CREATE INDEX runs_running ON runs (lease_expires_at) WHERE state = 'running';
