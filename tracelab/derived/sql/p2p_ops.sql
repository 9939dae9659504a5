-- Point-to-point operations (send/recv) on each rank, with the part of each that was data
-- movement: the shortest duration of any p2p op of the same kind and size in the run.
CREATE TABLE IF NOT EXISTS p2p_ops (
    -- The run.
    run_id INTEGER NOT NULL,
    -- The rank.
    rank INTEGER NOT NULL,
    -- send, recv or send_recv.
    op VARCHAR NOT NULL,
    -- The other rank, when the trace says.
    peer INTEGER,
    -- Bytes moved, when known.
    bytes BIGINT,
    -- The step, when inside one.
    step INTEGER,
    -- Start.
    start_ns BIGINT NOT NULL,
    -- End.
    end_ns BIGINT NOT NULL,
    -- Shortest duration of a p2p op of this kind and size in the run: the transfer.
    transfer_ns BIGINT NOT NULL,
    -- (end_ns - start_ns) - transfer_ns: waiting for the peer.
    wait_ns BIGINT NOT NULL,
    -- events.idx of the event; NULL when not from an event.
    event_idx BIGINT
);

INSERT INTO p2p_ops BY NAME
-- send/recv from device kernels where a rank has them, else from host annotations; transfer =
-- the shortest op of the same kind and size in the run. Parameters: $run.
WITH p AS (
    SELECT c.rank, c.op, c.peer, coalesce(c.in_bytes, c.out_bytes) AS bytes, c.step,
           ref_ns(c.start_ns, o.o) AS s, ref_ns(c.end_ns, o.o) AS e, c.event_idx,
           c.source
    FROM collectives c JOIN run_offsets($run) o ON o.rank = c.rank
    WHERE c.run_id = $run AND c.op IN ('send', 'recv', 'send_recv')
      AND c.start_ns IS NOT NULL AND c.end_ns IS NOT NULL
      AND c.source IN ('kernel', 'host')
),
best AS (SELECT rank, min(CASE source WHEN 'kernel' THEN 0 ELSE 1 END) AS pick
         FROM p GROUP BY rank),
q AS (SELECT p.* FROM p JOIN best USING (rank)
      WHERE CASE p.source WHEN 'kernel' THEN 0 ELSE 1 END = best.pick),
t AS (SELECT op, coalesce(bytes, -1) AS b, min(e - s) AS transfer_ns FROM q GROUP BY ALL)
SELECT $run AS run_id, q.rank, q.op, q.peer, q.bytes, q.step, q.s AS start_ns, q.e AS end_ns,
       t.transfer_ns, (q.e - q.s) - t.transfer_ns AS wait_ns, q.event_idx
FROM q JOIN t ON t.op = q.op AND t.b = coalesce(q.bytes, -1);
