#!/bin/bash
# GPU machine: the same small training on the CUDA and the CPU backends (through the worker
# processes), printing both loss trajectories side by side. bf16 on the GPU, fp32 on the CPU: the
# curves should agree to about 1e-2.
set -u
BUILD=${BUILD:-build}
L=$BUILD/bin/fuyou-launch
d=$(mktemp -d /tmp/fuyou-compare-XXXXXX)
$L prepare --out $d/s.tok tests/fixtures/sample.txt >/dev/null 2>&1 || exit 1
for b in cpu cuda; do
  $L init --run-dir $d/$b --layers 2 --heads 4 --embd 64 --ctx 64 --seed 3 >/dev/null 2>&1 || exit 1
  $L train --run-dir $d/$b --data $d/s.tok --steps ${STEPS:-20} --batch 8 --seq 64 --lr 3e-3 \
    --warmup 5 --eval-every 0 --eval-batches 4 --backend $b > $d/$b.log 2>&1 || { tail -20 $d/$b.log; exit 1; }
done
paste <(grep -o '"loss": [0-9.]*' $d/cpu/metrics.jsonl | cut -d' ' -f2) \
      <(grep -o '"loss": [0-9.]*' $d/cuda/metrics.jsonl | cut -d' ' -f2) |
  awk 'BEGIN{print "step   cpu      cuda     rel.diff"} {d=($2-$1)/$1; if(d<0)d=-d; if(d>m)m=d; printf "%4d  %.5f  %.5f  %.2e\n", NR, $1, $2, d} END{printf "max relative difference %.3e\n", m}'
grep -E "GPU arena|backend cuda" $d/cuda/fuyou.log | head -3 | cut -c1-200
rm -rf $d
