"""Checks a training trace (Chrome trace-event JSON from `fuyou-launch train --trace`) for updates
sent lowest unit first while the backward still runs: a pair of blocks a < b in one step whose
gradients came home b first, and a's update began before b's, while the step's backward was still
running. Sending in arrival order can reorder updates only after the backward. Usage: python3
trace_edf.py TRACE; exit status 0 when such a pair exists."""
import json
import sys


def main():
    bwd_end, upd_start, last_bwd = {}, {}, {}
    for e in json.load(open(sys.argv[1])):
        if e.get("ph") != "X":
            continue
        step, unit = e["args"]["step"], e["args"]["unit"]
        end = e["ts"] + e["dur"]
        if e["name"] == "gpt-block-bwd":
            bwd_end[(step, unit)] = end
            last_bwd[step] = max(last_bwd.get(step, 0), end)
        elif e["name"] == "opt-adamw" and unit >= 1:
            upd_start[(step, unit)] = e["ts"]
    pairs = [(s, a, b) for (s, a) in upd_start for (t, b) in upd_start
             if s == t and a < b and (s, a) in bwd_end and (s, b) in bwd_end
             and bwd_end[(s, b)] < bwd_end[(s, a)] and upd_start[(s, a)] < upd_start[(s, b)]
             and upd_start[(s, a)] < last_bwd[s]]
    print("%d pairs of blocks updated lower first while the backward ran (%s)"
          % (len(pairs), sorted(pairs)[:5]))
    return 0 if pairs else 1


if __name__ == "__main__":
    sys.exit(main())
