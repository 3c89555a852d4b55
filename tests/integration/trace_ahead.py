"""Checks a training trace (Chrome trace-event JSON from `fuyou-launch train --trace`) for the
backward's read-ahead of activations on the SSD store (--act-ahead N): every read of a block's
checkpoint or SSD-placed internals from their scratch extents is sent right after the gpu request
of the block N above it, before the next block's (by the requests' sequence numbers, which follow
the order the launcher sent them in). Without clipping: one backward pass a step.
Usage: python3 trace_ahead.py TRACE N MIN_READS; exit status 0 when every such read is where N
puts it and there are at least MIN_READS of them."""
import json
import math
import sys

CKPT_SPILL, SAVED_SPILL, KINDS_END = 0x40010000, 0x40011000, 0x40012000


def main():
    trace, ahead, min_reads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    events = [e for e in json.load(open(trace)) if e.get("ph") == "X"]
    backward = {}  # (step, block) -> sequence number of the block's backward request
    item_bytes = {}  # spill extent -> the gcd of its offsets: one item's bytes
    for e in events:
        a = e["args"]
        if e["name"] == "gpt-block-bwd":
            backward[(a["step"], a["unit"])] = a["seq"]
        if CKPT_SPILL <= a.get("tensor", 0) < KINDS_END and a["at"] > 0:
            item_bytes[a["tensor"]] = math.gcd(item_bytes.get(a["tensor"], 0), a["at"])
    blocks = max(unit for _, unit in backward)
    checked, wrong = 0, []
    for e in events:
        a = e["args"]
        if e["name"] != "io-read" or not CKPT_SPILL <= a.get("tensor", 0) < KINDS_END:
            continue
        # item i is checkpoint x_i (block i + 1's input) or block i + 1's internals
        block = a["at"] // item_bytes.get(a["tensor"], 1) + 1
        after = backward.get((a["step"], block + ahead))
        before = backward.get((a["step"], block + ahead - 1))
        kind = "checkpoint" if a["tensor"] < SAVED_SPILL else "internals"
        if after is None or before is None or not after < a["seq"] < before:
            wrong.append((a["step"], kind, block, a["seq"], after, before))
        checked += 1
    print("%d reads of activations on the store checked against --act-ahead %d over %d blocks; "
          "%d out of place (step, kind, block, seq, after, before): %s"
          % (checked, ahead, blocks, len(wrong), wrong[:5]))
    return 0 if checked >= min_reads and not wrong else 1


if __name__ == "__main__":
    sys.exit(main())
