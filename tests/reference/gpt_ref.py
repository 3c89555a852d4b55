#!/usr/bin/env python3
"""Independent float64 reference of the GPT-2 model of Fuyou, for checking the C backends.

Written from the model's definition (common/model/model.h), not from the C code: numpy only, every
operation in float64, with a hand-derived backward pass (numpy has no autograd). --self-check
verifies that backward against central finite differences in float64, the file round trips, and
the training step's clipping and AdamW against their definitions.

Model: x = wte[token] + wpe[t]; L pre-LN blocks
    y = x + attn_proj(attention(qkv(ln1(x))));  out = y + proj(gelu_tanh(fc(ln2(y))))
(LayerNorm eps 1e-5 with the biased variance; qkv is q|k|v, each C wide, head h being columns
h*hs:(h+1)*hs; causal softmax attention scaled by 1/sqrt(hs)); final LayerNorm; logits =
lnf(x) wte^T (the head is tied to wte); loss = mean cross-entropy over the targets >= 0 (targets
< 0 are ignored; with no target at all the loss and the gradients are 0). Matrices are [out][in]:
y = x W^T + b.

Training (--train): S steps from the parameters in IN, step s = 1..S on batch s: the loss and
gradients as above; the global gradient norm, sqrt(sum of every gradient element squared); when
max_norm > 0, clipping as torch.nn.utils.clip_grad_norm_ does it (coef = max_norm / (norm + 1e-6),
every gradient multiplied by coef when coef < 1); then one AdamW step as torch.optim.AdamW takes it
(decoupled weight decay p *= 1 - lr*wd first, bias corrections with t = s, eps added to
sqrt(v)/sqrt(1 - beta2^t)) with lr_s, weight decay on wte, wpe and the block matrices (qkv_w,
attn_w, fc_w, proj_w) only, as fy_model_decay_segments (common/model/model.c) splits the units. All in
float64.

Usage:
    python3 gpt_ref.py IN OUT      reads IN, writes the loss and every parameter gradient to OUT
    python3 gpt_ref.py --train IN OUT
                                   reads a training IN, writes the losses, norms and parameters
    python3 gpt_ref.py --self-check

File formats (little-endian, no padding):
  IN:  int32[9]  magic 0x52475946 ("FYGR" as bytes), version 1, B, T, L, NH, C, V, ctx
       float32   the parameters of units 0..L+1 in unit order (common/model/model.h):
                   unit 0      [wte V*C | wpe ctx*C]
                   unit 1..L   [ln1_w C | ln1_b C | qkv_w 3C*C | qkv_b 3C | attn_w C*C | attn_b C |
                                ln2_w C | ln2_b C | fc_w 4C*C | fc_b 4C | proj_w C*4C | proj_b C]
                   unit L+1    [lnf_w C | lnf_b C]
       int32     tokens [B][T] (0 <= token < V), then targets [B][T] (target < V; < 0 ignored)
  OUT: float64   the loss, then the gradient of every unit in the same layout as IN's parameters

  training IN:  int32[10]  magic 0x53475946 ("FYGS" as bytes), version 1, B, T, L, NH, C, V, ctx, S
                float64[5] beta1, beta2, eps, weight_decay, max_norm (0: no clipping)
                float64[S] the learning rate of each step
                float32    the initial parameters, as in IN
                S times:   int32 tokens [B][T], then int32 targets [B][T] of that step's batch
  training OUT: float64[S] the loss of each step (before its update), float64[S] the gradient norm
                of each step (before clipping), then float64 the parameters after the S steps

Exit status: 0 on success; 2 with a message on stderr for a malformed input or bad arguments;
1 when --self-check finds a mismatch.
"""

import os
import struct
import sys

import numpy as np

MAGIC = 0x52475946
VERSION = 1
HEADER_FIELDS = ("magic", "version", "B", "T", "L", "NH", "C", "V", "ctx")
TRAIN_MAGIC = 0x53475946  # "FYGS"
TRAIN_VERSION = 1
TRAIN_HEADER_FIELDS = HEADER_FIELDS + ("S",)
TRAIN_HPARAMS = ("beta1", "beta2", "eps", "weight_decay", "max_norm")
MAX_STEPS = 1 << 16
# The block tensors that weight decay applies to (fy_model_decay_segments); wte and wpe decay too.
DECAY_BLOCK_TENSORS = ("qkv_w", "attn_w", "fc_w", "proj_w")
CLIP_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_'s
LN_EPS = 1e-5
GELU_S = np.sqrt(2.0 / np.pi)
MAX_DIM = 1 << 20


