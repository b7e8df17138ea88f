#!/usr/bin/env python3
"""tests/torch/check_train.py: train in PyTorch next to meshrun, step for step.

Starts from a checkpoint meshrun wrote (its parameters, AdamW's moments and
step count, the data position), trains the model of mesh_torch.py the
steps meshrun trained after it, on the same windows of the same shard, at
the plan's learning rate, with torch.optim.AdamW and PyTorch's gradient
clipping, and compares:

  - each step's loss and gradient norm with meshrun's --metrics lines
    (the loss: the forward; the norm: the backward);
  - the learning rate meshrun logged with llm.c's schedule;
  - the validation loss meshrun logged after the last step, if it did (the
    first 8 global batches of --val, else --data; the evaluation's forward);
  - every parameter after the last step with meshrun's final checkpoint
    (the optimizer, over all the steps).

usage: check_train.py --plan PLAN --data SHARD [--val SHARD] --from CKPT
         --to CKPT --metrics JSONL [--loss-tol R] [--norm-tol R]
         [--param-tol R] [--dtype float64|float32]

The model (gpt2.mesh's, llama.mesh's or moe.mesh's blocks) is told by the
checkpoint's parameter names, its sizes by their shapes, and the rest
(heads, kv_heads, theta, eps, top_k, capacity, aux_loss, vocab) by the
plan's ops; the learning rate, AdamW and clipping by the plan's train keys.

Prints a line per step and `PASS ...` or `FAIL ...`; exits 0 on a pass.
The tolerances are relative: for the losses and norms |a - b| / |b|; for a
parameter tensor its largest difference over the largest change meshrun
made to it in those steps (so that a wrong weight decay of gains near 1
shows). meshrun trains in fp32; PyTorch computes in float64 (--dtype), so
that the differences are meshrun's rounding alone: in fp32, PyTorch's own
rounding over GPT-2's 50304 logits was 1e-4 of the gradient norm, where
meshrun's is 4e-8 (tests/torch/README.md).
"""
import argparse
import json
import os
import sys

import torch

import mesh_torch as mt


# The key part of GPT-2's b_qkv has a gradient of exactly 0 (adding b to
# every key adds q . b to every score of a row, which the softmax ignores),
# so what both sides compute for it is rounding noise, which AdamW's
# normalisation turns into steps of full size: it is left out.
key_bias_note = ("parameters: the key bias (b_qkv's middle third) left out: its gradient is 0 "
                 "but for rounding, which AdamW scales up")


def rel(a, b, floor=1e-3):
    return abs(a - b) / max(abs(b), floor)


def main():
    ap = argparse.ArgumentParser(description="train in PyTorch next to meshrun, step for step")
    ap.add_argument("--plan", required=True, help="the plan meshrun trained")
    ap.add_argument("--data", required=True, help="its training shard (one)")
    ap.add_argument("--val", help="its validation shard (one; default: --data), for the val_loss "
                    "--metrics logs after the last step")
    ap.add_argument("--from", dest="start", required=True, help="the checkpoint it resumed from")
    ap.add_argument("--to", required=True, help="the checkpoint it wrote at the end")
    ap.add_argument("--metrics", required=True, help="its --metrics file, a line per step")
    ap.add_argument("--loss-tol", type=float, default=2e-6)
    ap.add_argument("--norm-tol", type=float, default=2e-5)
    ap.add_argument("--param-tol", type=float, default=1e-3)
    ap.add_argument("--dtype", choices=["float64", "float32"], default="float64",
                    help="PyTorch's arithmetic (default float64: exact next to meshrun's fp32)")
    a = ap.parse_args()
    try:
        return check(a)
    except (OSError, ValueError, KeyError) as e:  # a missing file, a bad checkpoint or plan
        print(f"FAIL check_train: {type(e).__name__}: {e}")
        return 1


