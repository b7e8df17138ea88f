#!/usr/bin/env python3
"""tests/gpu/torch_gpt2.py: the PyTorch reference point for a GPU machine.

Trains GPT-2 124M (12 layers, 12 heads, 768 wide, vocabulary padded to
50304, T = 1024, tied embeddings, tanh GELU) on random tokens for a few
steps: fp32 master weights, bf16 autocast, fused AdamW, flash attention
through scaled_dot_product_attention; eager, and compiled when asked.

The model is tests/torch/mesh_torch.py's gpt2_loss, the one the torch
section of `make test` trains next to meshrun to the same losses: this
figure is for the model meshrun trains. (Here the padding logits stay in
the softmax, as in llm.c's PyTorch reference, which saves a copy of the
logits; the FLOPs are the same.) Prints one line per configuration and a
JSON summary:

  tokens/s  = B * T * steps / seconds (after warm-up steps)
  MFU       = tokens/s * (6 N + 6 L C T) / 989e12: llm.c's FLOPs per token
              (train_gpt2.cu; N counts the padded vocabulary once, as tied:
              124.48M), against NVIDIA's dense bf16 peak of the H100/H200
              SXM, 989 TFLOP/s.

usage: torch_gpt2.py [--batch 16,32] [--steps 20] [--warmup 5] [--compile]
                     [--json FILE] [--budget-s SECONDS] [--device cuda|cpu]
                     [--tiny]

--device cpu --tiny (2 layers, width 64, T = 64, vocabulary 256) runs the
whole script on a CPU, as `make gpu-rehearse` does: no figure of it means
anything but that the script works.
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "torch"))
import mesh_torch as mt  # noqa: E402

PEAK_BF16 = 989e12


def run(B, T, steps, warmup, compiled, device, L=12, H=12, C=768, V=50304):
    torch.manual_seed(0)
    P = mt.gpt2_init(V, T, L, C, device=device)
    for p in P.values():
        p.requires_grad_(True)
    nparams = sum(p.numel() for p in P.values())
    opt = mt.adamw(P, 6e-4, (0.9, 0.95), 1e-8, 0.1,
                   **({"fused": True} if device == "cuda" else {}))
    loss_fn = torch.compile(mt.gpt2_loss) if compiled else mt.gpt2_loss
    x = torch.randint(0, min(V, 50257), (B, T), device=device)
    y = torch.randint(0, min(V, 50257), (B, T), device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def step():
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = loss_fn(P, x, y, H)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    t_compile = time.perf_counter()
    for _ in range(warmup):
        loss = step()
    sync()
    t_compile = time.perf_counter() - t_compile
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step()
    sync()
    dt = time.perf_counter() - t0
    tok_s = B * T * steps / dt
    flops_per_token = 6 * nparams + 6 * L * C * T
    mfu = tok_s * flops_per_token / PEAK_BF16
    del P, opt
    if device == "cuda":
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
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--tiny", action="store_true")
    a = ap.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        print("SKIP torch: torch.cuda.is_available() is False")
        return 0
    if a.compile and not hasattr(torch, "compile"):
        print(f"torch gpt2: no torch.compile in PyTorch {torch.__version__}: eager only")
        a.compile = False
    shape = dict(L=2, H=2, C=64, V=256) if a.tiny else {}
    T = 64 if a.tiny else 1024
    name = "tiny GPT-2 (2 layers, width 64)" if a.tiny else "gpt2 124M"
    if a.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    t_start = time.perf_counter()
    out = {"torch": torch.__version__,
           "device": torch.cuda.get_device_name(0) if a.device == "cuda" else "cpu",
           "tiny": a.tiny, "mfu_formula": "tokens/s * (6N + 6LCT) / 989e12 (llm.c)", "runs": []}
    configs = [(int(b), False) for b in a.batch.split(",")]
    if a.compile:
        configs.append((int(a.batch.split(",")[-1]), True))
    for B, compiled in configs:
        left = a.budget_s - (time.perf_counter() - t_start)
        if left < (120 if compiled else 30):
            print(f"torch gpt2: B={B} compile={compiled}: skipped, {left:.0f} s left of the budget")
            continue
        try:
            r = run(B, T, a.steps, a.warmup, compiled, a.device, **shape)
        except Exception as e:  # out of memory, a compile failure: say so, go on
            print(f"torch gpt2: B={B} compile={compiled}: FAILED: {type(e).__name__}: {e}")
            out["runs"].append({"B": B, "compile": compiled, "error": f"{type(e).__name__}: {e}"[:300]})
            if a.device == "cuda":
                torch.cuda.empty_cache()
            continue
        out["runs"].append(r)
        print(f"torch {name}: B={B} T={T} {'compiled' if compiled else 'eager'}: "
              f"{r['step_ms']:.1f} ms/step, {r['tokens_per_s']:,} tokens/s, MFU {100 * r['mfu']:.1f}% "
              f"(N={r['params'] / 1e6:.2f}M, warm-up {r['warmup_s']} s, loss {r['loss']})")
        sys.stdout.flush()
    best = max((r.get("tokens_per_s", 0) for r in out["runs"]), default=0)
    out["best_tokens_per_s"] = best
    print(f"torch {name}: best {best:,} tokens/s (for scale: llm.c reached 471K tokens/s "
          f"per GPU on 8 H100s)")
    print("JSON " + json.dumps(out))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f)
            f.write("\n")
    return 0 if best > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