class InputError(Exception):
    pass


# ---- layout ----

BLOCK_TENSORS = ("ln1_w", "ln1_b", "qkv_w", "qkv_b", "attn_w", "attn_b",
                 "ln2_w", "ln2_b", "fc_w", "fc_b", "proj_w", "proj_b")


def block_shapes(C):
    return {
        "ln1_w": (C,), "ln1_b": (C,),
        "qkv_w": (3 * C, C), "qkv_b": (3 * C,),
        "attn_w": (C, C), "attn_b": (C,),
        "ln2_w": (C,), "ln2_b": (C,),
        "fc_w": (4 * C, C), "fc_b": (4 * C,),
        "proj_w": (C, 4 * C), "proj_b": (C,),
    }


def unit_sizes(cfg):
    C, V, ctx, L = cfg["C"], cfg["V"], cfg["ctx"], cfg["L"]
    block = sum(int(np.prod(s)) for s in block_shapes(C).values())
    return [V * C + ctx * C] + [block] * L + [2 * C]


def split_block(vec, C):
    """Dictionary of views of a block unit's flat vector."""
    out, at = {}, 0
    shapes = block_shapes(C)
    for name in BLOCK_TENSORS:
        n = int(np.prod(shapes[name]))
        out[name] = vec[at:at + n].reshape(shapes[name])
        at += n
    assert at == vec.size
    return out


def flatten_block(d):
    return np.concatenate([d[name].reshape(-1) for name in BLOCK_TENSORS])


# ---- operations: forward returns (out, cache), backward returns gradients ----

def layernorm_forward(x, w, b):
    mean = x.mean(axis=-1, keepdims=True)
    xc = x - mean
    var = (xc * xc).mean(axis=-1, keepdims=True)  # biased
    rstd = 1.0 / np.sqrt(var + LN_EPS)
    xhat = xc * rstd
    return xhat * w + b, (xhat, rstd, w)


def layernorm_backward(dout, cache):
    xhat, rstd, w = cache
    red = tuple(range(dout.ndim - 1))
    dw = (dout * xhat).sum(axis=red)
    db = dout.sum(axis=red)
    dxhat = dout * w
    # d/dx of (x - mean) * rstd: rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
    dx = rstd * (dxhat - dxhat.mean(axis=-1, keepdims=True)
                 - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))
    return dx, dw, db


def linear_forward(x, w, b):
    return x @ w.T + b, x


def linear_backward(dout, cache, w):
    x = cache
    dx = dout @ w
    n_out, n_in = w.shape
    dw = dout.reshape(-1, n_out).T @ x.reshape(-1, n_in)
    db = dout.reshape(-1, n_out).sum(axis=0)
    return dx, dw, db


def gelu_forward(x):
    u = GELU_S * (x + 0.044715 * x ** 3)
    t = np.tanh(u)
    return 0.5 * x * (1.0 + t), (x, t)


def gelu_backward(dout, cache):
    x, t = cache
    du = GELU_S * (1.0 + 3.0 * 0.044715 * x * x)
    return dout * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du)


