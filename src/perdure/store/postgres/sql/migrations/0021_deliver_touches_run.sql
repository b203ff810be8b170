-- 0021: an update's delivery gives the run's row a new version as it takes
-- its lock, so that a run ending in one statement at the same moment (whose
-- snapshot cannot see the new update) notices, and ends the run the way that
-- abandons it. Only the function's first statement changes.
CREATE OR REPLACE FUNCTION perdure.deliver_update(
    p_run_id text, p_update_id text, p_name text, p_payload text, p_now timestamptz,
    p_terminal text[], p_app text
) RETURNS TABLE (
    run_id text, update_id text, name text, sequence bigint, payload text, state text,
    response text, at timestamptz, settled_at timestamptz, fresh boolean, refused text
)
LANGUAGE plpgsql
-- Its statements are all by run id: one generic plan per connection (0019).
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    target perdure.runs%ROWTYPE;
    refusal text;
BEGIN
    -- Orders this delivery with a park of the run. The row gets a new version
    -- (nothing in it changes): a one-statement end of the run whose snapshot
    -- predates this delivery sees it changed, and ends the run the way that
    -- reads what the delivery stored (finish_alone).
    UPDATE perdure.runs AS r SET updated_at = r.updated_at WHERE r.run_id = p_run_id
    RETURNING r.* INTO target;
    -- With the sender's app (p_app), a run of another app is not found, and one
    -- past its deadline is refused: the sender settles it first.
    IF NOT FOUND OR target.app <> coalesce(p_app, target.app) THEN
        RETURN;
    END IF;
    IF target.state = ANY(p_terminal) THEN
        refusal := target.state;
    ELSIF p_app IS NOT NULL AND target.deadline IS NOT NULL AND NOT target.cancel_requested
          AND target.deadline <= coalesce(p_now, statement_timestamp()) THEN
        refusal := 'overdue';
    END IF;
    IF refusal IS NOT NULL THEN
        RETURN QUERY SELECT p_run_id, p_update_id, p_name, NULL::bigint, NULL::text,
            NULL::text, NULL::text, NULL::timestamptz, NULL::timestamptz, false, refusal;
        RETURN;
    END IF;
    -- A statement of its own, so its snapshot is taken after the lock above.
    RETURN QUERY
    WITH created AS (
        INSERT INTO perdure.updates AS u (
            run_id, update_id, name, sequence, payload, state, response, at, settled_at
        )
        SELECT p_run_id, p_update_id, p_name, coalesce(max(o.sequence), 0) + 1, p_payload,
               'pending', NULL, coalesce(p_now, statement_timestamp()), NULL
        FROM perdure.updates AS o WHERE o.run_id = p_run_id
        ON CONFLICT (run_id, update_id) DO NOTHING
        RETURNING u.*
    ), woken AS (
        UPDATE perdure.runs AS r SET
            state = 'queued',
            ready_at = NULL,
            ledger_sequence = r.ledger_sequence + 1,
            updated_at = coalesce(p_now, statement_timestamp())
        WHERE r.run_id = p_run_id AND r.state = 'waiting'
          AND EXISTS (SELECT 1 FROM created)
          AND EXISTS (
              SELECT 1 FROM perdure.waits AS w
              WHERE w.run_id = p_run_id AND w.kind = 'update' AND w.name = p_name
          )
        RETURNING r.run_id, r.app, r.generation, r.ledger_sequence, r.ledger_limit
    ), receipt AS (
        INSERT INTO perdure.ledger (run_id, sequence, kind, at, generation)
        SELECT w.run_id, w.ledger_sequence, 'woken', coalesce(p_now, statement_timestamp()),
               w.generation
        FROM woken AS w
    ), trimmed AS (
        DELETE FROM perdure.ledger AS l USING woken AS w
        WHERE l.run_id = w.run_id AND l.sequence <= w.ledger_sequence - w.ledger_limit
    ), announced AS (
        -- The worker is told; watchers are not (no answer, event or end came).
        -- The update comes along when it fits in the notification (8,000
        -- bytes): the worker keeping the run warm then need not read it.
        SELECT (SELECT pg_notify('perdure_ready', w.app || chr(31) || w.run_id || CASE
                    WHEN octet_length(w.app) + octet_length(w.run_id)
                         + octet_length(j.carried) <= 7900
                    THEN chr(31) || j.carried ELSE '' END)::text
                FROM woken AS w) AS ready
        FROM created AS c
        CROSS JOIN LATERAL (
            SELECT json_build_object('update_id', c.update_id, 'name', c.name,
                                     'sequence', c.sequence, 'payload', c.payload,
                                     'at', c.at)::text AS carried
        ) AS j
    )
    SELECT c.run_id, c.update_id, c.name, c.sequence, c.payload, c.state, c.response, c.at,
           c.settled_at, true, NULL::text
    FROM created AS c, announced
    UNION ALL
    SELECT s.run_id, s.update_id, s.name, s.sequence, s.payload, s.state, s.response, s.at,
           s.settled_at, false, NULL::text
    FROM perdure.updates AS s
    WHERE s.run_id = p_run_id AND s.update_id = p_update_id
      AND NOT EXISTS (SELECT 1 FROM created);
END
$$;
