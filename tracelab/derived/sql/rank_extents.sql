-- Per rank of a run, what its events span and hold, derived where the lost-time parts read the
-- rank's events anyway, so that nothing after the ingest reads every rank's events file for
-- these facts (at 10,000 ranks each such read took 2-3 s): the views' time origin and end, the
-- number of events, and whether the rank ran device work. A rank without events has no row.
CREATE TABLE IF NOT EXISTS rank_extents (
    -- The run.
    run_id INTEGER NOT NULL,
    -- The rank.
    rank INTEGER NOT NULL,
    -- Its events (rows of events).
    events BIGINT NOT NULL,
    -- Its first event's start, on the rank's own clock (events.ts_ns; subtract
    -- clock_offsets.offset_ns for the reference clock).
    first_ns BIGINT NOT NULL,
    -- Its last event's end, on the rank's own clock (the largest ts_ns + dur_ns).
    end_ns BIGINT NOT NULL,
    -- It has device compute or communication events: a device rank, whose time the lost-time
    -- model splits by what its device does (docs/metrics.md).
    device BOOLEAN NOT NULL,
    PRIMARY KEY (run_id, rank)
);

INSERT INTO rank_extents BY NAME
-- The ranks $lo..$hi (a batch of the parts: its events). Parameters: $run, $lo, $hi.
SELECT $run AS run_id, rank, count(*) AS events, min(ts_ns) AS first_ns,
       max(ts_ns + dur_ns) AS end_ns,
       bool_or(on_device AND category IN ('compute', 'communication')) AS device
FROM events WHERE run_id = $run AND rank BETWEEN $lo AND $hi
GROUP BY rank;
