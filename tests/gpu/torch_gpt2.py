#!/usr/bin/env python3
"""tests/gpu/torch_gpt2.py: the PyTorch reference point for a GPU machine.

Trains GPT-2 124M (12 layers, 12 heads, 768 wide, vocabulary padded to
50304, T = 1024, tied embeddings, tanh GELU) on random tokens for a few
steps: fp32 master weights, bf16 autocast, fused AdamW, flash attention
through scaled_dot_product_attention; eager, and compiled when asked. Prints
one line per configuration and a JSON summary:

  tokens/s  = B * T * steps / seconds (after warm-up steps)
  MFU       = tokens/s * (6 N + 6 L C T) / 989e12: llm.c's FLOPs per token
              (train_gpt2.cu; N counts the padded vocabulary once, as tied:
              124.48M), against NVIDIA's dense bf16 peak of the H100/H200
              SXM, 989 TFLOP/s.

usage: torch_gpt2.py [--batch 16,32] [--steps 20] [--warmup 5] [--compile]
                     [--json FILE] [--budget-s SECONDS]
"""
import argparse
import json
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

PEAK_BF16 = 989e12


class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.ln1 = nn.LayerNorm(C)
        self.qkv = nn.Linear(C, 3 * C)
        self.proj = nn.Linear(C, C)
        self.ln2 = nn.LayerNorm(C)
        self.fc = nn.Linear(C, 4 * C)
        self.fc_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, V=50304, T=1024, L=12, H=12, C=768):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.blocks = nn.ModuleList(Block(C, H) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        self.head = nn.Linear(C, V, bias=False)
        self.head.weight = self.wte.weight  # tied
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1))


def run(B, T, steps, warmup, compiled, L=12, C=768):
    torch.manual_seed(0)
    model = GPT(T=T, L=L, C=C).cuda()
    nparams = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.1, fused=True)
    step_model = torch.compile(model) if compiled else model
    x = torch.randint(0, 50257, (B, T), device="cuda")
    y = torch.randint(0, 50257, (B, T), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    t_compile = time.perf_counter()
    for _ in range(warmup):
        loss = step()
    torch.cuda.synchronize()
    t_compile = time.perf_counter() - t_compile
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step()
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    tok_s = B * T * steps / dt
    flops_per_token = 6 * nparams + 6 * L * C * T
    mfu = tok_s * flops_per_token / PEAK_BF16
    del model, opt, step_model
    torch.cuda.empty_cache()
    return {
        "B": B, "T": T, "compile": compiled, "steps": steps, "warmup": warmup,
        "params": nparams, "step_ms": round(1000 * dt / steps, 2),
        "tokens_per_s": round(tok_s), "flops_per_token": flops_per_token,
        "mfu": round(mfu, 4), "warmup_s": round(t_compile, 1),
        "loss": round(float(loss), 4),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", default="16,32")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--budget-s", type=float, default=240.0)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("SKIP torch: torch.cuda.is_available() is False")
        return 0
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    t_start = time.perf_counter()
    out = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0),
           "mfu_formula": "tokens/s * (6N + 6LCT) / 989e12 (llm.c)", "runs": []}
    configs = [(int(b), False) for b in a.batch.split(",")]
    if a.compile:
        configs.append((int(a.batch.split(",")[-1]), True))
    for B, compiled in configs:
        left = a.budget_s - (time.perf_counter() - t_start)
        if left < (120 if compiled else 30):
            print(f"torch gpt2: B={B} compile={compiled}: skipped, {left:.0f} s left of the budget")
            continue
        try:
            r = run(B, 1024, a.steps, a.warmup, compiled)
        except Exception as e:  # out of memory, a compile failure: say so, go on
            print(f"torch gpt2: B={B} compile={compiled}: FAILED: {type(e).__name__}: {e}")
            out["runs"].append({"B": B, "compile": compiled, "error": f"{type(e).__name__}: {e}"[:300]})
            torch.cuda.empty_cache()
            continue
        out["runs"].append(r)
        print(f"torch gpt2 124M: B={B} T=1024 {'compiled' if compiled else 'eager'}: "
              f"{r['step_ms']:.1f} ms/step, {r['tokens_per_s']:,} tokens/s, MFU {100 * r['mfu']:.1f}% "
              f"(N={r['params'] / 1e6:.2f}M, warm-up {r['warmup_s']} s, loss {r['loss']})")
        sys.stdout.flush()
    best = max((r.get("tokens_per_s", 0) for r in out["runs"]), default=0)
    out["best_tokens_per_s"] = best
    print(f"torch gpt2 124M: best {best:,} tokens/s (for scale: llm.c reached 471K tokens/s "
          f"per GPU on 8 H100s)")
    print("JSON " + json.dumps(out))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f)
            f.write("\n")
    return 0 if best > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