def check(a):
    t = mt.read_plan_train(a.plan)
    if t["precision"] != "fp32":
        print(f"FAIL check_train: the plan trains in {t['precision']}; this check compares fp32")
        return 1
    start = mt.checkpoint_dir(a.start)
    P, _ = mt.read_safetensors(os.path.join(start, "model.safetensors"))
    P0 = {k: v.clone() for k, v in P.items()}
    S, meta = mt.read_safetensors(os.path.join(start, "optim.safetensors"))
    dtype = getattr(torch, a.dtype)
    P = {k: v.to(dtype) for k, v in P.items()}
    S = {k: v.to(dtype) for k, v in S.items()}
    end, _ = mt.read_safetensors(os.path.join(mt.checkpoint_dir(a.to), "model.safetensors"))
    step0, adam0, pos = int(meta["step"]), int(meta["adam_steps"]), int(meta["data_position"])
    with open(a.metrics) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    logged = [m for m in lines if "loss" in m and m["step"] > step0]
    if not logged:
        print(f"FAIL check_train: {a.metrics} logs no step after {step0}")
        return 1
    tokens = mt.read_shard(a.data)
    model = mt.PlanModel(P, mt.read_plan_ops(a.plan))
    kind, loss_of = model.kind, model.loss

    for p in P.values():
        p.requires_grad_(True)
    opt = mt.adamw(P, t["lr"], (t["beta1"], t["beta2"]), t["eps"], t["weight_decay"])
    for name, p in P.items():  # AdamW's state as meshrun left it
        opt.state[p] = {"step": torch.tensor(float(adam0)), "exp_avg": S[name + ".m"].clone(),
                        "exp_avg_sq": S[name + ".v"].clone()}

    worst = {"loss": 0.0, "norm": 0.0, "lr": 0.0}
    B, T = t["global_batch"], t["seq_len"]

    def batch_loss(toks, first):
        """The global batch at window `first`: the mean of its micro-batches'
        losses, as meshrun takes it (moe routes each on its own)."""
        x, y = mt.batch(toks, first, B, T)
        mb = t["micro_batch"]
        return sum(loss_of(x[i:i + mb], y[i:i + mb]) for i in range(0, B, mb)) / (B // mb)

    params = list(P.values())
    for m in logged:
        step = m["step"]
        if step != step0 + 1:
            print(f"FAIL check_train: {a.metrics} skips from step {step0} to {step}; log every step")
            return 1
        loss = batch_loss(tokens, pos)
        loss.backward()
        norm = float(torch.nn.utils.clip_grad_norm_(params, t["clip"]) if t["clip"] > 0
                     else torch.sqrt(sum((p.grad.double() ** 2).sum() for p in params)))
        lr = mt.lr_at(t, step)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        opt.zero_grad(set_to_none=True)
        d = {"loss": rel(float(loss), m["loss"]), "norm": rel(norm, m["grad_norm"]),
             "lr": rel(lr, m["lr"], 1e-12)}
        for k in worst:
            worst[k] = max(worst[k], d[k])
        print(f"step {step}: loss torch {float(loss):.6f} meshrun {m['loss']:.6f} (rel {d['loss']:.1e}) | "
              f"norm torch {norm:.6f} meshrun {m['grad_norm']:.6f} (rel {d['norm']:.1e}) | lr {lr:.4e}")
        step0, pos = step, pos + B

    # the validation loss meshrun logged after the last step: the first 8
    # global batches of the validation shard, with the parameters of then
    val = [m for m in lines if "val_loss" in m and m["step"] == step0]
    if val:
        vtok = mt.read_shard(a.val or a.data)
        with torch.no_grad():
            vl = float(sum(batch_loss(vtok, g * B) for g in range(8)) / 8)
        worst["loss"] = max(worst["loss"], rel(vl, val[-1]["val_loss"]))
        print(f"val loss after step {step0}: torch {vl:.6f} meshrun {val[-1]['val_loss']:.6f} "
              f"(rel {rel(vl, val[-1]['val_loss']):.1e})")

    # A parameter's difference, against how far meshrun moved it over the
    # steps: a relative error of the updates (an absolute one would hide a
    # wrong weight decay of the gains in their size of 1).
    worst_p, worst_name = 0.0, ""
    with torch.no_grad():
        for name, p in P.items():
            if name not in end:
                print(f"FAIL check_train: {a.to} lacks {name}")
                return 1
            diff, moved = (p - end[name].to(p.dtype)).abs(), (end[name] - P0[name]).abs()
            if name.endswith(".b_qkv"):  # the key bias: see key_bias_note
                C = p.numel() // 3
                diff, moved = torch.cat([diff[:C], diff[2 * C:]]), torch.cat([moved[:C], moved[2 * C:]])
            r = float(diff.max()) / max(float(moved.max()), 1e-12)
            if r > worst_p:
                worst_p, worst_name = r, name
    if kind == "gpt2":
        print(key_bias_note)
    print(f"parameters after step {step0}: largest difference {worst_p:.1e} of the largest change "
          f"meshrun made to the tensor ({worst_name or '-'}), over {len(P)} tensors")
    # logged rates keep 6 significant digits
    ok = (worst["loss"] <= a.loss_tol and worst["norm"] <= a.norm_tol and worst["lr"] <= 1e-5
          and worst_p <= a.param_tol)
    verdict = "PASS" if ok else "FAIL"
    print(f"{verdict} check_train {kind}: {len(logged)} steps{' and the validation' if val else ''}; "
          f"worst relative differences: loss "
          f"{worst['loss']:.1e} (tolerance {a.loss_tol:g}), gradient norm {worst['norm']:.1e} "
          f"({a.norm_tol:g}), lr {worst['lr']:.1e}, parameters {worst_p:.1e} ({a.param_tol:g})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
