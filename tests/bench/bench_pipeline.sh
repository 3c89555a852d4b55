#!/bin/bash
# make bench-pipeline (GPU machine): whole training steps through the worker processes on a
# GPT-3-style model, with the optimizer state in host memory (a: --cpu-mem above the state size)
# and streamed from the SSD store (b: --cpu-mem well below it), under --gpu-mem 24G, in the
# overlapped and serial schedules, and with the gpu worker completing one request at a time
# (FUYOU_GPU_QUEUE=1) beside its default of two in flight. A table last: per run the median over
# the timed steps (the first step warms up and is left out) of step time, model TFLOP/s, GPU idle
# fraction and per-resource busy times (gpu worker, its copies to and from the GPU, SSD reads and
# writes, AdamW), beside the step the run's activation plan predicted at its start ("over": the
# prediction's excess over the measured step) and the SSD read/write rates behind that prediction
# (GB/s) with where they came from ("from": the profile's 256 MiB sample, or, with --step-rates
# auto, the steps of the run before on the same store: the runs of one call share it), beside the
# rates the steps ran at (their bytes over the busy times): the disk drifts. The last step of each
# run also writes the resident state to the store and syncs it (a checkpoint) and is left out as
# well.
# Environment: PIPELINE_CONFIGS ("1.3B", or "1.3B 2.7B"; "350M" for quick looks; "qwen3-0.6B" and
# "llama3-8B-8L" for the Llama-like shapes), PIPELINE_BATCHES
# ("16 64"), PIPELINE_PLACEMENTS ("host ssd"), PIPELINE_SCHEDULES ("overlap serial"),
# PIPELINE_QUEUE1 (1: also the host placement with one request at a time), PIPELINE_FSDP2 (1: also PyTorch FSDP2 with CPU
# offload, tests/bench/fsdp2_offload.py, at the batches in PIPELINE_FSDP2_BATCHES, "16"),
# PIPELINE_STEPS (timed steps per run, 2), PIPELINE_SSD_STEPS and PIPELINE_SSD_BATCHES (the same for
# the SSD placement, whose steps take far longer), PIPELINE_CKPT (--ckpt-place for every run),
# PIPELINE_GRAD_SLOTS (--grad-slots values, each run in turn for the host placement),
# PIPELINE_STATE_COPIES (init --state-copies: 2, or 1 where two copies of a model's state do not
# fit the disk, as 2.7B on the 64 GiB GPU machine), PIPELINE_OPTIM_STATES (init --optim-state
# values, each on a store of its own, in turn: "fp32"; the config column names the others, as
# 1.3B-int8),
# PIPELINE_ACT_PLANS (--act-plan values, each run in turn; default auto), PIPELINE_CLIP_MODES
# (clipping, each in turn for every schedule and act plan: none (--clip-grad-norm 0), auto,
# one-pass, two-pass; default
# none; the config column names the clipped ones, as 1.3B-one-pass), PIPELINE_GPUS (--gpus values,
# each in turn: "1 2" runs one GPU and two side by side; the config column names N > 1 as
# 1.3B-g2), with PIPELINE_CLIP_NORM (the
# bound, 1: transformers' default, which clips every step of these runs), PIPELINE_RUNS (instead of
# every combination of the lists above, these runs in order, clipped as train is by default unless
# PIPELINE_TRAIN_ARGS says --clip-grad-norm 0, each B/PLACEMENT/SCHEDULE/ACT_PLAN
# with an optional /AFFINITY (--affinity, default auto) and /WEIGHTS (--weights-dtype, default
# auto), e.g. "16/host/overlap/auto 16/host/overlap/auto/gpu=0,io=0,opt=0-7
# 16/host/overlap/auto/auto/f32 64/ssd/overlap/recompute"); the wts column says which weights the
# GPU was sent (bf16 copies for every kept unit, some, or f32), PIPELINE_ACT_GIB (GiB of
# --cpu-mem beyond the placement's own for swapped activations; 0), PIPELINE_CPU_MEM (one --cpu-mem
# for every run instead, e.g. 14G: a budget below the state's size whatever the batch, for the
# largest batch of each act plan), PIPELINE_TRAIN_ARGS (more train options for every run, e.g.
# "--act-ahead 4"), PIPELINE_LOG_DIR (each run's
# launcher log copied there, a failed run's too; made if missing), FUYOU_BENCH_DIR (where
# the store goes; removed afterwards). The bound column is the largest of the per-resource busy
# times measured in the run and the compute time of the same step with every weight resident
# (bench_gpu; 0 on the CPU backend), and for a clipped run at least the backward's GPU time (the
# bwd column) plus AdamW's, which a clipped step cannot overlap; PIPELINE_TRACE_DIR (a Chrome
# trace per run there); for a smoke test anywhere: PIPELINE_CONFIGS=tiny PIPELINE_SEQ=32
# PIPELINE_BACKEND=cpu.
set -u
BUILD=${BUILD:-build}
L=$BUILD/bin/fuyou-launch
STEPS=${PIPELINE_STEPS:-2}
SEQ=${PIPELINE_SEQ:-1024}
BACKEND=${PIPELINE_BACKEND:-cuda}
work=${FUYOU_BENCH_DIR:-/tmp/fuyou-bench-pipeline}
rm -rf "$work" && mkdir -p "$work" || exit 1
trap 'rm -rf "$work"' EXIT
table=$work/table
row_format="%-5s %3s %-5s %-8s %-9s %-6s %-6s %-5s %9s %9s %7s %8s %7s %8s %8s %8s %8s %8s %8s %8s %8s %7s %-9s %-7s %-9s %s\n"
printf "$row_format" config B place schedule act-plan queue gslots wts "step s" "predicted" over \
  "TFLOP/s" "gpu idle" \
  "gpu s" "bwd s" "h2d s" "d2h s" "ssd rd s" "ssd wr s" "opt s" "bound s" "x bound" "disk GB/s" from "in steps" \
  affinity \
  >"$table"
