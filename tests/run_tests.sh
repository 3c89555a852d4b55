#!/bin/bash
# Runs each test program given as an argument, each with a time limit, and prints one summary line.
# A program that exits 77 skipped (it says why); any other non-zero exit is a failure.
set -u
passed=0; failed=0; skipped=0; failed_names=()
limit=${FUYOU_TEST_TIMEOUT:-600}
for t in "$@"; do
  name=${t#"${BUILD:-build}"/tests/}
  echo "=== $name"
  timeout --kill-after=10 "$limit" "$t"
  rc=$?
  if [ $rc -eq 0 ]; then passed=$((passed+1));
  elif [ $rc -eq 77 ]; then skipped=$((skipped+1)); echo "--- $name: skipped";
  else failed=$((failed+1)); failed_names+=("$name"); echo "--- $name: FAILED (exit $rc)"; fi
done
[ $failed -gt 0 ] && echo "failed programs: ${failed_names[*]}"
echo "tests: $passed passed, $failed failed, $skipped skipped"
[ $failed -eq 0 ]
