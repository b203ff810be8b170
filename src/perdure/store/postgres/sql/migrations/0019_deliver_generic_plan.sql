-- 0019: an update's delivery keeps one plan per connection. Its statements
-- are all by run id, so a generic plan suits every call, and a delivery does
-- not plan its statements again each time (a custom plan, which PostgreSQL
-- otherwise keeps choosing here, costs about 0.2 ms of a delivery).
ALTER FUNCTION perdure.deliver_update(text, text, text, text, timestamptz, text[], text)
    SET plan_cache_mode = force_generic_plan;
