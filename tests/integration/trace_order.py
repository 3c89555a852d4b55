"""Checks a training trace (Chrome trace-event JSON from `fuyou-launch train --trace`) for the
overlapped schedule's ordering across steps: every unit's forward in step N+1 starts after that
unit's update in step N ended (the forward waits for its own unit), and at least one update of a
step ended after the next step's forward began (the forward did not wait for the whole optimizer).
Usage: python3 trace_order.py TRACE MIN_PAIRS [MIN_LATE]; exit status 0 when both hold, the second
as at least MIN_LATE such updates (default 1; 0 where the schedule leaves none, as with three
gradient slots, whose updates are all sent before the embeddings' last one)."""
import json
import sys

FORWARDS = ("gpt-embed-fwd", "gpt-block-fwd")


def main():
    trace, min_pairs = sys.argv[1], int(sys.argv[2])
    min_late = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    forward_start, update_end = {}, {}
    for e in json.load(open(trace)):
        if e.get("ph") != "X":
            continue
        key = (e["args"]["step"], e["args"]["unit"])
        if e["name"] in FORWARDS:  # the evaluation's forwards come later: keep the first
            forward_start[key] = min(forward_start.get(key, float("inf")), e["ts"])
        elif e["name"] == "opt-adamw":
            update_end[key] = e["ts"] + e["dur"]
    pairs = [(k, (k[0] - 1, k[1])) for k in forward_start if (k[0] - 1, k[1]) in update_end]
    early = [k for k, prev in pairs if forward_start[k] < update_end[prev]]
    late = [k for k in update_end
            if (k[0] + 1, 0) in forward_start and update_end[k] > forward_start[(k[0] + 1, 0)]]
    print("%d forwards checked against their unit's previous update, %d started too early (%s); "
          "%d updates ended after the next step's forward began"
          % (len(pairs), len(early), sorted(early)[:5], len(late)))
    return 0 if len(pairs) >= min_pairs and not early and len(late) >= min_late else 1


if __name__ == "__main__":
    sys.exit(main())
