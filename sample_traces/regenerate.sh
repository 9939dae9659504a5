#!/usr/bin/env bash
# Regenerate every sample capture in this folder from the example scripts: 4 ranks each,
# torchrun + gloo on CPU, tiny models, 10 recorded steps (2-11), 30-60 s per capture on 2 cores.
#
#   bash sample_traces/regenerate.sh            # all of them
#   bash sample_traces/regenerate.sh ddp fsdp2  # some of them
#
# Timings differ from run to run (and from machine to machine); structure does not.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 PYTHONHASHSEED=0
NPROC=${NPROC:-4}

declare -A RUNS=(
  [ddp]="examples/ddp.py --steps 12 --record 2:12"
  [ddp_slow_rank]="examples/ddp_slow_rank.py --steps 12 --record 2:12 --slow-rank 2 --delay-ms 40"
  [pipeline_1f1b]="examples/pipeline.py --schedule 1f1b --steps 12 --record 2:12"
  [pipeline_interleaved_1f1b]="examples/pipeline.py --schedule interleaved-1f1b --steps 12 --record 2:12"
  [pipeline_zero_bubble]="examples/pipeline.py --schedule interleaved-zb --steps 12 --record 2:12"
  [pipeline_unbalanced]="examples/pipeline_unbalanced.py --steps 12 --record 2:12"
  [fsdp2]="examples/fsdp2.py --steps 12 --record 2:12"
  [tensor_parallel]="examples/tensor_parallel.py --steps 12 --record 2:12"
)
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  names=(ddp ddp_slow_rank pipeline_1f1b pipeline_interleaved_1f1b pipeline_zero_bubble
         pipeline_unbalanced fsdp2 tensor_parallel)
fi
port=29700
for name in "${names[@]}"; do
  cmd=${RUNS[$name]:?unknown sample $name}
  rm -rf "sample_traces/$name"
  port=$((port + 1))
  echo "== $name: torchrun --nproc_per_node $NPROC $cmd"
  start=$SECONDS
  # shellcheck disable=SC2086
  python -m torch.distributed.run --nproc_per_node "$NPROC" --master_addr 127.0.0.1 \
      --master_port "$port" $cmd --out "sample_traces/$name" 2>&1 \
    | grep -v -e '^USDT:' -e 'profiler results will not include' || true
  test -f "sample_traces/$name/manifest.json" || { echo "no manifest for $name" >&2; exit 1; }
  echo "   $name: $((SECONDS - start)) s, $(du -sh "sample_traces/$name" | cut -f1)"
done
du -sh sample_traces
