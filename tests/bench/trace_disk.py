#!/usr/bin/env python3
"""How the disk ran in each phase of the training steps, from a trace that
`fuyou-launch train --trace FILE` wrote: per step, the forward (from the step's first gpu request
to the end of its head) and the backward (from there to the next step's first gpu request), each
with its length, the bytes read and written, the time the disk had a read or a write in flight
(the union of the requests' spans), the rates over those times, and the share of the phase with
no request in flight. A step whose updates wait for the next forward (one-pass clipping of
streamed state) moves its state in that forward; this shows whether the disk runs as fast there.

Usage: trace_disk.py TRACE [FIRST_STEP]   (default: every step but the first and the last)
Exit status 0, or 1 for a trace without whole steps."""
import json
import sys

IO_TRACK, GPU_TRACK = 1, 2


def union_s(spans, lo, hi):
    """Seconds of [lo, hi) covered by at least one span (start, end), all in microseconds."""
    covered, end = 0.0, lo
    for s, e in sorted(spans):
        s, e = max(s, end), min(e, hi)
        if e > s:
            covered += e - s
            end = e
    return covered * 1e-6


def phase(io, lo, hi):
    """(bytes read, read s, bytes written, write s, idle share) of the requests starting in [lo, hi)."""
    inside = [e for e in io if lo <= e["ts"] < hi]
    reads = [e for e in inside if e["name"] == "io-read"]
    writes = [e for e in inside if e["name"] == "io-write"]
    span = lambda es: [(e["ts"], e["ts"] + e["dur"]) for e in es]
    rd_s, wr_s = union_s(span(reads), lo, hi), union_s(span(writes), lo, hi)
    busy = union_s(span(reads) + span(writes), lo, hi)
    total = lambda es: sum(e["args"].get("bytes", 0) for e in es)
    return total(reads), rd_s, total(writes), wr_s, 1 - busy / ((hi - lo) * 1e-6)


def main():
    if len(sys.argv) < 2:
        print(__doc__.strip().split("\n\n")[-1])
        return 1
    events = [e for e in json.load(open(sys.argv[1])) if e.get("ph") == "X"]
    io = [e for e in events if e["tid"] == IO_TRACK]
    gpu = [e for e in events if e["tid"] == GPU_TRACK]
    starts, heads = {}, {}
    for e in gpu:
        st = e["args"]["step"]
        starts[st] = min(starts.get(st, e["ts"]), e["ts"])
        if e["name"] == "gpt-head":
            heads[st] = max(heads.get(st, 0), e["ts"] + e["dur"])
    steps = sorted(st for st in heads if st + 1 in starts)
    first = int(sys.argv[2]) if len(sys.argv) > 2 else (steps[1] if len(steps) > 1 else None)
    steps = [st for st in steps if first is not None and st >= first]
    if not steps:
        print("no whole steps in %s" % sys.argv[1])
        return 1
    rate = lambda b, s: "%6.2f" % (b / s * 1e-9) if s > 0 else "     -"
    print("%4s %-8s %7s %8s %8s %6s %8s %8s %6s %6s" % ("step", "phase", "s", "read GB",
          "read s", "GB/s", "write GB", "write s", "GB/s", "idle"))
    for st in steps:
        for name, lo, hi in (("forward", starts[st], heads[st]),
                             ("backward", heads[st], starts[st + 1])):
            rb, rs, wb, ws, idle = phase(io, lo, hi)
            print("%4d %-8s %7.3f %8.3f %8.3f %s %8.3f %8.3f %s %5.1f%%" % (
                st, name, (hi - lo) * 1e-6, rb * 1e-9, rs, rate(rb, rs), wb * 1e-9, ws,
                rate(wb, ws), 100 * idle))
    return 0


if __name__ == "__main__":
    sys.exit(main())
