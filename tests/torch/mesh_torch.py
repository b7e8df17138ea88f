"""tests/torch/mesh_torch.py: mesh's models written again in PyTorch, the oracle.

The blocks of lang/std/transformer.mesh (gpt2_block, llama_block,
moe_block), written from their definitions with PyTorch's own operators,
over parameters named and laid out as mesh's checkpoints hold them: global names
(`h.0.gpt2_block.w_qkv`), weights stored [in, out] so that `x @ w` applies
them. check_train.py trains them next to meshrun; tests/gpu/torch_gpt2.py
times the GPT-2 one on a GPU, so the PyTorch figure it prints is for the
model this file shows to give meshrun's losses.

Also here: a reader of safetensors files (no package needed), of the few
keys of a plan that a training step needs, and of llm.c token shards.
"""
import json
import math
import os
import re
import struct

import torch
import torch.nn.functional as F

# safetensors dtypes this reader takes, and their torch types
_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I32": torch.int32, "I64": torch.int64}


def read_safetensors(path):
    """(tensors by name, metadata): a whole safetensors file, checked."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError(f"{path}: {len(blob)} bytes, too short for a safetensors header")
    n = struct.unpack("<Q", blob[:8])[0]
    if 8 + n > len(blob):
        raise ValueError(f"{path}: header of {n} bytes runs past the file's {len(blob)}")
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {}) or {}
    data = blob[8 + n:]
    out = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        dtype = _DTYPES.get(e["dtype"])
        if dtype is None:
            raise ValueError(f"{path}: {name}: dtype {e['dtype']} not read here")
        t = torch.frombuffer(bytearray(data[b:end]), dtype=dtype) if end > b else torch.empty(0, dtype=dtype)
        out[name] = t.reshape(e["shape"]).clone()
    return out, meta


def checkpoint_dir(path):
    """A step folder: PATH itself, or the one PATH/latest names."""
    latest = os.path.join(path, "latest")
    if os.path.isfile(latest):
        with open(latest) as f:
            return os.path.join(path, f.read().strip())
    return path


def read_plan_train(path):
    """The train keys of a plan file (docs/plan.md) a training step needs."""
    with open(path) as f:
        text = f.read()
    sect = re.search(r"^train:\n((?:  .*\n)+)", text, re.M)
    if not sect:
        raise ValueError(f"{path}: no train section")
    keys = {}
    for line in sect.group(1).splitlines():
        k, _, v = line.strip().partition(": ")
        keys[k] = v
    def flow(v):  # {kind: adamw, lr: 0.003, ...}
        return {a.strip(): b.strip() for a, b in (kv.split(":", 1) for kv in v.strip("{}").split(","))}
    opt, sched = flow(keys["optimizer"]), flow(keys["lr_schedule"])
    return {
        "global_batch": int(keys["global_batch"]), "micro_batch": int(keys["micro_batch"]),
        "seq_len": int(keys["seq_len"]),
        "steps": int(keys["steps"]), "precision": keys["precision"], "tp": plan_tp(text),
        "lr": float(opt["lr"]), "beta1": float(opt["beta1"]), "beta2": float(opt["beta2"]),
        "eps": float(opt["eps"]), "weight_decay": float(opt["weight_decay"]),
        "clip": float(opt["clip"]), "schedule": sched["kind"],
        "warmup": int(sched.get("warmup", 0)), "min_lr": float(sched.get("min_lr", 0)),
    }


def plan_tp(text):
    """The tensor-parallel degree of a plan's mesh section (text: the plan)."""
    m = re.search(r"^mesh:\n(?:  .*\n)*?  tp: (\d+)$", text, re.M)
    return int(m.group(1)) if m else 1


