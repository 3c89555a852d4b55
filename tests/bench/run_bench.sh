#!/bin/bash
# make bench: the io engine against fio (same file, 1 MiB blocks, QD 32) and AdamW against a plain
# memory copy, each measured side by side in one run. Tables last.
set -u
BUILD=${BUILD:-build}
status=0
echo "=== AdamW vs memory copy (bench_adamw)"
"$BUILD/bench/bench_adamw" ${FUYOU_BENCH_ADAMW_ARGS:-} || status=1
echo "=== io engine vs fio (bench_io.sh)"
BUILD=$BUILD tests/bench/bench_io.sh || status=1
exit $status