def attention_forward(qkv, NH):
    B, T, C3 = qkv.shape
    C = C3 // 3
    hs = C // NH

    def heads(a):  # [B,T,C] -> [B,NH,T,hs]
        return a.reshape(B, T, NH, hs).transpose(0, 2, 1, 3)

    q, k, v = heads(qkv[..., :C]), heads(qkv[..., C:2 * C]), heads(qkv[..., 2 * C:])
    scale = 1.0 / np.sqrt(hs)
    scores = (q @ k.transpose(0, 1, 3, 2)) * scale
    mask = np.tril(np.ones((T, T), dtype=bool))
    scores = np.where(mask, scores, -np.inf)
    scores = scores - scores.max(axis=-1, keepdims=True)
    e = np.exp(scores)
    att = e / e.sum(axis=-1, keepdims=True)  # masked entries are exactly 0
    out = (att @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
    return out, (q, k, v, att, scale, NH)


def attention_backward(dout, cache):
    q, k, v, att, scale, NH = cache
    B, _, T, hs = q.shape
    C = NH * hs
    do = dout.reshape(B, T, NH, hs).transpose(0, 2, 1, 3)
    datt = do @ v.transpose(0, 1, 3, 2)
    dv = att.transpose(0, 1, 3, 2) @ do
    # softmax backward; masked entries have att 0, so their gradient is 0
    dscores = att * (datt - (datt * att).sum(axis=-1, keepdims=True)) * scale
    dq = dscores @ k
    dk = dscores.transpose(0, 1, 3, 2) @ q

    def unheads(a):
        return a.transpose(0, 2, 1, 3).reshape(B, T, C)

    return np.concatenate([unheads(dq), unheads(dk), unheads(dv)], axis=-1)


def block_forward(x, p, NH):
    h1, c_ln1 = layernorm_forward(x, p["ln1_w"], p["ln1_b"])
    qkv, c_qkv = linear_forward(h1, p["qkv_w"], p["qkv_b"])
    a, c_att = attention_forward(qkv, NH)
    ao, c_ap = linear_forward(a, p["attn_w"], p["attn_b"])
    y = x + ao
    h2, c_ln2 = layernorm_forward(y, p["ln2_w"], p["ln2_b"])
    f, c_fc = linear_forward(h2, p["fc_w"], p["fc_b"])
    g, c_gelu = gelu_forward(f)
    m, c_proj = linear_forward(g, p["proj_w"], p["proj_b"])
    return y + m, (c_ln1, c_qkv, c_att, c_ap, c_ln2, c_fc, c_gelu, c_proj)


def block_backward(dout, p, cache):
    c_ln1, c_qkv, c_att, c_ap, c_ln2, c_fc, c_gelu, c_proj = cache
    d = {}
    dy = dout.copy()
    dg, d["proj_w"], d["proj_b"] = linear_backward(dout, c_proj, p["proj_w"])
    df = gelu_backward(dg, c_gelu)
    dh2, d["fc_w"], d["fc_b"] = linear_backward(df, c_fc, p["fc_w"])
    dy_ln, d["ln2_w"], d["ln2_b"] = layernorm_backward(dh2, c_ln2)
    dy += dy_ln
    da, d["attn_w"], d["attn_b"] = linear_backward(dy, c_ap, p["attn_w"])
    dqkv = attention_backward(da, c_att)
    dh1, d["qkv_w"], d["qkv_b"] = linear_backward(dqkv, c_qkv, p["qkv_w"])
    dx_ln, d["ln1_w"], d["ln1_b"] = layernorm_backward(dh1, c_ln1)
    return dy + dx_ln, d


def model_loss_and_grads(cfg, units, tokens, targets):
    """units: list of float64 vectors (unit order). Returns (loss, list of gradient vectors)."""
    B, T, L, NH, C, V, ctx = (cfg[k] for k in ("B", "T", "L", "NH", "C", "V", "ctx"))
    wte = units[0][:V * C].reshape(V, C)
    wpe = units[0][V * C:].reshape(ctx, C)
    blocks = [split_block(units[1 + l], C) for l in range(L)]
    lnf_w, lnf_b = units[L + 1][:C], units[L + 1][C:]

    # forward
    x = wte[tokens] + wpe[:T][None, :, :]
    caches = []
    for p in blocks:
        x, cache = block_forward(x, p, NH)
        caches.append(cache)
    xf, c_lnf = layernorm_forward(x, lnf_w, lnf_b)
    logits = xf @ wte.T  # [B,T,V]
    valid = targets >= 0
    n_valid = int(valid.sum())
    z = logits - logits.max(axis=-1, keepdims=True)
    lse = np.log(np.exp(z).sum(axis=-1, keepdims=True))
    logp = z - lse
    safe_t = np.where(valid, targets, 0)
    picked = np.take_along_axis(logp, safe_t[..., None], axis=-1)[..., 0]
    loss = -(picked * valid).sum() / n_valid if n_valid else 0.0

    # backward
    if n_valid:
        dlogits = np.exp(logp)
        np.put_along_axis(dlogits, safe_t[..., None],
                          np.take_along_axis(dlogits, safe_t[..., None], axis=-1) - 1.0, axis=-1)
        dlogits *= (valid / n_valid)[..., None]
    else:
        dlogits = np.zeros_like(logits)
    dwte = dlogits.reshape(-1, V).T @ xf.reshape(-1, C)
    dxf = dlogits @ wte
    dx, dlnf_w, dlnf_b = layernorm_backward(dxf, c_lnf)
    dblocks = [None] * L
    for l in reversed(range(L)):
        dx, dblocks[l] = block_backward(dx, blocks[l], caches[l])
    np.add.at(dwte, tokens.reshape(-1), dx.reshape(-1, C))
    dwpe = np.zeros_like(wpe)
    dwpe[:T] += dx.sum(axis=0)

    grads = [np.concatenate([dwte.reshape(-1), dwpe.reshape(-1)])]
    grads += [flatten_block(d) for d in dblocks]
    grads.append(np.concatenate([dlnf_w, dlnf_b]))
    return float(loss), grads


# ---- training ----

def decay_masks(cfg):
    """Per unit, 1.0 where weight decay applies, else 0.0."""
    C, L = cfg["C"], cfg["L"]
    masks = [np.ones(unit_sizes(cfg)[0])]
    shapes = block_shapes(C)
    block = {n: np.full(shapes[n], 1.0 if n in DECAY_BLOCK_TENSORS else 0.0) for n in BLOCK_TENSORS}
    masks += [flatten_block(block) for _ in range(L)]
    masks.append(np.zeros(2 * C))
    return masks


def clip_grads(grads, max_norm):
    """(global norm, the gradients clipped to max_norm as clip_grad_norm_ does; 0: unclipped)."""
    norm = float(np.sqrt(sum(float((g * g).sum()) for g in grads)))
    if max_norm > 0:
        coef = max_norm / (norm + CLIP_EPS)
        if coef < 1.0:
            grads = [g * coef for g in grads]
    return norm, grads


def adamw_step(units, grads, m, v, t, lr, hp, masks):
    """One torch.optim.AdamW step (t 1-based) over every unit, in place."""
    b1, b2, eps, wd = hp["beta1"], hp["beta2"], hp["eps"], hp["weight_decay"]
    bc1, bc2 = 1.0 - b1 ** t, 1.0 - b2 ** t
    for u in range(len(units)):
        units[u] *= 1.0 - lr * wd * masks[u]
        m[u] = b1 * m[u] + (1.0 - b1) * grads[u]
        v[u] = b2 * v[u] + (1.0 - b2) * grads[u] * grads[u]
        units[u] -= (lr / bc1) * m[u] / (np.sqrt(v[u]) / np.sqrt(bc2) + eps)


def train(cfg, hp, lrs, units, batches):
    """S steps from units (changed in place). Returns (losses, norms)."""
    masks = decay_masks(cfg)
    m = [np.zeros_like(u) for u in units]
    v = [np.zeros_like(u) for u in units]
    losses, norms = [], []
    for s, (tokens, targets) in enumerate(batches):
        loss, grads = model_loss_and_grads(cfg, units, tokens, targets)
        norm, grads = clip_grads(grads, hp["max_norm"])
        adamw_step(units, grads, m, v, s + 1, lrs[s], hp, masks)
        losses.append(loss)
        norms.append(norm)
    return losses, norms


# ---- files ----

def read_input(path):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror}")
    hsize = 4 * len(HEADER_FIELDS)
    if len(data) < hsize:
        raise InputError(f"{path}: {len(data)} bytes, shorter than the {hsize}-byte header")
    hdr = dict(zip(HEADER_FIELDS, struct.unpack("<9i", data[:hsize])))
    if hdr["magic"] != MAGIC:
        raise InputError(f"{path}: bad magic 0x{hdr['magic'] & 0xffffffff:08x} "
                         f"(expected 0x{MAGIC:08x}); not a gpt_ref input file")
    if hdr["version"] != VERSION:
        raise InputError(f"{path}: version {hdr['version']}, this script reads version {VERSION}")
    cfg = {k: hdr[k] for k in HEADER_FIELDS[2:]}
    check_model(path, cfg)
    sizes = unit_sizes(cfg)
    n_params = sum(sizes)
    n_tok = cfg["B"] * cfg["T"]
    expect = hsize + 4 * n_params + 2 * 4 * n_tok
    if len(data) != expect:
        raise InputError(f"{path}: {len(data)} bytes, expected {expect} for B={cfg['B']} "
                         f"T={cfg['T']} L={cfg['L']} NH={cfg['NH']} C={cfg['C']} V={cfg['V']} "
                         f"ctx={cfg['ctx']} ({n_params} parameters)")
    units = read_units(path, data, hsize, cfg)
    tokens, targets = read_batch(path, data, hsize + 4 * n_params, cfg, "")
    return cfg, units, tokens, targets


