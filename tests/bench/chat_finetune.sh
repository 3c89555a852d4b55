#!/bin/bash
# A chat fine-tune end to end, at the size a GPU takes: conversations of three kinds (sums, colours,
# the day after a day, a system prompt on every fourth, as tests/integration/test_chat_train.c
# writes them), a tokenizer with Qwen2.5's chat template (tests/reference/chat_ref.py), prepare
# --messages-field (each conversation a document), a Qwen2 model made by transformers (random
# initialisation; Qwen2.5-0.5B's shape by default), init --from-hf, then train --epochs 2 with the
# conversations packed whole. Prints the held-out loss of each evaluation and the fill last.
# Needs python3 with torch, transformers, tokenizers and jinja2.
#
# Environment: CHAT_DIR (work folder; /tmp/fuyou-chat), CHAT_N (conversations, 2000), CHAT_SHAPE
# (the model's hf_llama.py options: Qwen2.5-0.5B's blocks, 24 x 896, 14 heads, 2 kv, MLP 4864),
# CHAT_VOCAB (the model's vocabulary: 151936, Qwen2.5's, of which the tokenizer uses its first
# ids; 0 for the tokenizer's own size), CHAT_BACKEND (cuda), CHAT_TRAIN (more train options,
# e.g. --gpu-mem 22G), BUILD (build).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
L=$BUILD/bin/fuyou-launch
D=${CHAT_DIR:-/tmp/fuyou-chat}
N=${CHAT_N:-2000}
SHAPE=${CHAT_SHAPE:---layers 24 --heads 14 --kv-heads 2 --embd 896 --ffn 4864}
VOCAB=${CHAT_VOCAB:-151936}
BACKEND=${CHAT_BACKEND:-cuda}
[ -x "$L" ] || { echo "chat_finetune.sh: $L is missing: run make first" >&2; exit 1; }
rm -rf "$D" && mkdir -p "$D"

python3 - "$D/chat.jsonl" "$N" <<'EOF'
import json, random, sys
objects = ["sky", "grass", "snow", "coal", "sun", "rose"]
colours = ["blue", "green", "white", "black", "yellow", "red"]
days = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
rs = random.Random(17)
with open(sys.argv[1], "w") as f:
    for i in range(int(sys.argv[2])):
        kind = rs.randrange(3)
        if kind == 0:
            a, b = rs.randrange(10), rs.randrange(10)
            user, answer = f"What is {a} plus {b}?", f"{a} plus {b} is {a + b}."
        elif kind == 1:
            o = rs.randrange(6)
            user, answer = f"What colour is the {objects[o]}?", f"The {objects[o]} is {colours[o]}."
        else:
            d = rs.randrange(7)
            user, answer = f"Which day comes after {days[d]}?", f"After {days[d]} comes {days[(d + 1) % 7]}."
        msgs = [{"role": "system", "content": "Answer briefly."}] if i % 4 == 0 else []
        msgs += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
        f.write(json.dumps({"messages": msgs}) + "\n")
EOF
python3 tests/reference/chat_ref.py build tests/fixtures/chat/qwen2.5 "$D/tok" "$D/chat.jsonl" >/dev/null
$L prepare --out "$D/chat.tok" --tokenizer "$D/tok" --messages-field messages --jsonl "$D/chat.jsonl" \
  >"$D/prepare.log" 2>&1
grep -oE "[0-9]+ documents, each a record" "$D/prepare.log" || true
V=$VOCAB
[ "$V" = 0 ] && V=$(python3 -c "import json,sys; print(len(json.load(open(sys.argv[1]))['model']['vocab']) + 64)" "$D/tok/tokenizer.json")
# shellcheck disable=SC2086
python3 tests/reference/hf_llama.py make "$D/model" --family qwen2 $SHAPE --vocab "$V" --ctx 1024 \
  --tied --seed 3 --device "$([ "$BACKEND" = cuda ] && echo cuda || echo cpu)"
cp "$D"/tok/*.json "$D/model/" 2>/dev/null || true
$L init --run-dir "$D/run" --from-hf "$D/model" >"$D/init.log" 2>&1
# shellcheck disable=SC2086
$L train --run-dir "$D/run" --data "$D/chat.tok" --epochs 2 --batch 16 --seq 256 --lr 3e-4 \
  --warmup 5 --eval-every 5 --backend "$BACKEND" ${CHAT_TRAIN:-} >"$D/train.log" 2>&1
grep -E "plan: (--cpu-mem|--gpu-mem)|batches:|step [0-9]+/|summary" "$D/train.log" | cut -c1-200
python3 - "$D/run/metrics.jsonl" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
ev = [(r["step"], r["eval_loss"]) for r in rows if "eval_loss" in r]
fill = [r["fill"] for r in rows if "fill" in r]
print("held-out loss: " + ", ".join(f"step {s} {v:.4f}" for s, v in ev))
print(f"fill (mean of {len(fill)} steps): {sum(fill) / max(len(fill), 1):.3f}")
EOF
