#!/bin/bash
# make bench-quality: the optimizer state formats' quality at a scale the CI test cannot reach. One
# model is made and fine-tuned on the bundled real text once per --optim-state format, from the same
# initialisation (the same --seed) and on the same batches; the table last gives each format's first
# training loss, its final held-out loss and that loss's distance from fp32's, and `report --compare`
# draws the curves together (when gnuplot is installed). The CPU backend's small version of this is
# tests/integration/test_optim_quality.
# Environment: QUALITY_MODEL (init's model options; default a 1.2B GPT: 24 layers, 2048 wide, 16
# heads, context 256, one state copy), QUALITY_FORMATS ("fp32 bf16 int8"; fp32 first, the others are measured
# against it), QUALITY_STEPS (100), QUALITY_BATCH (4), QUALITY_SEQ (256), QUALITY_LR (1e-4),
# QUALITY_WARMUP (10), QUALITY_SEED (1), QUALITY_EVAL_BATCHES (16), QUALITY_BACKEND (cuda where
# nvidia-smi is found, else cpu), QUALITY_TRAIN_ARGS (more train options; with cuda
# "--gpu-mem 24G --cpu-mem 40G": the state in the pool), QUALITY_DIR (where the runs go: removed
# first and kept afterwards for `report`; default build/bench-quality), QUALITY_KEEP (1: keep each
# run's store; 0, the default, removes it after the run: 14 GiB a format at 1.2B).
set -euo pipefail
BUILD=${BUILD:-build}
L=$BUILD/bin/fuyou-launch
[ -x "$L" ] || { echo "bench_optim_quality: $L is missing; run make first" >&2; exit 1; }
MODEL=${QUALITY_MODEL:---layers 24 --heads 16 --embd 2048 --ctx 256 --state-copies 1}
FORMATS=${QUALITY_FORMATS:-fp32 bf16 int8}
STEPS=${QUALITY_STEPS:-100}
BATCH=${QUALITY_BATCH:-4}
SEQ=${QUALITY_SEQ:-256}
LR=${QUALITY_LR:-1e-4}
WARMUP=${QUALITY_WARMUP:-10}
SEED=${QUALITY_SEED:-1}
EVAL_BATCHES=${QUALITY_EVAL_BATCHES:-16}
if [ -z "${QUALITY_BACKEND:-}" ]; then
  if command -v nvidia-smi >/dev/null 2>&1; then QUALITY_BACKEND=cuda; else QUALITY_BACKEND=cpu; fi
fi
[ "$QUALITY_BACKEND" = cuda ] && TRAIN_ARGS=${QUALITY_TRAIN_ARGS---gpu-mem 24G --cpu-mem 40G} \
  || TRAIN_ARGS=${QUALITY_TRAIN_ARGS:-}
DIR=${QUALITY_DIR:-$BUILD/bench-quality}
KEEP=${QUALITY_KEEP:-0}
first=${FORMATS%% *}
[ "$first" = fp32 ] || { echo "bench_optim_quality: QUALITY_FORMATS must start with fp32 (got '$FORMATS')" >&2; exit 1; }

rm -rf "$DIR"; mkdir -p "$DIR"
"$L" prepare --out "$DIR/data.tok" tests/fixtures/sample.txt > "$DIR/prepare.log" 2>&1 \
  || { cat "$DIR/prepare.log" >&2; exit 1; }
declare -A eval_loss first_loss secs
for f in $FORMATS; do
  run=$DIR/$f
  # shellcheck disable=SC2086 # the model options are words
  "$L" init --run-dir "$run" $MODEL --seed "$SEED" --optim-state "$f" > "$DIR/init-$f.log" 2>&1 \
    || { echo "bench_optim_quality: init $f failed:" >&2; tail -5 "$DIR/init-$f.log" >&2; exit 1; }
  t0=$(date +%s)
  # shellcheck disable=SC2086
  "$L" train --run-dir "$run" --data "$DIR/data.tok" --steps "$STEPS" --batch "$BATCH" --seq "$SEQ" \
    --lr "$LR" --warmup "$WARMUP" --eval-every "$STEPS" --eval-batches "$EVAL_BATCHES" \
    --checkpoint-every 0 --clip-grad-norm 0 --backend "$QUALITY_BACKEND" $TRAIN_ARGS \
    > "$DIR/train-$f.log" 2>&1 \
    || { echo "bench_optim_quality: train $f failed:" >&2; tail -5 "$DIR/train-$f.log" >&2; exit 1; }
  secs[$f]=$(( $(date +%s) - t0 ))
  eval_loss[$f]=$(grep -o '"eval_loss": [-0-9.e+]*' "$run/metrics.jsonl" | tail -1 | cut -d' ' -f2)
  first_loss[$f]=$(grep -o '"loss": [-0-9.e+]*' "$run/metrics.jsonl" | head -1 | cut -d' ' -f2)
  [ -n "${eval_loss[$f]}" ] || { echo "bench_optim_quality: no held-out loss in $run/metrics.jsonl" >&2; exit 1; }
  [ "$KEEP" = 1 ] || rm -rf "$run/store"
done

others=""
for f in $FORMATS; do [ "$f" = fp32 ] || others="${others:+$others,}$DIR/$f"; done
if [ -n "$others" ] && command -v gnuplot >/dev/null 2>&1; then
  "$L" report --run-dir "$DIR/fp32" --compare "$others" --out "$DIR/charts" > "$DIR/report.log" 2>&1 \
    && echo "curves: $DIR/charts/loss.png" || echo "report --compare failed: $DIR/report.log"
fi

echo "model: $MODEL; $STEPS steps of B$BATCH T$SEQ at lr $LR (warmup $WARMUP), seed $SEED, backend $QUALITY_BACKEND"
printf '%-6s %12s %16s %12s %8s\n' format first-loss held-out-loss vs-fp32 seconds
for f in $FORMATS; do
  rel=$(echo "${eval_loss[$f]} ${eval_loss[fp32]}" | awk '{printf "%+.2f%%", 100 * ($1 - $2) / $2}')
  printf '%-6s %12.4f %16.4f %12s %8.0f\n' "$f" "${first_loss[$f]}" "${eval_loss[$f]}" "$rel" "${secs[$f]}"
done