[ -n "${PIPELINE_LOG_DIR:-}" ] && { mkdir -p "$PIPELINE_LOG_DIR" || exit 1; }
"$L" prepare --out "$work/data.tok" tests/fixtures/sample.txt >/dev/null 2>&1 || exit 1

# run NAME CONFIG B PLACE SCHEDULE QUEUE CPU_MEM [GRAD_SLOTS [ACT_PLAN [AFFINITY [WEIGHTS]]]]:
# STEPS+1 more steps on the config's store
run() {
  local cfg=$2 B=$3 place=$4 sched=$5 queue=$6 mem=$7 gslots=${8:-} plan=${9:-auto}
  local affinity=${10:-auto} weights=${11:-auto}
  local dir=$work/run-$cfg done_steps steps=$STEPS
  [ "$place" = ssd ] && steps=${PIPELINE_SSD_STEPS:-$STEPS}
  done_steps=$(cat "$dir/steps" 2>/dev/null || echo 0)
  local total=$((done_steps + steps + 2))
  # a mode given twice (PIPELINE_CLIP_MODES="none auto none auto") runs again: its log and trace
  # get the names NAME-2, NAME-3, ...
  local name=$1 k=2
  while [ -e "$work/$name.log" ]; do name=$1-$k; k=$((k + 1)); done
  local log=$work/$name.log
  FUYOU_GPU_QUEUE=$queue "$L" train --run-dir "$dir" --data "$work/data.tok" --steps $total \
    --batch "$B" --seq "$SEQ" --lr 1e-4 --warmup 1 --eval-every 0 --checkpoint-every 0 \
    --backend "$BACKEND" --gpu-mem 24G --cpu-mem "$mem" --schedule "$sched" \
    ${PIPELINE_CKPT:+--ckpt-place "$PIPELINE_CKPT"} ${gslots:+--grad-slots "$gslots"} --act-plan "$plan" \
    --affinity "$affinity" --weights-dtype "$weights" \
    ${PIPELINE_TRACE_DIR:+--trace "$PIPELINE_TRACE_DIR/$name.json"} ${CLIP_ARGS:-} \
    ${PIPELINE_TRAIN_ARGS:-} >"$log" 2>&1
  local rc=$?
  [ -n "${PIPELINE_LOG_DIR:-}" ] && cp "$log" "$PIPELINE_LOG_DIR/"
  [ $rc = 0 ] ||
    { echo "run $name failed:"; grep -E " error: " "$log" | head -3; tail -3 "$log"; return 1; }
  echo $total >"$dir/steps"
  grep -E "plan|resident|state of|blocks kept" "$log" | head -4 | cut -c1-200
  grep -E "plan: activations|plan: auto|predicted step|layers on gpu|profiled one block" "$log" |
    cut -c1-320
  # the gradient slots the plan gave (--grad-slots cut to what --cpu-mem holds)
  local held
  held=$(grep -o "[0-9]* block gradients in the pool at once" "$log" | head -1 | cut -d' ' -f1)
  # the weights the GPU was sent: bf16 (every kept unit's copy), bf16- (some), f32
  local wts=f32
  if grep -q "weights to the GPU in bf16" "$log"; then
    wts=bf16
    grep -q "no more copies" "$log" && wts=bf16-
  fi
  # the step the plan predicted at the run's start, and the SSD rates (read/write) it assumed, as
  # the plan check gives them, with their source; without a plan check, the profile's sample; "-"
  # where the run printed neither
  local pred plan_disk disk_from
  pred=$(grep -o "predicts from this machine's profile: [0-9.]* s" "$log" | head -1 |
    grep -o "[0-9.]* s$" | cut -d' ' -f1)
  # "the plan's: R and W, from the profile" or "..., from the last session's steps"
  read -r plan_disk disk_from < <(grep -o "the plan's: [0-9.]* and [0-9.]*, from the [a-z]*" \
    "$log" | head -1 | awk '{sub(",", "", $5); print $3 "/" $5, ($8 == "last" ? "steps" : $8)}')
  [ -n "$plan_disk" ] || {
    disk_from=profile
    plan_disk=$(grep -o "the SSD store [0-9.]* GB/s written, [0-9.]* read" "$log" | head -1 |
      awk '{print $7 "/" $4}')
  }
  # median over the timed steps of each field
  tail -n $((steps + 1)) "$dir/metrics.jsonl" | head -n "$steps" |
    COMPUTE_S=${COMPUTE_S:-0} PRED_S=${pred:-0} python3 -c '
import json, statistics, sys
rows = [json.loads(l) for l in sys.stdin if l.strip()]
m = lambda k: statistics.median(r[k] for r in rows)
import os
# the bound: the busiest resource, each measured in this run except the compute, which is the same
# step with every weight resident (bench_gpu, blocks recomputed as this path does); reads and
# writes share the disk
bound = max(float(os.environ["COMPUTE_S"]), m("busy_h2d_s"), m("busy_d2h_s"),
            m("busy_ssd_read_s") + m("busy_ssd_write_s"), m("busy_opt_s"))
# a clipped step (its metrics carry the norm) cannot update before its whole backward is done:
# its bound is at least the GPU time of the backward and then that of AdamW
bwd = m("busy_gpu_backward_s") if "busy_gpu_backward_s" in rows[0] else 0.0
if "grad_norm" in rows[0]:
    bound = max(bound, bwd + m("busy_opt_s"))
# the prediction against the measured step: its excess as a share of the step (negative: short)
pred = float(os.environ["PRED_S"])
over = "%+.1f%%" % (100 * (pred / m("step_s") - 1)) if pred > 0 and m("step_s") > 0 else "-"
# the rates the disk ran at in the steps: the bytes the io worker moved over its busy times
rate = lambda b, s: "%.2f" % (m(b) / m(s) * 1e-9) if m(s) > 0 else "-"
steps_disk = rate("ssd_read_bytes", "busy_ssd_read_s") + "/" + rate("ssd_write_bytes",
                                                                     "busy_ssd_write_s")
print("%.3f %s %s %.1f %.1f%% %.3f %.3f %.3f %.3f %.3f %.3f %.3f %.3f %.2f %s" % (m("step_s"),
      "%.3f" % pred if pred > 0 else "-", over, m("tflops"), 100 * m("gpu_idle"),
      m("busy_gpu_s"), bwd, m("busy_h2d_s"), m("busy_d2h_s"), m("busy_ssd_read_s"),
      m("busy_ssd_write_s"), m("busy_opt_s"), bound, m("step_s") / bound if bound > 0 else 0,
      steps_disk))' |
    while read -r s pr ov tf idle g bwd up down r w o bd x steps_disk; do
      printf "$row_format" "$cfg${CLIP_LABEL:+-$CLIP_LABEL}" "$B" "$place" "$sched" "$plan" \
        "$([ "$queue" = 1 ] && echo 1 || echo 2)" "$held" "$wts" "$s" "$pr" "$ov" "$tf" "$idle" \
        "$g" "$bwd" "$up" "$down" "$r" "$w" "$o" "$bd" "$x" "${plan_disk:--}" \
        "$([ -n "$plan_disk" ] && echo $disk_from || echo -)" "$steps_disk" "$affinity" |
        tee -a "$table"
    done
}

