-- The run's process groups and the parallel dimension each serves (docs/metrics.md, "Process
-- groups and parallel dimensions"; tracelab/derived/groups.py). Members come from the trace
-- (distributedInfo.pg_config, the collectives' Process Group Ranks), a mesh (--mesh, the
-- collector's DeviceMesh), or are inferred from timing where the trace names no group (plain
-- gloo traces); the dimension from, strongest first, --mesh, the collector's DeviceMesh, the
-- group's name or description, else the pattern of its collectives.
CREATE TABLE IF NOT EXISTS process_groups (
    -- The run.
    run_id INTEGER NOT NULL,
    -- The group's key: its pg_name when the trace names it, else 'ranks:' and its ranks.
    -- matched_collectives.group_key and comm_attribution's groups are these keys.
    group_key VARCHAR NOT NULL,
    -- The trace's process group name; NULL when the group is known only from a mesh or timing.
    pg_name VARCHAR,
    -- The trace's process group description (e.g. 'mesh_tp', 'default_pg'), when given.
    pg_desc VARCHAR,
    -- Global ranks of the group, ascending.
    ranks INTEGER[] NOT NULL,
    -- Ranks in the group.
    size INTEGER NOT NULL,
    -- Where the members came from: 'trace', 'mesh' (--mesh), 'collector' (its DeviceMesh) or
    -- 'inferred' (from timing: the members of one collective overlap in time).
    members_from VARCHAR NOT NULL,
    -- Parallel dimension: dp, dp_shard (FSDP), tp, pp, cp, ep or unknown
    -- (tracelab.vocabulary.Dim).
    dim VARCHAR NOT NULL,
    -- Where the dimension came from: 'mesh', 'collector', 'trace' or 'inferred'; NULL when
    -- unknown.
    source VARCHAR,
    -- What said so, in words (the name, the mesh, the pattern, the inference's figures).
    evidence VARCHAR NOT NULL
);

INSERT INTO process_groups BY NAME
-- tracelab.derived.groups' groups (Arrow table _tl_groups, named columns). Parameters: $run.
SELECT $run AS run_id, group_key, pg_name, pg_desc, ranks, len(ranks) AS size, members_from,
       dim, source, evidence
FROM _tl_groups;
