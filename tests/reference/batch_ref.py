#!/usr/bin/env python3
"""Training and held-out batches rebuilt from a token file by docs/usage.md's rules alone ("How a
batch is made"), in plain Python, for tests/test_sampler.c: the token file read by its format
(docs/architecture.md, "File formats"), nothing of the project's code used.

  batch_ref.py train|eval FILE B T SEED EVAL_FRACTION truncate|split OUT INDEX...
      OUT gets, for each INDEX (a training step from 1, or a held-out batch from 0), B*T lines
      "input target position", row by row. Documents packing.
"""
import struct
import sys

MASK64 = (1 << 64) - 1
SALT_PIECES = 0x706965636573  # "pieces"
SALT_ROWS = 0x726F7773  # "rows"


def mix64(z):
    z = (z + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def align4k(n):
    return (n + 4095) // 4096 * 4096


class TokenFile:
    def __init__(self, path):
        with open(path, "rb") as f:
            self.b = f.read()
        slot = lambda i: struct.unpack_from("<I", self.b, 4 * i)[0]
        assert slot(0) == 0x4B4F5446, "not a token file"
        version, self.width, flags = slot(1), slot(2), slot(6)
        self.count = slot(4) | slot(5) << 32
        assert version == 3, "documents need a version 3 file"
        end = 4096 + self.count * self.width
        self.mask = None
        if flags & 1:
            self.mask = align4k(end)
            end = self.mask + (self.count + 7) // 8
        n_docs = slot(13) | slot(14) << 32
        at = align4k(end)
        self.starts = [struct.unpack_from("<Q", self.b, at + 8 * i)[0] for i in range(n_docs)]

    def token(self, i):
        p = 4096 + i * self.width
        return int.from_bytes(self.b[p:p + self.width], "little")

    def trained(self, i):
        return self.mask is None or (self.b[self.mask + i // 8] >> (i % 8)) & 1

    def end(self, d):
        return self.starts[d + 1] if d + 1 < len(self.starts) else self.count


def pieces(tf, docs, T, split):
    out = []  # (first token, predictions)
    for d in docs:
        p = tf.end(d) - tf.starts[d] - 1
        if p == 0:
            continue
        if not split:
            out.append((tf.starts[d], min(p, T)))
            continue
        for k in range(0, p, T):
            out.append((tf.starts[d] + k, min(T, p - k)))
    return out


def shuffle(a, key):
    for i in range(len(a) - 1, 0, -1):
        j = mix64(key ^ i) % (i + 1)
        a[i], a[j] = a[j], a[i]


def key(seed, salt, epoch):
    return mix64(mix64(mix64(seed) ^ salt) ^ epoch)


def pack(ps, T, seed, epoch, shuffled):
    order = list(range(len(ps)))
    if shuffled:
        shuffle(order, key(seed, SALT_PIECES, epoch))
    order.sort(key=lambda i: -ps[i][1])  # stable: equal lengths keep their order
    rows, room = [], []
    for i in order:
        for r in range(len(rows)):
            if room[r] >= ps[i][1]:
                break
        else:
            r = len(rows)
            rows.append([])
            room.append(T)
        rows[r].append(i)
        room[r] -= ps[i][1]
    if shuffled:
        perm = list(range(len(rows)))
        shuffle(perm, key(seed, SALT_ROWS, epoch))
        rows = [rows[k] for k in perm]
    return rows


def batch(tf, ps, rows, first, B, T):
    out = []
    for b in range(B):
        line = []
        if first + b < len(rows):
            for i in rows[first + b]:
                start, n = ps[i]
                for j in range(n):
                    nxt = tf.token(start + j + 1)
                    line.append((tf.token(start + j), nxt if tf.trained(start + j + 1) else -1, j))
        line += [(0, -1, 0)] * (T - len(line))
        out += line
    return out


def main():
    a = sys.argv[1:]
    if len(a) < 9 or a[0] not in ("train", "eval") or a[6] not in ("truncate", "split"):
        sys.exit(__doc__)
    which, path, B, T, seed, frac = a[0], a[1], int(a[2]), int(a[3]), int(a[4]), float(a[5])
    split, out, indices = a[6] == "split", a[7], [int(x) for x in a[8:]]
    tf = TokenFile(path)
    D = len(tf.starts)
    n_eval = min(int(D * frac + 0.5), D)
    docs = range(D - n_eval) if which == "train" else range(D - n_eval, D)
    ps = pieces(tf, docs, T, split)
    with open(out, "w") as f:
        if which == "eval":
            rows = pack(ps, T, seed, 0, False)
            per = -(-len(rows) // B)
            for k in indices:
                for t in batch(tf, ps, rows, k % per * B, B, T):
                    f.write("%d %d %d\n" % t)
            return
        per = -(-len(pack(ps, T, seed, 0, True)) // B)
        for step in indices:
            epoch, j = (step - 1) // per, (step - 1) % per
            rows = pack(ps, T, seed, epoch, True)
            for t in batch(tf, ps, rows, j * B, B, T):
                f.write("%d %d %d\n" % t)


if __name__ == "__main__":
    main()
