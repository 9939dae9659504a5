-- Each rank's clock offset to the reference rank (the lowest captured rank) and how sure it
-- is. Offsets come from the collector's clock exchange when the capture has one; ranks whose
-- traces name one host share its clock (offset 0); otherwise they are bounded by causality over
-- matched collectives (no rank ends a collective before every rank has arrived).
CREATE TABLE IF NOT EXISTS clock_offsets (
    -- The run.
    run_id INTEGER NOT NULL,
    -- The rank.
    rank INTEGER NOT NULL,
    -- Its clock minus the reference clock: reference time = own time - offset_ns.
    offset_ns BIGINT NOT NULL,
    -- Half-width of the interval the true offset lies in (the clock resolution when measured
    -- or shared, the causality bound when estimated); NULL when nothing bounds it.
    uncertainty_ns BIGINT,
    -- 'reference', 'collector', 'same_host', 'collectives' (causality bounds) or 'none'.
    method VARCHAR NOT NULL,
    -- The rank whose clock is the reference.
    reference_rank INTEGER NOT NULL,
    -- Host the rank ran on (trace host_name, capture manifest, or trace file name), when known.
    host VARCHAR,
    -- Matched collectives the estimate used (0 unless method = 'collectives').
    matches INTEGER NOT NULL,
    -- Matched collectives that, after alignment, end on this rank before the last rank arrived
    -- by more than the uncertainties allow: a sign of drift or of a wrong offset.
    causality_violations INTEGER NOT NULL,
    PRIMARY KEY (run_id, rank)
);

INSERT INTO clock_offsets BY NAME
-- The offsets tracelab.derived.clocks estimated (Arrow table _tl_clocks, named columns).
-- Parameters: $run.
SELECT $run AS run_id, rank, offset_ns, uncertainty_ns, method, reference_rank, host, matches,
       0 AS causality_violations
FROM _tl_clocks;