def read_plan_ops(path):
    """{op: attributes} of the first tensor of each op in a plan (heads and
    kv_heads of attention, theta of rope, eps of the norms, top_k, capacity
    and aux_loss of moe, vocab of cross_entropy): the models here give every
    op of a kind the same attributes."""
    with open(path) as f:
        text = f.read()
    ops = {}
    for entry in text[text.find("\ntensors:"):].split("\n- id: ")[1:]:
        op = re.search(r"^  op: (\w+)$", entry, re.M)
        if op and op.group(1) not in ops:
            ops[op.group(1)] = dict(re.findall(r"^    (\w+): (\S+)$", entry, re.M))
    return ops


def lr_at(t, step):
    """The learning rate of 1-based step `step`: linear warm-up to lr over
    `warmup` steps, then a cosine (or linear) decay to min_lr at `steps`;
    llm.c's schedule, from the plan's keys."""
    if t["warmup"] > 0 and step <= t["warmup"]:
        return t["lr"] * step / t["warmup"]
    if t["schedule"] not in ("cosine", "linear") or t["steps"] <= t["warmup"]:
        return t["lr"]
    frac = min(1.0, (step - t["warmup"]) / (t["steps"] - t["warmup"]))
    shape = 0.5 * (1 + math.cos(math.pi * frac)) if t["schedule"] == "cosine" else 1 - frac
    return t["min_lr"] + (t["lr"] - t["min_lr"]) * shape


def read_shard(path):
    """The tokens of an llm.c shard (header: 256 int32, magic 20240520)."""
    with open(path, "rb") as f:
        blob = f.read()
    magic, version, n = struct.unpack("<3i", blob[:12]) if len(blob) >= 1024 else (0, 0, 0)
    if magic != 20240520 or version != 1 or len(blob) != 1024 + 2 * n:
        raise ValueError(f"{path}: not an llm.c token shard of version 1")
    return torch.frombuffer(bytearray(blob[1024:]), dtype=torch.int16).to(torch.int64) & 0xFFFF


def batch(tokens, first, count, T):
    """(inputs, targets) [count, T]: windows first .. first + count - 1 of T
    tokens each, the next token as the last target, wrapping around."""
    windows = (tokens.numel() - 1) // T
    idx = [(first + i) % windows for i in range(count)]
    x = torch.stack([tokens[w * T:w * T + T] for w in idx])
    y = torch.stack([tokens[w * T + 1:w * T + T + 1] for w in idx])
    return x, y


# --- the storage's precision ------------------------------------------------
#
# A bf16 or fp16 plan keeps every tensor in 2 bytes (docs/gpu.md,
# "Precision"): each op computes in fp32 from its 2-byte inputs and rounds its
# result once, as it stores it, and its backward the gradients it stores;
# with fp16 the gradients are of the loss times the loss scale. stored() is
# that rounding, forward and backward, at the points the models below call it.
# The weights an op reads are the 2-byte copy of the fp32 master weights;
# a matmul's, an embedding's, a norm's and a bias's gradients are summed in
# fp32 by the op itself (weight()), the experts' and the router's of a moe op
# are stored in 2 bytes and added to an fp32 gradient (stored()). Neither does
# anything in fp32 (set_storage(None), the default).
#
# Over tp ranks, a partial sum is stored too before the all-reduce (in fp32)
# adds the ranks' up, and their sum stored: a row-parallel matmul's output
# (row_parallel()), a column-parallel one's input gradient (fanout()'s
# aliases a rank each, matmul()).

_storage = {"dtype": None, "scale": 1.0, "tp": 1}


def set_storage(dtype, loss_scale=1.0, tp=1):
    """Round at the storage points to dtype (torch.bfloat16, torch.float16 or
    None for fp32); the backward's gradients are rounded times loss_scale;
    the partial sums of tp ranks are rounded before they are added."""
    _storage["dtype"], _storage["scale"], _storage["tp"] = dtype, float(loss_scale), int(tp)


def _round(x):
    """x rounded to the storage's type (nearest even), kept in x's."""
    return x.to(_storage["dtype"]).to(x.dtype)


class _Stored(torch.autograd.Function):
    """x rounded to the storage's type; its gradient too (scaled by the loss
    scale while rounded: an fp16 overflow comes back as inf)."""

    @staticmethod
    def forward(ctx, x):
        return _round(x)

    @staticmethod
    def backward(ctx, g):
        return _round_grad(g)