for cfg in ${PIPELINE_CONFIGS:-1.3B}; do
  # GiB: optimizer state with the bf16 weight copies, the streaming slots (12 of the largest unit,
  # the embeddings), the fp32 activations per sequence of the batch; (a) holds all three and 5 GiB
  # (room for the block gradient slots that let the optimizer lag the backward), (b) the last two
  # and 1 GiB
  case $cfg in
    350M) model="--layers 24 --heads 16 --embd 1024"; state=5; slots=2; act=0.11 ;;
    1.3B) model="--layers 24 --heads 16 --embd 2048"; state=19; slots=5; act=0.21 ;;
    2.7B) model="--layers 32 --heads 32 --embd 2560"; state=37; slots=7; act=0.35 ;;
    # the shapes people fine-tune: Qwen3-0.6B, and Llama-3-8B's blocks (8 of its 32, so that the
    # state fits the GPU machine's disk and memory; random weights)
    qwen3-0.6B) model="--arch qwen3 --layers 28 --heads 16 --kv-heads 8 --embd 1024 --head-dim 128
      --ffn 3072 --vocab 151936 --tied --rope-theta 1000000 --rms-eps 1e-6"
      state=9; slots=3; act=0.25 ;;
    llama3-8B-8L) model="--arch llama --layers 8 --heads 32 --kv-heads 8 --embd 4096 --ffn 14336
      --vocab 128256 --rope-theta 500000"
      state=40; slots=8; act=0.5 ;;
    tiny) model="--layers 2 --heads 4 --embd 64"; state=0.05; slots=0.04; act=0.001 ;; # smoke test
    *) echo "unknown config $cfg"; exit 2 ;;
  esac
  case $model in *--vocab*) vocab="" ;; *) vocab="--vocab 50304" ;; esac
  for fmt in ${PIPELINE_OPTIM_STATES:-fp32}; do
  # each optimizer state format on a store of its own, named in the config column beside fp32's
  label=$cfg
  [ "$fmt" = fp32 ] || label=$cfg-$fmt
  t0=$(date +%s)
  "$L" init --run-dir "$work/run-$label" $model $vocab --ctx "$SEQ" --seed 1 \
    --state-copies "${PIPELINE_STATE_COPIES:-2}" --optim-state "$fmt" \
    >"$work/init-$label.log" 2>&1 || { tail -5 "$work/init-$label.log"; exit 1; }
  echo "init $label: $(( $(date +%s) - t0 )) s"
  # the compute time of the same step with every weight resident on the GPU, blocks recomputed
  # (the bound below: the pipeline's own work when it keeps nothing) and every block's internals
  # kept (all on the GPU, no budget: the throughput the pipeline is measured against); once a batch
  compute_for() {
    local B=$1 ms kept
    COMPUTE_S=0
    [ "$BACKEND" = cuda ] || return 0
    # bench_gpu measures GPT blocks: the Llama-like shapes' bound is their busy times alone
    case $model in *--arch*) return 0 ;; esac
    [ -f "$work/compute-$cfg-$B" ] && { COMPUTE_S=$(cat "$work/compute-$cfg-$B"); return 0; }
    gpu() { "$BUILD/bench/bench_gpu" --name "$cfg" $model --vocab 50304 --seq "$SEQ" --batch "$B" \
              --iters 3 --mode "$1" 2>&1; }
    ms=$(gpu recompute | grep 'fuyou-r' | grep -o 'fwd+bwd [0-9.]* ms' | cut -d' ' -f2)
    # (every block's internals may not fit the device: then this says so)
    kept=$(gpu kept | grep -o 'fwd+bwd [0-9.]* ms.*TFLOP/s\|error.*' |
      sed 's/(median of [0-9]*) *//')
    [ -n "$ms" ] && COMPUTE_S=$(awk -v ms="$ms" 'BEGIN{print ms / 1000}')
    echo "$COMPUTE_S" >"$work/compute-$cfg-$B"
    echo "compute, all weights resident, blocks recomputed ($cfg, B $B): ${ms:-?} ms"
    # printed with the table at the end too
    echo "all on the GPU, every block's internals kept ($cfg, B $B): ${kept:-?}" |
      tee -a "$work/peers"
  }
  # --cpu-mem of a placement at batch B: GiB of optimizer state and weight copies, the streaming
  # slots (12 of the largest unit, the embeddings), the fp32 activations per sequence of the batch;
  # host holds all three and 5 GiB (room for the block gradient slots that let the optimizer lag
  # the backward), ssd the last two and 1 GiB
  mem_for() {
    [ -n "${PIPELINE_CPU_MEM:-}" ] && { echo "$PIPELINE_CPU_MEM"; return; }
    awk -v p=$1 -v s=$state -v k=$slots -v a=$act -v b=$2 -v x=${PIPELINE_ACT_GIB:-0} \
      'BEGIN{printf "%dM", 1024 * (x + (p == "host" ? s + k + a * b + 5 : k + a * b + 1))}'
  }
  if [ -n "${PIPELINE_RUNS:-}" ]; then
    # an explicit list of runs, each B/PLACE/SCHEDULE/ACT_PLAN, in order on one store
    for r in $PIPELINE_RUNS; do
      IFS=/ read -r B place sched plan affinity weights <<<"$r"
      compute_for "$B"; export COMPUTE_S
      run "$label-$B-$place-$sched-$plan${affinity:+-${affinity//[=,]/_}}${weights:+-$weights}" \
        "$label" "$B" "$place" "$sched" 2 "$(mem_for "$place" "$B")" "" "$plan" \
        "${affinity:-auto}" "${weights:-auto}"
    done
  else
    for B in ${PIPELINE_BATCHES:-16}; do
      compute_for "$B"
      export COMPUTE_S
      for place in ${PIPELINE_PLACEMENTS:-host ssd}; do
        # the SSD placement only at the batches in PIPELINE_SSD_BATCHES (default: all)
        [ "$place" = ssd ] && [ -n "${PIPELINE_SSD_BATCHES:-}" ] &&
          ! [[ " $PIPELINE_SSD_BATCHES " == *" $B "* ]] && continue
        mem=$(mem_for "$place" "$B")
        for gpus in ${PIPELINE_GPUS:-1}; do
        for clip in ${PIPELINE_CLIP_MODES:-none}; do
          # --clip-grad-norm (PIPELINE_CLIP_NORM) with each --clip-mode in turn; none: unclipped;
          # and --gpus N for each of PIPELINE_GPUS (the config column says gN for N > 1)
          CLIP_ARGS="--clip-grad-norm 0" CLIP_LABEL=""
          [ "$clip" = none ] ||
            CLIP_ARGS="--clip-grad-norm ${PIPELINE_CLIP_NORM:-1} --clip-mode $clip" CLIP_LABEL=$clip
          [ "$gpus" = 1 ] ||
            CLIP_ARGS="$CLIP_ARGS --gpus $gpus" CLIP_LABEL="g$gpus${CLIP_LABEL:+-$CLIP_LABEL}"
          for sched in ${PIPELINE_SCHEDULES:-overlap serial}; do
            for plan in ${PIPELINE_ACT_PLANS:-auto}; do
              run "$label-$B-$place-$sched-$plan${CLIP_LABEL:+-$CLIP_LABEL}" "$label" "$B" \
                "$place" "$sched" 2 "$mem" "" "$plan"
            done
          done
        done
        done
        CLIP_ARGS="" CLIP_LABEL=""
        if [ "$place" = host ]; then
          for gs in ${PIPELINE_GRAD_SLOTS:-}; do
            run "$label-$B-$place-overlap-g$gs" "$label" "$B" "$place" overlap 2 "$mem" "$gs"
          done
        fi
        [ "$place" = host ] && [ "${PIPELINE_QUEUE1:-1}" = 1 ] &&
          run "$label-$B-$place-overlap-q1" "$label" "$B" "$place" overlap 1 "$mem"
      done
    done
  fi
  rm -rf "$work/run-$label"
  done
  # the peer in the same run: PyTorch FSDP2 with CPU offload on this GPU, same model and formula
  if [ "$BACKEND" = cuda ] && [ "${PIPELINE_FSDP2:-1}" = 1 ] && [ "$cfg" != tiny ]; then
    for B in ${PIPELINE_FSDP2_BATCHES:-16}; do
      python3 tests/bench/fsdp2_offload.py --config "$cfg" --batch "$B" --seq "$SEQ" \
        --steps "$STEPS" >"$work/fsdp2-$cfg-$B.log" 2>&1
      line=$(grep '^fsdp2 ' "$work/fsdp2-$cfg-$B.log" | tail -1)
      [ -n "$line" ] || line="fsdp2 config=$cfg B=$B failed: $(tail -1 "$work/fsdp2-$cfg-$B.log")"
      echo "$line" | tee -a "$work/peers"
    done
  fi
done
echo
echo "medians over $STEPS timed steps; queue: GPT requests in flight in the gpu worker;"
echo "model TFLOP/s = (6 N B T + 6 L B T^2 C) / step time (recomputation not counted)"
cat "$table"
[ -f "$work/peers" ] && cat "$work/peers"
exit 0
