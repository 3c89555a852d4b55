#!/bin/bash
# Sequential bandwidth of fio's io_uring engine and of Fuyou's ring (bench_io) side by side, on
# the same file and settings, alternating rounds so drift in the device hits both alike (fio's
# column is left out where fio is not installed). Then Fuyou's ring in the patterns the io worker
# sees: a short burst (the size the launcher's profile moves), reads and writes taking turns chunk
# by chunk back to back (the overlapped schedule), and the same with the disk idle between chunks
# (the serial schedule): a virtual disk's rates depend on them, and drift over minutes.
# Run from the repository root: BUILD=build tests/bench/bench_io.sh
set -euo pipefail
BUILD=${BUILD:-build}
BIN=$BUILD/bench/bench_io
DIR=${FUYOU_BENCH_DIR:-$BUILD/bench-data}
SIZE=${FUYOU_BENCH_IO_SIZE:-4G}
SECS=${FUYOU_BENCH_IO_SECONDS:-5}
ROUNDS=${FUYOU_BENCH_IO_ROUNDS:-3}
BS=1M
QD=32

if [ ! -x "$BIN" ]; then
  echo "bench_io.sh: $BIN not found: build it first (make benches)" >&2
  exit 1
fi
CHUNK=${FUYOU_BENCH_IO_CHUNK:-512M}
GAP_MS=${FUYOU_BENCH_IO_GAP_MS:-200}
HAVE_FIO=1
if ! command -v fio >/dev/null; then
  echo "bench_io.sh: fio is not installed (apt-get install fio): its column is left out"
  HAVE_FIO=0
fi
mkdir -p "$DIR"
FILE=$DIR/fuyou-bench-io.dat
FIO_OUT=$DIR/fuyou-bench-io.json
trap 'rm -f "$FILE" "$FIO_OUT"' EXIT

fio_gbps() { # direction
  fio --name=fuyou-bench --ioengine=io_uring --direct=1 --bs=$BS --iodepth=$QD --rw="$1" \
      --fixedbufs=1 --registerfiles=1 --size="$SIZE" --filename="$FILE" --numjobs=1 \
      --time_based --runtime="$SECS" --output-format=json --output="$FIO_OUT" >/dev/null
  python3 -c 'import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0][sys.argv[2]]
print("%.3f" % (j["bw_bytes"] / 1e9))' "$FIO_OUT" "$1"
}

fuyou_gbps() { # direction
  "$BIN" --file "$FILE" --size "$SIZE" --block $BS --qd $QD --rw "$1" --seconds "$SECS" |
    sed -n 's/.*GBps=\([0-9.]*\).*/\1/p'
}

median() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }

echo "laying out $FILE ($SIZE)"
"$BIN" --file "$FILE" --size "$SIZE" --block $BS --qd $QD --rw write --seconds 0 >/dev/null

declare -A FIO FY
for dir in read write; do
  f=() y=()
  for ((i = 1; i <= ROUNDS; i++)); do
    if ((HAVE_FIO)); then f+=("$(fio_gbps $dir)"); else f+=(-); fi
    y+=("$(fuyou_gbps $dir)")
    echo "round $i $dir: fio ${f[-1]} GB/s, fuyou ${y[-1]} GB/s"
  done
  if ((HAVE_FIO)); then FIO[$dir]=$(median "${f[@]}"); else FIO[$dir]=-; fi
  FY[$dir]=$(median "${y[@]}")
done

echo
printf '%-9s %10s %12s %7s   (bs=%s qd=%s size=%s, median of %d rounds of %ss)\n' \
  direction "fio GB/s" "fuyou GB/s" ratio $BS $QD "$SIZE" "$ROUNDS" "$SECS"
for dir in read write; do
  ratio=$(awk -v a="${FY[$dir]}" -v b="${FIO[$dir]}" \
          'BEGIN {b += 0; print (b > 0 ? sprintf("%.2f", a / b) : "-")}')
  printf '%-9s %10s %12s %7s\n' $dir "${FIO[$dir]}" "${FY[$dir]}" "$ratio"
done

# The patterns: a burst of 256 MiB each way (as the launcher's profile), then turns of $CHUNK.
rate() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p"; }
burst_w=$("$BIN" --file "$FILE" --size 256M --block $BS --qd $QD --rw write --seconds 0 | rate GBps)
burst_r=$("$BIN" --file "$FILE" --size 256M --block $BS --qd $QD --rw read --seconds 0 | rate GBps)
turns=$("$BIN" --file "$FILE" --size "$SIZE" --block $BS --qd $QD --rw alternate --chunk "$CHUNK" \
        --seconds "$SECS")
idle=$("$BIN" --file "$FILE" --size "$SIZE" --block $BS --qd $QD --rw alternate --chunk "$CHUNK" \
       --gap-ms "$GAP_MS" --seconds "$SECS")
echo
printf '%-44s %10s %11s\n' "pattern (fuyou's ring)" "read GB/s" "write GB/s"
printf '%-44s %10s %11s\n' "burst, 256 MiB" "$burst_r" "$burst_w"
printf '%-44s %10s %11s\n' "sustained, ${SECS}s (median above)" "${FY[read]}" "${FY[write]}"
printf '%-44s %10s %11s\n' "turns of $CHUNK, back to back" "$(rate read_GBps <<<"$turns")" \
  "$(rate write_GBps <<<"$turns")"
printf '%-44s %10s %11s\n' "turns of $CHUNK, ${GAP_MS} ms idle between" \
  "$(rate read_GBps <<<"$idle")" "$(rate write_GBps <<<"$idle")"