def stored(x):
    """x as a bf16 or fp16 plan stores it (see above); x itself in fp32."""
    return x if _storage["dtype"] is None else _Stored.apply(x)


def _round_grad(g):
    S = _storage["scale"]
    return _round(g * S) / S


class _Fanout(torch.autograd.Function):
    """n x tp aliases of x for n ops that read it on each of tp ranks: on a
    rank, their backwards, run in the reverse order, add into x's stored
    gradient one after another, each sum stored (rounded; autograd would add
    them up first and round once); over tp ranks, each rank's sum is partial,
    the all-reduce adds them, and their sum is stored."""

    @staticmethod
    def forward(ctx, x, n, tp):
        ctx.tp = tp
        return tuple(x.view_as(x) for _ in range(n * tp))

    @staticmethod
    def backward(ctx, *gs):
        tp, ranks = ctx.tp, []
        for r in range(tp):
            acc = None
            for g in reversed(gs[r::tp]):  # reader j, rank r: gs[j * tp + r]
                if g is not None:
                    acc = _round_grad(g if acc is None else acc + g)
            ranks.append(acc)
        ranks = [g for g in ranks if g is not None]
        total = None if not ranks else ranks[0] if tp == 1 else _round_grad(sum(ranks))
        return total, None, None


def fanout(x, n):
    """x for n readers (the forward's order), as _Fanout: a list of n, each
    the tp ranks' aliases of x (for matmul()); [[x]] * n in fp32."""
    if _storage["dtype"] is None:
        return [[x]] * n
    tp = _storage["tp"]
    a = _Fanout.apply(x, n, tp)
    return [list(a[j * tp:(j + 1) * tp]) for j in range(n)]


def _split(n, tp):
    """Rank r's part of n: the r-th of tp equal runs."""
    k = n // tp
    return [torch.arange(r * k, (r + 1) * k) for r in range(tp)]


def matmul(xs, w, cols=None):
    """x @ w for fanout()'s aliases xs of x for this reader: with tp ranks,
    w column-parallel, rank r computing the columns cols[r] (default: the
    r-th of tp equal runs) from its alias."""
    if len(xs) == 1:
        return xs[0] @ w
    cols = cols or _split(w.shape[1], len(xs))
    y = torch.cat([x @ w[:, c] for x, c in zip(xs, cols)], -1)
    return y[..., torch.argsort(torch.cat(cols))]


def row_parallel(x, w):
    """x @ w, stored, for w row-parallel over the tp ranks (split along its
    rows, x along its last dim): each rank's partial sum stored, then their
    sum (the all-reduce's, in fp32) stored."""
    tp = _storage["tp"]
    if _storage["dtype"] is None or tp == 1:
        return stored(x @ w)
    return stored(sum(stored(x[..., r] @ w[r]) for r in _split(w.shape[0], tp)))


class _Weight(torch.autograd.Function):
    """A master weight's 2-byte copy; its gradient is summed in fp32."""

    @staticmethod
    def forward(ctx, w):
        return _round(w)

    @staticmethod
    def backward(ctx, g):
        return g


def weight(w):
    """The copy of master weight w that a bf16 or fp16 plan's ops read, its
    gradient summed in fp32 (see above); w itself in fp32."""
    return w if _storage["dtype"] is None else _Weight.apply(w)


# --- the operators ---------------------------------------------------------

def attention(q, k, v):
    """Causal attention: q [B, H, T, d], k and v [B, KV, T, d]; query head h
    reads kv head h / (H / KV). The scale is 1 / sqrt(d). With a 2-byte
    storage, its backward is _Attention's."""
    if _storage["dtype"] is not None:
        return _Attention.apply(q, k, v)
    return _attention(q, k, v)


