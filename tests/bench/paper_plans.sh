#!/bin/bash
# The cost model at the Fuyou paper's scale (docs/benchmarks.md, "At the paper's scale, by the cost
# model"): fuyou-launch plan for GPT-3 13B and 175B, Llama-2-70B and Llama-3-70B on the machine
# profiles of docs/machines (the paper's RTX 4090 at our kernels' efficiency and at the paper's
# 156 TFLOP/s, an A100), at the batches and budgets of each row, one markdown table row a plan:
# whether it fits, what stays in the pool and what streams, the predicted step and rate, the bound
# and every resource's seconds. Nothing runs but plan; a CUDA build models the GPU's memory.
# PAPER_ROWS overrides the rows: "MODEL/PROFILE/GPU_MEM/CPU_MEM/FORMAT/BATCH ..." (BATCH "max": the
# largest that fits, from a plan at batch 1). Unclipped (--clip-grad-norm 0) unless PAPER_CLIP gives
# the norm: the paper's figures are throughputs, and a clipped step of a model whose gradients
# the pool cannot hold runs the backward twice.
set -u
BUILD=${BUILD:-build}
L=$BUILD/bin/fuyou-launch
[ -x "$L" ] || { echo "paper_plans.sh: $L not built (run make first)" >&2; exit 1; }
model() {
  case $1 in
    13B)  echo "--layers 40 --heads 40 --embd 5120 --vocab 50304 --ctx 2048" ;;
    175B) echo "--layers 96 --heads 96 --embd 12288 --vocab 50304 --ctx 2048" ;;
    llama2-70B) echo "--arch llama --layers 80 --heads 64 --kv-heads 8 --embd 8192 --ffn 28672 --vocab 32000 --ctx 4096" ;;
    llama3-70B) echo "--arch llama --layers 80 --heads 64 --kv-heads 8 --embd 8192 --ffn 28672 --vocab 128256 --ctx 8192 --rope-theta 500000" ;;
    *) echo "paper_plans.sh: unknown model $1" >&2; exit 1 ;;
  esac
}
rows=${PAPER_ROWS:-}
if [ -z "$rows" ]; then
  for m in 175B llama2-70B llama3-70B; do
    for mem in 720G 256G 128G; do
      for f in fp32 bf16 int8; do
        rows+=" $m/4090/24G/$mem/$f/16 $m/4090-gpu156/24G/$mem/$f/16"
      done
    done
  done
  for f in fp32 bf16 int8; do rows+=" 13B/4090/24G/720G/$f/max 13B/4090-gpu156/24G/720G/$f/max"; done
fi
printf '| model | profile | --gpu-mem | --cpu-mem | state | batch | fits | state kept / streamed | predicted step | TFLOP/s | bound | GPU / PCIe up / down / SSD / AdamW (s) |\n'
printf '|---|---|---|---|---|---|---|---|---|---|---|---|\n'
for r in $rows; do
  IFS=/ read -r m prof gmem cmem fmt batch <<<"$r"
  args="$(model "$m") --seq 1024 --clip-grad-norm ${PAPER_CLIP:-0} --backend cuda --gpu-mem $gmem --cpu-mem $cmem --optim-state $fmt --ckpt-place auto --machine docs/machines/fuyou-paper-$prof.json"
  if [ "$batch" = max ]; then
    # shellcheck disable=SC2086
    batch=$("$L" plan $args --batch 1 2>&1 | sed -n 's/.*largest batch that fits: \([0-9]*\).*/\1/p')
  fi
  # shellcheck disable=SC2086
  out=$("$L" plan $args --batch "$batch" 2>&1)
  fits=yes
  grep -q "DOES NOT FIT" <<<"$out" && fits="no: $(grep -o '[A-Za-z ]*: [^;]*DOES NOT FIT' <<<"$out" | head -1 | sed 's/plan: //; s/ (DOES NOT FIT//')"
  kept=$(sed -n 's/.*optimizer state \([^:]*\): \([0-9]* of [0-9]* units ([^)]*)\) stay.*rest (\([^)]*\)) streams.*/\2 \/ \3/p' <<<"$out" | head -1)
  [ -z "$kept" ] && kept=$(sed -n 's/.*optimizer state \([^:]*\): \([0-9]* of [0-9]* units ([^)]*)\) stay.*/\2, all kept/p' <<<"$out" | head -1)
  step=$(sed -n 's/.*predicted step \([0-9.]*\) s: [0-9]* tokens\/s, \([0-9.]*\) TFLOP\/s.*/\1 \2/p' <<<"$out" | head -1)
  secs=$(sed -n 's/.*predicted seconds per step: GPU compute \([0-9.]*\), PCIe to the GPU \([0-9.]*\), from it \([0-9.]*\), SSD \([0-9.]*\), optimizer \([0-9.]*\).*/\1 \2 \3 \4 \5/p' <<<"$out" | head -1)
  bound=$(sed -n 's/.*predicted seconds per step: .*bound: \(.*\)$/\1/p' <<<"$out" | head -1)
  read -r s_step s_rate <<<"$step"
  printf '| %s | %s | %s | %s | %s | %s | %s | %s | %.3f s | %s | %s | %s |\n' "$m" "$prof" "$gmem" \
    "$cmem" "$fmt" "$batch" "$fits" "$kept" "${s_step:-0}" "${s_rate:--}" "${bound:--}" \
    "$(awk '{printf "%.2f / %.2f / %.2f / %.2f / %.2f", $1, $2, $3, $4, $5}' <<<"$secs")"
done
