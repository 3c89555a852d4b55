#!/usr/bin/env python3
"""Where one training step's time went, from a trace that `fuyou-launch train --trace FILE` wrote:
the gpu worker's span and busy time, the optimizer's updates in the order they ran (unit, duration
and start in ms from the step's first gpu request), the optimizer's idle gaps with the gpu request
running meanwhile, and the gpu worker's own idle gaps with the request that ended each.

Usage: trace_gaps.py TRACE [STEP]   (default: the last step but one, which nothing cuts short)
Exit status 0, or 1 for a trace without the step."""
import json
import sys

GPU_TRACK, OPT_TRACK = 2, 3
OPT_GAP_US, GPU_GAP_US = 1000, 500


def load(path):
    return [e for e in json.load(open(path)) if e.get("ph") == "X"]


def label(e):
    """gpt-block-fwd 5 -> block-fwd5, opt-adamw 5 -> adamw5."""
    return "%s%d" % (e["name"].split("-", 1)[1], e["args"]["unit"])


def main():
    events = load(sys.argv[1])
    steps = sorted({e["args"]["step"] for e in events})
    step = int(sys.argv[2]) if len(sys.argv) > 2 else steps[-2] if len(steps) > 1 else steps[-1]
    gpu = sorted((e for e in events if e["tid"] == GPU_TRACK and e["args"]["step"] == step),
                 key=lambda e: e["ts"])
    if not gpu:
        print("no gpu requests of step %d in %s" % (step, sys.argv[1]))
        return 1
    t0 = gpu[0]["ts"]
    t1 = max(e["ts"] + e["dur"] for e in gpu)
    # the updates that ran while this step's gpu requests did, whichever step they belong to
    opt = sorted((e for e in events if e["tid"] == OPT_TRACK and t0 <= e["ts"] < t1),
                 key=lambda e: e["ts"])
    print("step %d: gpu span %.1f ms, gpu busy %.1f ms, %d gpu requests; optimizer busy %.1f ms"
          % (step, (t1 - t0) / 1e3, sum(e["dur"] for e in gpu) / 1e3, len(gpu),
             sum(e["dur"] for e in opt) / 1e3))
    print("updates (unit:ms@start): " + " ".join(
        "%d:%.1f@%.0f" % (e["args"]["unit"], e["dur"] / 1e3, (e["ts"] - t0) / 1e3) for e in opt))

    def running(t):
        return ",".join(label(e) for e in gpu if e["ts"] <= t < e["ts"] + e["dur"]) or "-"

    print("optimizer idle > %.0f ms (start, length, gpu request meanwhile):" % (OPT_GAP_US / 1e3))
    end = t0
    for e in opt + [{"ts": t1, "dur": 0}]:
        if e["ts"] - end > OPT_GAP_US:
            print("  %.1f +%.1f  %s" % ((end - t0) / 1e3, (e["ts"] - end) / 1e3,
                                        running((end + e["ts"]) / 2)))
        end = max(end, e["ts"] + e["dur"])
    print("gpu idle > %.1f ms (start, length, next request):" % (GPU_GAP_US / 1e3))
    end = t0
    for e in gpu:
        if e["ts"] - end > GPU_GAP_US:
            print("  %.1f +%.1f  before %s" % ((end - t0) / 1e3, (e["ts"] - end) / 1e3, label(e)))
        end = max(end, e["ts"] + e["dur"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