def _attention(q, k, v):
    H, KV = q.shape[1], k.shape[1]
    if KV != H:
        k = k.repeat_interleave(H // KV, dim=1)
        v = v.repeat_interleave(H // KV, dim=1)
    if hasattr(F, "scaled_dot_product_attention"):  # PyTorch 2: flash attention on a GPU
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    T = q.shape[2]
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    return torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1) @ v


class _Attention(torch.autograd.Function):
    """attention() whose backward is a fused kernel's, FlashAttention's: from
    the probabilities p and the output's gradient dout, ds = p (dp - D) with
    dp = dout v^T and D = dout . out per row, where out is the output as
    stored (rounded), not as computed; the exact gradient's D is of the
    latter."""

    @staticmethod
    def forward(ctx, q, k, v):
        out = _attention(q, k, v)
        ctx.save_for_backward(q, k, v, _round(out))
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out = ctx.saved_tensors
        H, KV, T, d = q.shape[1], k.shape[1], q.shape[2], q.shape[3]
        g = H // KV
        ke, ve = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
        mask = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
        p = torch.softmax((q @ ke.transpose(-1, -2) / math.sqrt(d)).masked_fill(mask, float("-inf")), dim=-1)
        D = (dout * out).sum(-1, keepdim=True)
        ds = p * (dout @ ve.transpose(-1, -2) - D) / math.sqrt(d)
        dk, dv = ds.transpose(-1, -2) @ q, p.transpose(-1, -2) @ dout  # per query head
        B = q.shape[0]
        return (ds @ ke, dk.view(B, KV, g, T, d).sum(2), dv.view(B, KV, g, T, d).sum(2))


def linear(x, w, b, cols=None, row=False):
    """x @ w + b for w stored [in, out], through F.linear (one GEMM with
    the bias in it, as nn.Linear; the transpose is a view). With a 2-byte
    storage, the plan's two ops (matmul, bias_add), each stored, and over tp
    ranks w row-parallel (row) or column-parallel (x fanout()'s aliases,
    cols as matmul()'s)."""
    if _storage["dtype"] is None:
        return F.linear(x[0] if isinstance(x, list) else x, w.t(), b)
    y = row_parallel(x, w) if row else stored(matmul(x if isinstance(x, list) else [x], w, cols))
    return stored(y + b)


def heads(x, n):
    """[B, T, n * d] -> [B, n, T, d]."""
    B, T, C = x.shape
    return x.view(B, T, n, C // n).transpose(1, 2)


def merge(y):
    """[B, H, T, d] -> [B, T, H * d]."""
    B, H, T, d = y.shape
    return y.transpose(1, 2).reshape(B, T, H * d)


def rmsnorm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, theta):
    """Rotate-half rotary embedding (GPT-NeoX, Hugging Face Llama) of
    x [B, H, T, d]: channel j < d/2 pairs with j + d/2 and turns by
    t * theta^(-2j/d)."""
    T, d = x.shape[2], x.shape[3]
    j = torch.arange(d // 2, dtype=torch.float64)
    a = torch.arange(T, dtype=torch.float64)[:, None] * theta ** (-2.0 * j / d)
    c, s = torch.cos(a).to(x.dtype).to(x.device), torch.sin(a).to(x.dtype).to(x.device)
    x1, x2 = x[..., :d // 2], x[..., d // 2:]
    return torch.cat([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1)


def cross_entropy(logits, targets, vocab=None):
    """The mean over tokens; with vocab, the logits past it (padding) are
    left out, as cross_entropy(..., vocab: vocab) does."""
    if vocab is not None and vocab < logits.shape[-1]:
        logits = logits[..., :vocab]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


# --- the models ------------------------------------------------------------

def layers_of(params, prefix):
    """How many blocks `prefix.N.` the parameters hold."""
    n = [int(m.group(1)) for m in (re.match(re.escape(prefix) + r"\.(\d+)\.", k) for k in params) if m]
    return max(n) + 1 if n else 0


def gpt2_logits(P, tokens, n_heads, eps=1e-5):
    """examples/gpt2.mesh and gpt-tiny.mesh: learned positions, pre-LN GPT-2
    blocks (tanh GELU, biases everywhere), the LM head tied to wte."""
    T, C = tokens.shape[1], P["wte"].shape[1]
    W = lambda n: weight(P[n])  # noqa: E731
    # the tokens' embeddings are stored; the positions' [T, C] gradient, the
    # batch's sum, is summed in fp32 into wpe's (memplan_pos_table), as a
    # bias's is: stored, it would overflow fp16 B times sooner than the rest
    x = stored(stored(W("wte")[tokens]) + W("wpe")[:T])
    tp = _storage["tp"]
    qkv_cols = [torch.cat([b * C + c for b in range(3)]) for c in _split(C, tp)]  # q, k, v of a rank's heads
    for i in range(layers_of(P, "h")):
        p = lambda n: W(f"h.{i}.gpt2_block.{n}")  # noqa: E731
        n = fanout(stored(F.layer_norm(x, (C,), p("ln1_w"), p("ln1_b"), eps)), 1)[0]
        qkv = linear(n, p("w_qkv"), p("b_qkv"), qkv_cols)
        q, k, v = (heads(t, n_heads) for t in qkv.split(C, dim=-1))
        h = stored(x + linear(stored(merge(attention(q, k, v))), p("w_o"), p("b_o"), row=True))
        n = fanout(stored(F.layer_norm(h, (C,), p("ln2_w"), p("ln2_b"), eps)), 1)[0]
        m = stored(F.gelu(linear(n, p("w_fc"), p("b_fc")), approximate="tanh"))
        x = stored(h + linear(m, p("w_out"), p("b_out"), row=True))
    n = fanout(stored(F.layer_norm(x, (C,), W("ln_f_w"), W("ln_f_b"), eps)), 1)[0]
    return stored(matmul(n, W("wte").t()))  # x @ wte^T (the vocabulary split over tp)


def gpt2_loss(P, tokens, targets, n_heads, vocab=None, eps=1e-5):
    """gpt2_logits' cross-entropy (the padding past vocab left out)."""
    return cross_entropy(gpt2_logits(P, tokens, n_heads, eps), targets, vocab)


class _Expert(torch.autograd.Function):
    """One SwiGLU expert as meshrun's moe op runs it in 2 bytes, one kernel
    call (kernels/cpu/moe.c) whose results are stored after it: the forward
    computes hg, hu, their product act and ye = act @ w_down in fp32 and
    stores them (ye from the unrounded act); the backward reads the stored
    hg, hu, act, keeps d act, dg and du in fp32, and stores dx (its two
    products summed first). The weights' gradients are the caller's to store
    (moe()'s stored() weights)."""

    @staticmethod
    def forward(ctx, x, wg, wu, wd):
        hg, hu = x @ wg, x @ wu
        act = F.silu(hg) * hu
        ctx.save_for_backward(x, wg, wu, wd, _round(hg), _round(hu), _round(act))
        return _round(act @ wd)

    @staticmethod
    def backward(ctx, dy):
        x, wg, wu, wd, hg, hu, act = ctx.saved_tensors
        dact = dy @ wd.t()
        s = torch.sigmoid(hg)
        dg, du = dact * hu * s * (1 + hg * (1 - s)), dact * hg * s
        return _round_grad(dg @ wg.t() + du @ wu.t()), x.t() @ dg, x.t() @ du, act.t() @ dy


def moe_capacity(N, E, K, factor):
    """ceil(factor N K / E), a relative excess below 1e-9 ignored, at least 1."""
    c = factor * N * K / E
    return max(1, math.ceil(c - 1e-9 * c)) if N > 0 else 0


def moe(h, router, w_gate, w_up, w_down, top_k, capacity):
    """The moe op over the tokens of h [B, T, D] (one micro-batch), as
    docs/language.md states it: softmax router probabilities p, each token to
    its top_k experts (the largest p first, ties to the lower expert), weighted
    by p renormalised over them; an expert keeps the first
    ceil(capacity N top_k / E) tokens in token order and drops the rest. Returns
    (y, aux): aux = E sum_e f_e P_e, f_e the share of the N top_k choices that
    picked e (before capacity), P_e the mean of p[., e]."""
    B, T, D = h.shape
    # x's readers: the routing (fp32), then the dispatch (x's rows copied
    # to their experts; their stored gradients summed, then the routing's added)
    if _storage["dtype"] is not None and _storage["tp"] > 1:
        raise ValueError("moe over tp ranks in 2 bytes is not written here")
    (x_route,), (x,) = fanout(h.reshape(B * T, D), 2)
    N, E = x.shape[0], router.shape[1]
    p = torch.softmax(x_route @ router, dim=-1)
    _, idx = torch.sort(p.detach(), dim=-1, descending=True, stable=True)
    idx = idx[:, :top_k]
    w = p.gather(1, idx)
    w = w / w.sum(-1, keepdim=True)
    C = moe_capacity(N, E, top_k, capacity)
    flat = idx.reshape(-1)  # (token, k) pairs in token order
    onehot = F.one_hot(flat, E)
    rank = ((onehot.cumsum(0) - 1) * onehot).sum(-1)  # place in its expert's queue
    keep = (rank < C).reshape(N, top_k)
    y = torch.zeros_like(x)
    for e in range(E):
        n, k = torch.nonzero((idx == e) & keep, as_tuple=True)
        if n.numel() == 0:
            continue
        xe = stored(x[n])
        if _storage["dtype"] is None:
            ye = (F.silu(xe @ w_gate[e]) * (xe @ w_up[e])) @ w_down[e]
        else:  # (the combine's backward stores ye's gradient: the outer stored())
            ye = stored(_Expert.apply(xe, w_gate[e], w_up[e], w_down[e]))
        y = y.index_add(0, n, ye * w[n, k].unsqueeze(-1))
    f = torch.bincount(flat, minlength=E).to(p.dtype) / (N * top_k)
    aux = E * (f * p.mean(0)).sum()
    return stored(y).reshape(B, T, D), aux


def llama_logits(P, tokens, n_heads, kv_heads, theta=10000.0, eps=1e-5,
                 top_k=2, capacity=1.25, aux_loss=0.01):
    """(logits, extra) of examples/llama.mesh: RMSNorm, rotary q and k,
    grouped-query attention, SwiGLU, no biases, an untied LM head. With
    moe_block layers (examples/moe.mesh), the MLP is moe() over SwiGLU
    experts, and extra, which the loss adds, is the sum of each layer's
    aux_loss x aux (0 without)."""
    W = lambda n: weight(P[n])  # noqa: E731
    x = stored(W("embedding")[tokens])
    kind = "moe_block" if any(".moe_block." in k for k in P) else "llama_block"
    extra = 0.0
    for i in range(layers_of(P, "layers")):
        p = lambda n: W(f"layers.{i}.{kind}.{n}")  # noqa: E731
        e = lambda n: stored(P[f"layers.{i}.{kind}.{n}"])  # noqa: E731  (the moe op's)
        n1, n2, n3 = fanout(stored(rmsnorm(x, p("attn_norm"), eps)), 3)
        q = stored(rope(heads(stored(matmul(n1, p("wq"))), n_heads), theta))
        k = stored(rope(heads(stored(matmul(n2, p("wk"))), kv_heads), theta))
        v = heads(stored(matmul(n3, p("wv"))), kv_heads)
        r = stored(x + row_parallel(stored(merge(attention(q, k, v))), p("wo")))
        h = stored(rmsnorm(r, p("ffn_norm"), eps))
        if kind == "moe_block":
            y, aux = moe(h, e("router"), e("w_gate"), e("w_up"), e("w_down"), top_k, capacity)
            x, extra = stored(r + y), extra + aux_loss * aux
        else:
            h1, h2 = fanout(h, 2)
            sw = stored(F.silu(stored(matmul(h1, p("w_gate")))) * stored(matmul(h2, p("w_up"))))
            x = stored(r + row_parallel(sw, p("w_down")))
    n = fanout(stored(rmsnorm(x, W("final_norm"), eps)), 1)[0]
    return stored(matmul(n, W("lm_head"))), extra


class PlanModel:
    """The model of a checkpoint's parameters P (their names tell which)
    with the attributes of its plan's ops (read_plan_ops): kind ("gpt2",
    "llama" or "moe") and loss(tokens, targets) as meshrun's."""

    def __init__(self, P, ops):
        att = ops.get("attention")
        if not att:
            raise ValueError("the plan has no attention op")
        self.P, self.H = P, int(att["heads"])
        self.KV = int(att.get("kv_heads", self.H))
        self.eps = float((ops.get("layernorm") or ops.get("rmsnorm") or {}).get("eps", 1e-5))
        self.vocab = int(ops.get("cross_entropy", {}).get("vocab", 0)) or None
        self.theta = float(ops.get("rope", {}).get("theta", 10000.0))
        self.moe = ()  # top_k, capacity, aux_loss: moe's
        if "wte" in P and any(".gpt2_block." in k for k in P):
            self.kind = "gpt2"
        elif "embedding" in P:
            m = ops.get("moe")
            self.kind = "llama" if m is None else "moe"
            if m is not None:
                if m.get("act", "swiglu") != "swiglu":
                    raise ValueError(f"moe act: {m['act']}: only swiglu experts are written here")
                self.moe = (int(m.get("top_k", 2)), float(m.get("capacity", 1.25)),
                            float(m.get("aux_loss", 0.01)))
        else:
            raise ValueError("the parameters are neither gpt2.mesh's (wte, h.N.gpt2_block) nor "
                             "llama.mesh's or moe.mesh's (embedding, layers.N)")

    def _forward(self, tokens):
        if self.kind == "gpt2":
            return gpt2_logits(self.P, tokens, self.H, self.eps), 0.0
        return llama_logits(self.P, tokens, self.H, self.KV, self.theta, self.eps, *self.moe)

    def loss(self, tokens, targets):
        logits, extra = self._forward(tokens)
        return cross_entropy(logits, targets, self.vocab) + extra


def gpt2_init(V, T, L, C, device="cpu", seed=0):
    """GPT-2's parameters as gpt2.mesh initialises them (normal 0.02, the
    residual projections 0.02 / sqrt(2 L), norms ones, biases zeros), under
    mesh's names; not mesh's random stream."""
    g = torch.Generator().manual_seed(seed)
    def normal(*shape, std=0.02):
        return (torch.randn(*shape, generator=g) * std).to(device)
    P = {"wte": normal(V, C), "wpe": normal(T, C),
         "ln_f_w": torch.ones(C, device=device), "ln_f_b": torch.zeros(C, device=device)}
    proj = 0.02 / math.sqrt(2 * L)
    for i in range(L):
        b = f"h.{i}.gpt2_block."
        P.update({b + "ln1_w": torch.ones(C, device=device), b + "ln1_b": torch.zeros(C, device=device),
                  b + "w_qkv": normal(C, 3 * C), b + "b_qkv": torch.zeros(3 * C, device=device),
                  b + "w_o": normal(C, C, std=proj), b + "b_o": torch.zeros(C, device=device),
                  b + "ln2_w": torch.ones(C, device=device), b + "ln2_b": torch.zeros(C, device=device),
                  b + "w_fc": normal(C, 4 * C), b + "b_fc": torch.zeros(4 * C, device=device),
                  b + "w_out": normal(4 * C, C, std=proj), b + "b_out": torch.zeros(C, device=device)})
    return P


def adamw(P, lr, betas, eps, weight_decay, **kw):
    """torch.optim.AdamW over the parameters, weight decay on matrices and
    embeddings only (dimension 2 or more), as meshrun and llm.c decay."""
    decay = [t for t in P.values() if t.dim() >= 2]
    rest = [t for t in P.values() if t.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": rest, "weight_decay": 0.0}],
                             lr=lr, betas=betas, eps=eps, **kw)
