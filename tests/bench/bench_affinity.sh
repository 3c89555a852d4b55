#!/bin/bash
# make bench-affinity (GPU machine): what the placement of the three worker processes on the CPU
# cores does to the optimizer's rate and to the step. Whole training steps (bench_pipeline.sh) of
# the 1.3B GPT-3-style model at batch 16 with the optimizer state in host memory, the setting
# where AdamW takes most of the step, once per --affinity:
#   auto    hwloc's placement (gpu worker on the first core, io worker on the second, the
#           optimizer's threads on the rest of that NUMA node)
#   shared  every worker allowed on every core (no placement: the scheduler decides)
#   half    the optimizer on half the cores, sharing the gpu and io workers' core
# The table's "opt s" column is the optimizer's busy time a step; its rate is the model's
# parameters over it. Environment: AFFINITY_CONFIG (1.3B; 350M for a quick look), AFFINITY_BATCH
# (16), PIPELINE_STEPS and bench_pipeline.sh's; for a smoke test anywhere: AFFINITY_CONFIG=tiny
# PIPELINE_SEQ=32 PIPELINE_BACKEND=cpu.
set -u
cpus=$(nproc)
last=$((cpus - 1))
B=${AFFINITY_BATCH:-16}
runs="$B/host/overlap/auto/auto"
if [ "$cpus" -ge 4 ]; then
  runs="$runs $B/host/overlap/auto/gpu=0-$last,io=0-$last,opt=0-$last"
  runs="$runs $B/host/overlap/auto/gpu=0,io=0,opt=0-$((cpus / 2 - 1))"
  runs="$runs $B/host/overlap/auto/auto"
else
  echo "bench-affinity: $cpus cpus: only the automatic placement is measured"
fi
PIPELINE_CONFIGS=${AFFINITY_CONFIG:-1.3B} PIPELINE_RUNS=$runs PIPELINE_FSDP2=0 \
  exec tests/bench/bench_pipeline.sh
