#!/bin/bash
# CI's sanitizer step, also run by hand: builds the programs and the chosen tests with
# make SANITIZE=$SANITIZE (default address,undefined: build-asan, without the CUDA backend) and
# runs them there. Any sanitizer report by any process fails the step: the workers the launcher
# starts are sanitized too and write their reports to files of their own ($BUILD/sanitizer/),
# which are printed at the end. SANITIZE=thread runs the unit tests that start threads of their
# own under ThreadSanitizer (build-tsan). Extra arguments replace the default list of programs.
set -u
cd "$(dirname "$0")/.."
SANITIZE=${SANITIZE:-address,undefined}
case $SANITIZE in
  *thread*) BUILD=${BUILD:-build-tsan} ;;
  *address*) BUILD=${BUILD:-build-asan} ;;
  *) BUILD=${BUILD:-build-san} ;;
esac
export BUILD

# Unit tests: every tests/test_*.c program but the three whose minutes go to arithmetic kernels
# that the others reach in smaller form (test_cu_flash_emu, the CUDA flash kernels emulated in
# C++; test_cpu_llama and test_packed_cpu, long gradient checks of the CPU kernels); within CI's
# budget for this step. Integration tests: the launcher's start and stop with the real workers
# (test_launch), the defaults of train and resume (test_train_defaults), and three cases of
# test_train (a run through the store, a stop by signal and its resume, refused inputs).
SLOW_UNITS="test_cu_flash_emu test_cpu_llama test_packed_cpu"
TRAIN_CASES=test_store_run_matches_inprocess,test_sigint_stops_at_a_step_boundary,test_bad_inputs_refused
train_cases=()
if [ $# -gt 0 ]; then
  programs=("$@")
elif [[ $SANITIZE == *thread* ]]; then
  # ThreadSanitizer: the tests of the thread pool and the channels; the programs' OpenMP regions
  # run in libgomp, which is not instrumented, so the kernels' tests would report its barriers.
  programs=("$BUILD/tests/test_threads" "$BUILD/tests/test_chan")
else
  programs=()
  for src in tests/test_*.c; do
    name=$(basename "$src" .c)
    [[ " $SLOW_UNITS " == *" $name "* ]] || programs+=("$BUILD/tests/$name")
  done
  programs+=("$BUILD/tests/integration/test_launch" "$BUILD/tests/integration/test_train_defaults")
  train_cases=("$BUILD/tests/integration/test_train")
fi

make -j"$(nproc)" SANITIZE="$SANITIZE" BUILD="$BUILD" all "${programs[@]}" "${train_cases[@]}" || exit 1

reports=$BUILD/sanitizer
rm -rf "$reports" && mkdir -p "$reports"
# halt_on_error: the first fault stops the process (the programs are built with
# -fno-sanitize-recover, so UBSan's too). Leaks are reported (at the exit of each process that
# exits normally; workers stopped by a signal are not checked). hwloc's PCI plugin is left out:
# libpciaccess, which it loads, leaks about 1 KiB at every topology load, and it is unloaded
# before the report, so no suppression can name it; the tests have no GPU whose PCI place matters.
export ASAN_OPTIONS=halt_on_error=1:abort_on_error=0:detect_leaks=1:log_path=$PWD/$reports/asan
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:log_path=$PWD/$reports/ubsan
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp:log_path=$PWD/$reports/tsan
export HWLOC_PLUGINS_BLACKLIST=hwloc_pci
tests/run_tests.sh "${programs[@]}"
rc=$?
if [ ${#train_cases[@]} -gt 0 ]; then
  FY_TEST_ONLY=$TRAIN_CASES tests/run_tests.sh "${train_cases[@]}" || rc=1
fi
if [ -n "$(ls -A "$reports")" ]; then
  for f in "$reports"/*; do echo "=== sanitizer report $f"; cat "$f"; done
  echo "sanitizer reports: $(ls "$reports" | wc -l) (above)"
  rc=1
fi
exit $rc
