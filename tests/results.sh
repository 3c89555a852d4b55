#!/bin/bash
# The results of a fixed set of short training runs, one line a run: GPT-2 and Llama models, the
# state streamed, partly or wholly resident, both schedules, the checkpoints and the blocks'
# internals in each place, clipping, prefetch, fewer gradient slots, bf16 weights; on the CPU
# backend, and on CUDA too where this build has it and a GPU is visible. Each line gives the run's
# options, how many units' state it kept in the pool, its 10 losses (as metrics.jsonl has them) and
# the SHA-256 of its exported weights.
#
# For a change that must leave results unchanged (a restructuring): `make results > before.txt`
# before it, `make results > after.txt` after, and `diff before.txt after.txt` prints nothing.
# Runs in a scratch directory (RESULTS_DIR, default a fresh one under /tmp), removed at the end.
# RESULTS_BACKENDS="cpu cuda" chooses the backends (default: cpu, and cuda where usable).
set -u
BUILD=${BUILD:-build}
L=$PWD/$BUILD/bin/fuyou-launch
[ -x "$L" ] || { echo "results.sh: $L not built (run make first)" >&2; exit 1; }
dir=${RESULTS_DIR:-$(mktemp -d /tmp/fuyou-results.XXXXXX)}
mkdir -p "$dir"
trap 'rm -rf "$dir"' EXIT
"$L" prepare --out "$dir/data.tok" tests/fixtures/sample.txt >"$dir/prepare.log" 2>&1 ||
  { cat "$dir/prepare.log" >&2; exit 1; }

backends=${RESULTS_BACKENDS:-cpu}
if [ -z "${RESULTS_BACKENDS:-}" ] && [ -d "$BUILD/obj/gpu_worker/cuda" ] &&
   nvidia-smi -L >/dev/null 2>&1; then
  backends="cpu cuda"
fi

GPT2="--layers 4 --heads 2 --embd 64 --ctx 32 --seed 5"
LLAMA="--arch llama --layers 2 --heads 4 --kv-heads 2 --embd 32 --ffn 48 --ctx 32 --rope-theta 500000 --seed 3"
# --cpu-mem 0 and --clip-grad-norm 0 before each run's options: the results of the runs as they
# were made before those defaults became the machine's memory and 1.0 (a run's options replace them)
TRAIN="--steps 10 --batch 8 --seq 32 --lr 3e-3 --warmup 5 --eval-every 1000 --checkpoint-every 4 --cpu-mem 0 --clip-grad-norm 0"
n=0 failed=0

# run LABEL INIT_OPTIONS TRAIN_OPTIONS: one line of results, or FAILED with the log's last lines.
run() {
  local label=$1 init=$2 opts=$3 backend=$4 gpu=""
  # a budget: without one the CUDA arena holds the working buffers alone, no swapped internals
  [ "$backend" = cuda ] && gpu="--gpu-mem 4G"
  n=$((n + 1))
  local r="$dir/r$n"
  # shellcheck disable=SC2086 # the option lists are meant to split
  if ! "$L" init --run-dir "$r" $init >"$dir/init$n.log" 2>&1 ||
     ! "$L" train --run-dir "$r" --data "$dir/data.tok" $TRAIN --backend "$backend" $opts $gpu \
         --export "$r.fywt" >"$dir/train$n.log" 2>&1; then
    echo "$backend $label: FAILED"; tail -n 3 "$dir/train$n.log" | sed 's/^/    /'
    failed=$((failed + 1)); return
  fi
  local kept losses digest
  kept=$(grep -o 'optimizer state of [0-9]* of [0-9]* units' "$dir/train$n.log" | head -1 |
         sed 's/optimizer state of \([0-9]* of [0-9]*\) units/state \1 kept/')
  losses=$(grep -o '"loss": [^,]*' "$r/metrics.jsonl" | cut -d' ' -f2 | tr '\n' ' ')
  digest=$(sha256sum "$r.fywt" | cut -c1-16)
  echo "$backend $label | $kept | $losses| $digest"
  rm -rf "$r" "$r.fywt"
}

for b in $backends; do
  for sched in overlap serial; do
    run "gpt2 $sched streamed" "$GPT2" "--schedule $sched" "$b"
    run "gpt2 $sched --cpu-mem 20M" "$GPT2" "--schedule $sched --cpu-mem 20M" "$b"
    run "gpt2 $sched --cpu-mem 1G" "$GPT2" "--schedule $sched --cpu-mem 1G" "$b"
    run "gpt2 $sched --clip-grad-norm 0.05" "$GPT2" "--schedule $sched --clip-grad-norm 0.05" "$b"
    run "llama $sched streamed" "$LLAMA" "--schedule $sched" "$b"
    run "llama $sched --cpu-mem 1G" "$LLAMA" "--schedule $sched --cpu-mem 1G" "$b"
    run "llama-tied $sched streamed" "$LLAMA --tied" "--schedule $sched" "$b"
  done
  run "gpt2 --ckpt-place ssd" "$GPT2" "--ckpt-place ssd" "$b"
  for plan in recompute host ssd; do
    run "gpt2 --act-plan $plan" "$GPT2" "--act-plan $plan" "$b"
  done
  run "gpt2 --prefetch 3 --grad-slots 3" "$GPT2" "--prefetch 3 --grad-slots 3" "$b"
  run "gpt2 --weights-dtype bf16 --cpu-mem 1G" "$GPT2" "--weights-dtype bf16 --cpu-mem 1G" "$b"
  run "llama --clip-grad-norm 0.05 --cpu-mem 1G" "$LLAMA" "--clip-grad-norm 0.05 --cpu-mem 1G" "$b"
done
echo "results: $n runs, $failed failed"
[ "$failed" -eq 0 ]
