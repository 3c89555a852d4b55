#!/bin/bash
# One call on the GPU machine: build (CUDA included), run the whole test suite, the GPU tests, the
# data-path self-test on the CUDA backend, and the benchmarks; a short table last. Logs go to $OUT.
# Usage there: source .device/env.sh && tests/gpu/device_run.sh
# That machine has no xxhash.h (Debian's libxxhash-dev, used header-only): unpack the package into
# .device/xxhash here first (apt-get download libxxhash-dev && dpkg -x libxxhash-dev_*.deb
# .device/xxhash); it is put on CPATH below.
set -u
OUT=${OUT:-/tmp/fuyou-device}
mkdir -p "$OUT"
export PATH=$PWD/.device/bin:$PATH
xxh=$PWD/.device/xxhash/usr/include
[ -d "$xxh" ] && export CPATH=$xxh${CPATH:+:$CPATH}
jobs=$(nproc)
if ! make -j"$jobs" all tests benches build/tests/gpu/test_cuda_backend >"$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"; exit 1
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
lscpu | grep -E "Model name|^CPU\(s\)|Flags" | sed 's/\(Flags:\).*\(avx512f\).*/\1 ... \2 .../' | tee "$OUT/cpu.txt"
make test >"$OUT/test.log" 2>&1; test_rc=$?
make test-gpu >"$OUT/test-gpu.log" 2>&1; gpu_rc=$?
run=/tmp/fuyou-device-run ssd=${FUYOU_BENCH_DIR:-/tmp/fuyou-device-ssd}
rm -rf "$run" "$ssd" && mkdir -p "$ssd"
build/bin/fuyou-launch selftest --run-dir "$run" --ssd "$ssd" --params "${FUYOU_SELFTEST_PARAMS:-256M}" \
  --steps 4 --backend cuda --gpu-mem 1G >"$OUT/selftest.log" 2>&1; self_rc=$?
rm -rf "$run" "$ssd"
FUYOU_BENCH_IO_SIZE=${FUYOU_BENCH_IO_SIZE:-8G} make bench >"$OUT/bench.log" 2>&1; bench_rc=$?
echo "=== make test";        grep -E "^tests:|FAILED|failed programs" "$OUT/test.log"
echo "=== make test-gpu";    grep -E "identical|SKIPPED|PASSED|FAILED|^tests:" "$OUT/test-gpu.log"
echo "=== selftest (cuda)";  grep -E "backend|pinned|step [0-9]|passed|error" "$OUT/selftest.log" | cut -c1-220
echo "=== make bench";       tail -25 "$OUT/bench.log"
echo "exit codes: test $test_rc, test-gpu $gpu_rc, selftest $self_rc, bench $bench_rc"
