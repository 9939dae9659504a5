#!/usr/bin/env bash
# GPU check for the collector, for a machine with one CUDA GPU; finishes in well under 5 min.
#
#   bash benchmarks/gpu_check.sh
#
# 1. the gpu-marked tests (CUDA-event collective timing, per-step allocator peaks, memory
#    snapshot, CUDA kernel and NCCL traces);
# 2. a profiled DDP training run on the GPU (NCCL, one rank), ingested by `tracelab ingest`,
#    with a summary of what was captured.
set -euo pipefail
cd "$(dirname "$0")/.."
python - <<'PY'
import torch
assert torch.cuda.is_available(), "no CUDA GPU visible: this check needs one"
print("GPU:", torch.cuda.get_device_name(0), "| torch", torch.__version__, "| CUDA", torch.version.cuda)
PY
timeout 200 python -m pytest -m gpu -q -p no:cacheprovider tests

work=$(mktemp -d)
OMP_NUM_THREADS=1 timeout 120 python -m torch.distributed.run --nproc_per_node 1 \
    --master_addr 127.0.0.1 --master_port 29533 \
    examples/ddp.py --device cuda --out "$work/gpu_ddp" --steps 8 --record 3:6
python - "$work/gpu_ddp" <<'PY'
import gzip, json, sys
from collections import Counter
from pathlib import Path
root = Path(sys.argv[1])
m = json.loads((root / "manifest.json").read_text())
r = m["ranks"][0]
print("device:", r["device"], "| versions:", m["versions"])
recs = [json.loads(l) for l in (root / r["collectives"]).read_text().splitlines() if l]
print("records:", Counter((x["source"], x["op"]) for x in recs))
timed = [x for x in recs if x["start_ns"] and x["end_ns"]]
print(f"timed records: {len(timed)}/{len(recs)}")
print("memory peaks (MiB):", [round((p["peak_allocated_bytes"] or 0) / 2**20, 1) for p in r["memory"]])
trace = json.load(gzip.open(root / r["traces"][0], "rt"))
print("kernels:", sum(1 for e in trace["traceEvents"] if e.get("cat") == "kernel"))
assert r["collector_error"] is None and timed and r["memory"]
PY
python -m tracelab.cli ingest "$work/gpu_ddp" --db "$work/gpu.duckdb"
python -m tracelab.cli runs --db "$work/gpu.duckdb"
echo "gpu_check: OK"
