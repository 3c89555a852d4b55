#!/bin/bash
# make bench-gpu: GPT forward + backward with all weights resident on the GPU, ours and PyTorch's
# side by side on the same configs (GPT-3-style 1.3B and 2.7B, B 16, T 1024, V 50304); a table last.
set -u
BUILD=${BUILD:-build}
out=$(mktemp)
run() { # name layers embd heads
  python3 tests/bench/bench_gpu_torch.py --name $1 --layers $2 --embd $3 --heads $4 | tee -a $out
  "$BUILD/bench/bench_gpu" --name $1 --layers $2 --embd $3 --heads $4 ${PROFILE:+--profile} | tee -a $out
}
run 1.3B 24 2048 16
run 2.7B 32 2560 32
echo
echo "TFLOP/s; Fuyou with the blocks' internals kept (as PyTorch keeps them), and recomputed in backward"
echo "config  PyTorch  Fuyou  ratio  Fuyou-recompute  ratio"
for c in 1.3B 2.7B; do
  tf() { grep "^$1 *$c " $out | grep -o '[0-9.]* TFLOP/s' | cut -d' ' -f1; }
  p=$(tf pytorch); f=$(tf fuyou); r=$(tf fuyou-r)
  [ -n "$p" ] && [ -n "$f" ] && [ -n "$r" ] &&
    awk -v c=$c -v p=$p -v f=$f -v r=$r 'BEGIN{printf "%-7s %7.1f %6.1f %6.2f %16.1f %6.2f\n", c, p, f, f/p, r, r/p}'
done
rm -f $out
# Packed documents: at T 4096, rows packed with documents of 256-1024 tokens against plain causal
# rows of the same B and T, one block's forward + backward and a whole step side by side (the
# attention skips the key blocks the documents' mask leaves empty: packed / causal <= 1).
echo
"$BUILD/bench/bench_gpu" --name packed --layers 4 --embd 2048 --heads 16 --batch 8 --seq 4096 \
  --mode kept --packed 256-1024