def check_model(path, cfg):
    for k in cfg:
        if not 1 <= cfg[k] <= MAX_DIM:
            raise InputError(f"{path}: {k} = {cfg[k]} is out of range [1, {MAX_DIM}]")
    if cfg["C"] % cfg["NH"]:
        raise InputError(f"{path}: NH = {cfg['NH']} does not divide C = {cfg['C']}")
    if cfg["V"] < 2:
        raise InputError(f"{path}: V = {cfg['V']} must be at least 2")
    if cfg["T"] > cfg["ctx"]:
        raise InputError(f"{path}: T = {cfg['T']} exceeds ctx = {cfg['ctx']}")


def read_units(path, data, at, cfg):
    """The float32 parameters at byte `at`, as float64 vectors in unit order."""
    sizes = unit_sizes(cfg)
    params = np.frombuffer(data, dtype="<f4", count=sum(sizes), offset=at).astype(np.float64)
    if not np.all(np.isfinite(params)):
        raise InputError(f"{path}: the parameters contain NaN or infinity")
    units, at = [], 0
    for n in sizes:
        units.append(params[at:at + n].copy())
        at += n
    return units


def read_batch(path, data, at, cfg, what):
    """(tokens, targets) [B][T] at byte `at`; `what` names the batch in messages."""
    n_tok = cfg["B"] * cfg["T"]
    ints = np.frombuffer(data, dtype="<i4", count=2 * n_tok, offset=at)
    tokens = ints[:n_tok].reshape(cfg["B"], cfg["T"]).astype(np.int64)
    targets = ints[n_tok:].reshape(cfg["B"], cfg["T"]).astype(np.int64)
    if tokens.min() < 0 or tokens.max() >= cfg["V"]:
        raise InputError(f"{path}: {what}a token is outside [0, V={cfg['V']})")
    if targets.max() >= cfg["V"]:
        raise InputError(f"{path}: {what}a target is >= V={cfg['V']}")
    return tokens, targets


