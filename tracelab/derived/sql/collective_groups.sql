-- The process group of each collective whose trace does not name it: the group of its ranks
-- when the trace gives only those, else (plain torch.profiler traces of gloo jobs) the group
-- inferred from timing by tracelab/derived/groups.py. matched_collectives matches such a
-- collective only within this group.
CREATE TABLE IF NOT EXISTS collective_groups (
    -- The run.
    run_id INTEGER NOT NULL,
    -- The rank.
    rank INTEGER NOT NULL,
    -- collectives.event_idx of the collective.
    event_idx BIGINT NOT NULL,
    -- Its group (process_groups.group_key).
    group_key VARCHAR NOT NULL
);

INSERT INTO collective_groups BY NAME
-- tracelab.derived.groups' assignments (Arrow table _tl_assigned). Parameters: $run.
SELECT $run AS run_id, rank, event_idx, group_key FROM _tl_assigned;