def read_train_input(path):
    """(cfg, hparams, learning rates, units, [(tokens, targets)] * S)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror}")
    hsize = 4 * len(TRAIN_HEADER_FIELDS)
    psize = 8 * len(TRAIN_HPARAMS)
    if len(data) < hsize + psize:
        raise InputError(f"{path}: {len(data)} bytes, shorter than the {hsize + psize}-byte "
                         f"header and hyperparameters")
    hdr = dict(zip(TRAIN_HEADER_FIELDS, struct.unpack(f"<{len(TRAIN_HEADER_FIELDS)}i",
                                                      data[:hsize])))
    if hdr["magic"] != TRAIN_MAGIC:
        hint = "; a one-batch input? (drop --train)" if hdr["magic"] == MAGIC else ""
        raise InputError(f"{path}: bad magic 0x{hdr['magic'] & 0xffffffff:08x} "
                         f"(expected 0x{TRAIN_MAGIC:08x}){hint}")
    if hdr["version"] != TRAIN_VERSION:
        raise InputError(f"{path}: version {hdr['version']}, this script reads version "
                         f"{TRAIN_VERSION}")
    cfg = {k: hdr[k] for k in HEADER_FIELDS[2:]}
    check_model(path, cfg)
    S = hdr["S"]
    if not 1 <= S <= MAX_STEPS:
        raise InputError(f"{path}: S = {S} is out of range [1, {MAX_STEPS}]")
    n_params = sum(unit_sizes(cfg))
    n_tok = cfg["B"] * cfg["T"]
    expect = hsize + psize + 8 * S + 4 * n_params + S * 2 * 4 * n_tok
    if len(data) != expect:
        raise InputError(f"{path}: {len(data)} bytes, expected {expect} for B={cfg['B']} "
                         f"T={cfg['T']} L={cfg['L']} NH={cfg['NH']} C={cfg['C']} V={cfg['V']} "
                         f"ctx={cfg['ctx']} S={S} ({n_params} parameters)")
    hp = dict(zip(TRAIN_HPARAMS, struct.unpack(f"<{len(TRAIN_HPARAMS)}d",
                                               data[hsize:hsize + psize])))
    lrs = [float(x) for x in np.frombuffer(data, dtype="<f8", count=S, offset=hsize + psize)]
    if not all(np.isfinite(x) for x in list(hp.values()) + lrs):
        raise InputError(f"{path}: a hyperparameter or learning rate is NaN or infinite")
    if min(lrs) < 0 or hp["eps"] < 0 or hp["weight_decay"] < 0 or hp["max_norm"] < 0:
        raise InputError(f"{path}: the learning rates, eps, weight_decay and max_norm must be "
                         f">= 0 ({hp})")
    if not (0 <= hp["beta1"] < 1 and 0 <= hp["beta2"] < 1):
        raise InputError(f"{path}: the betas must be in [0, 1) ({hp})")
    at = hsize + psize + 8 * S
    units = read_units(path, data, at, cfg)
    at += 4 * n_params
    batches = [read_batch(path, data, at + s * 8 * n_tok, cfg, f"batch {s + 1}: ")
               for s in range(S)]
    return cfg, hp, lrs, units, batches


def write_train_input(path, cfg, hp, lrs, units, batches):
    with open(path, "wb") as f:
        f.write(struct.pack("<10i", TRAIN_MAGIC, TRAIN_VERSION,
                            *(cfg[k] for k in HEADER_FIELDS[2:]), len(batches)))
        f.write(struct.pack("<5d", *(hp[k] for k in TRAIN_HPARAMS)))
        f.write(np.asarray(lrs, dtype="<f8").tobytes())
        for u in units:
            f.write(np.asarray(u, dtype="<f4").tobytes())
        for tokens, targets in batches:
            f.write(np.asarray(tokens, dtype="<i4").tobytes())
            f.write(np.asarray(targets, dtype="<i4").tobytes())


def write_train_output(path, losses, norms, units):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(np.asarray(losses, dtype="<f8").tobytes())
        f.write(np.asarray(norms, dtype="<f8").tobytes())
        for u in units:
            f.write(np.asarray(u, dtype="<f8").tobytes())
    os.replace(tmp, path)


def write_input(path, cfg, units, tokens, targets):
    with open(path, "wb") as f:
        f.write(struct.pack("<9i", MAGIC, VERSION, *(cfg[k] for k in HEADER_FIELDS[2:])))
        for u in units:
            f.write(np.asarray(u, dtype="<f4").tobytes())
        f.write(np.asarray(tokens, dtype="<i4").tobytes())
        f.write(np.asarray(targets, dtype="<i4").tobytes())


def write_output(path, loss, grads):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(np.float64(loss).astype("<f8").tobytes())
        for g in grads:
            f.write(np.asarray(g, dtype="<f8").tobytes())
    os.replace(tmp, path)


def read_output(path, cfg):
    data = np.fromfile(path, dtype="<f8")
    sizes = unit_sizes(cfg)
    assert data.size == 1 + sum(sizes)
    grads, at = [], 1
    for n in sizes:
        grads.append(data[at:at + n])
        at += n
    return float(data[0]), grads


# ---- self-check ----

def random_model(cfg, rng, scale):
    """Parameters with every tensor non-trivial (LN weights near 1, biases non-zero)."""
    C, L = cfg["C"], cfg["L"]
    units = [rng.normal(0.0, scale, cfg["V"] * C + cfg["ctx"] * C)]
    for _ in range(L):
        p = {}
        for name, shape in block_shapes(C).items():
            if name.endswith("_w") and name.startswith("ln"):
                p[name] = 1.0 + rng.normal(0.0, 0.2, shape)
            else:
                p[name] = rng.normal(0.0, scale, shape)
        units.append(flatten_block(p))
    units.append(np.concatenate([1.0 + rng.normal(0.0, 0.2, C), rng.normal(0.0, 0.2, C)]))
    return units


def self_check():
    rng = np.random.default_rng(12345)
    ok = True
    # A wider init than GPT-2's (0.3 instead of 0.02) so that the nonlinearities are exercised.
    cfg = {"B": 2, "T": 5, "L": 2, "NH": 2, "C": 4, "V": 7, "ctx": 6}
    units = random_model(cfg, rng, 0.3)
    tokens = rng.integers(0, cfg["V"], (cfg["B"], cfg["T"]))
    targets = rng.integers(0, cfg["V"], (cfg["B"], cfg["T"]))
    targets[1, 2] = -1
    loss, grads = model_loss_and_grads(cfg, units, tokens, targets)
    h = 1e-5
    names = ["embed"] + [f"block{l}" for l in range(cfg["L"])] + ["final"]
    for u, name in enumerate(names):
        num = np.empty_like(units[u])
        for i in range(units[u].size):
            keep = units[u][i]
            units[u][i] = keep + h
            lp, _ = model_loss_and_grads(cfg, units, tokens, targets)
            units[u][i] = keep - h
            lm, _ = model_loss_and_grads(cfg, units, tokens, targets)
            units[u][i] = keep
            num[i] = (lp - lm) / (2 * h)
        err = np.abs(num - grads[u]).max()
        ref = max(np.abs(num).max(), 1e-12)
        # central differences in float64 with h = 1e-5: truncation ~h^2, rounding ~1e-16/h
        good = err <= 1e-7 * max(ref, 1.0)
        ok &= bool(good)
        print(f"self-check: {name:7s} {units[u].size:4d} params, max |grad| {ref:.3e}, "
              f"max |analytic - numerical| {err:.3e} {'ok' if good else 'MISMATCH'}")
    # the gradient of wpe rows at positions >= T must be exactly zero (they are unused)
    C, V = cfg["C"], cfg["V"]
    tail = grads[0][V * C + cfg["T"] * C:]
    if np.any(tail != 0):
        print("self-check: wpe rows past T have a non-zero gradient")
        ok = False
    # ignoring a target drops it from the mean: n * loss(all) = (n-1) * loss(all but one) + loss(one)
    full = targets.copy()
    full[1, 2] = 3
    but_one = full.copy()
    but_one[0, 1] = -1
    only = np.full_like(full, -1)
    only[0, 1] = full[0, 1]
    n = full.size
    l_full, _ = model_loss_and_grads(cfg, units, tokens, full)
    l_but, _ = model_loss_and_grads(cfg, units, tokens, but_one)
    l_only, _ = model_loss_and_grads(cfg, units, tokens, only)
    l_none, g_none = model_loss_and_grads(cfg, units, tokens, np.full_like(full, -1))
    mean_ok = abs(n * l_full - ((n - 1) * l_but + l_only)) <= 1e-12 * n * abs(l_full)
    none_ok = l_none == 0.0 and all(not np.any(g) for g in g_none)
    print(f"self-check: ignored targets {'ok' if mean_ok and none_ok else 'MISMATCH'}")
    ok &= bool(mean_ok and none_ok)
    # file round trip through the command-line path
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        fin, fout = os.path.join(d, "in.bin"), os.path.join(d, "out.bin")
        write_input(fin, cfg, units, tokens, targets)
        cfg2, units2, tok2, tgt2 = read_input(fin)
        assert cfg2 == cfg and np.array_equal(tok2, tokens) and np.array_equal(tgt2, targets)
        rc = main([sys.argv[0], fin, fout])
        l3, g3 = read_output(fout, cfg)
        l4, g4 = model_loss_and_grads(cfg, units2, tok2, tgt2)
        same = rc == 0 and l3 == l4 and all(np.array_equal(a, b) for a, b in zip(g3, g4))
        print(f"self-check: file round trip {'ok' if same else 'MISMATCH'}")
        ok &= same
        # a truncated file is refused
        with open(fin, "r+b") as f:
            f.truncate(os.path.getsize(fin) - 4)
        try:
            read_input(fin)
            print("self-check: a truncated input was accepted")
            ok = False
        except InputError:
            pass
    ok &= self_check_training(cfg, units, rng)
    print(f"self-check: {'passed' if ok else 'FAILED'} (loss {loss:.6f})")
    return 0 if ok else 1


def self_check_training(cfg, units, rng):
    """Clipping, one AdamW step written out element by element, and the --train file path."""
    ok = True
    _, grads = model_loss_and_grads(cfg, units, *random_batch(cfg, rng))
    norm, same = clip_grads(grads, 0.0)
    direct = np.sqrt(sum(float(np.dot(g, g)) for g in grads))
    big_norm, big = clip_grads(grads, 1e30)
    small_norm, small = clip_grads(grads, 0.25 * norm)
    clipped = np.sqrt(sum(float(np.dot(g, g)) for g in small))
    good = (abs(norm - direct) <= 1e-12 * direct and big_norm == norm and small_norm == norm
            and all(a is b for a, b in zip(same, grads))
            and all(np.array_equal(a, b) for a, b in zip(big, grads))
            and abs(clipped - 0.25 * norm * norm / (norm + CLIP_EPS)) <= 1e-12 * norm)
    print(f"self-check: clipping (norm {norm:.4f}) {'ok' if good else 'MISMATCH'}")
    ok &= good
    # one AdamW step, element by element from the definition
    hp = {"beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1, "max_norm": 0.0}
    lr, t = 1e-2, 3
    after = [u.copy() for u in units]
    m = [rng.normal(0.0, 0.01, u.size) for u in units]
    v = [rng.uniform(0.0, 1e-4, u.size) for u in units]
    m0, v0 = [a.copy() for a in m], [a.copy() for a in v]
    masks = decay_masks(cfg)
    adamw_step(after, grads, m, v, t, lr, hp, masks)
    worst = 0.0
    for u in range(len(units)):
        for i in range(0, units[u].size, 7):
            g, p = grads[u][i], units[u][i]
            p -= lr * hp["weight_decay"] * masks[u][i] * p
            mm = 0.9 * m0[u][i] + 0.1 * g
            vv = 0.95 * v0[u][i] + 0.05 * g * g
            p -= lr / (1 - 0.9 ** t) * mm / (np.sqrt(vv / (1 - 0.95 ** t)) + 1e-8)
            worst = max(worst, abs(p - after[u][i]) / max(abs(p), 1e-30))
    good = worst <= 1e-12
    # and the decay masks: the LayerNorm and bias parameters of a block do not decay
    block = split_block(masks[1], cfg["C"])
    good &= all(bool(np.all(block[n] == (1.0 if n in DECAY_BLOCK_TENSORS else 0.0)))
                for n in BLOCK_TENSORS) and not np.any(masks[-1]) and np.all(masks[0] == 1.0)
    print(f"self-check: AdamW step (worst relative difference {worst:.1e}) "
          f"{'ok' if good else 'MISMATCH'}")
    ok &= bool(good)
    # the --train file path: two steps, clipped, against train() called directly
    import tempfile
    hp["max_norm"] = 0.5 * norm
    batches = [random_batch(cfg, rng) for _ in range(2)]
    lrs = [1e-2, 5e-3]
    with tempfile.TemporaryDirectory() as d:
        fin, fout = os.path.join(d, "train.bin"), os.path.join(d, "out.bin")
        write_train_input(fin, cfg, hp, lrs, units, batches)
        rc = main([sys.argv[0], "--train", fin, fout])
        out = np.fromfile(fout, dtype="<f8")
        mine = [u.astype(np.float32).astype(np.float64) for u in units]  # IN holds float32
        losses, norms = train(cfg, hp, lrs, mine, batches)
        same = (rc == 0 and out.size == 4 + sum(unit_sizes(cfg))
                and np.array_equal(out[:2], losses) and np.array_equal(out[2:4], norms)
                and np.array_equal(out[4:], np.concatenate(mine)))
        print(f"self-check: --train file round trip {'ok' if same else 'MISMATCH'}")
        ok &= bool(same)
        # a truncated training input, and a one-batch input given to --train, are refused
        def truncate():
            with open(fin, "r+b") as f:
                f.truncate(os.path.getsize(fin) - 4)

        for bad in (truncate, lambda: write_input(fin, cfg, units, *batches[0])):
            bad()
            try:
                read_train_input(fin)
                print("self-check: a malformed training input was accepted")
                ok = False
            except InputError:
                pass
    return ok


def random_batch(cfg, rng):
    tokens = rng.integers(0, cfg["V"], (cfg["B"], cfg["T"]))
    targets = rng.integers(0, cfg["V"], (cfg["B"], cfg["T"]))
    return tokens, targets


def main_train(argv):
    try:
        cfg, hp, lrs, units, batches = read_train_input(argv[2])
    except InputError as e:
        print(f"gpt_ref.py: error: {e}", file=sys.stderr)
        return 2
    losses, norms = train(cfg, hp, lrs, units, batches)
    try:
        write_train_output(argv[3], losses, norms, units)
    except OSError as e:
        print(f"gpt_ref.py: error: cannot write {argv[3]}: {e.strerror}", file=sys.stderr)
        return 2
    return 0


def main(argv):
    if len(argv) == 2 and argv[1] == "--self-check":
        return self_check()
    if len(argv) == 4 and argv[1] == "--train":
        return main_train(argv)
    if len(argv) != 3 or argv[1].startswith("-"):
        print(f"usage: {os.path.basename(argv[0])} IN OUT | --train IN OUT | --self-check",
              file=sys.stderr)
        return 2
    try:
        cfg, units, tokens, targets = read_input(argv[1])
    except InputError as e:
        print(f"gpt_ref.py: error: {e}", file=sys.stderr)
        return 2
    loss, grads = model_loss_and_grads(cfg, units, tokens, targets)
    try:
        write_output(argv[2], loss, grads)
    except OSError as e:
        print(f"gpt_ref.py: error: cannot write {argv[2]}: {e.strerror}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
