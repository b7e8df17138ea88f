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

A bf16 or fp16 plan is trained with mesh_torch's storage rounding (each op's
result and stored gradient rounded to 2 bytes, fp32 master weights, fp16's
loss scale as meshrun logged it, a step that overflows skipped). Its weights'
2-byte copies round apart as soon as two sets of fp32 masters differ in
their last bits, so the two runs drift apart at bf16's noise from the second
step on: such a plan must write a checkpoint after every step
(train.checkpoint_every=1 into --to), and each step starts from meshrun's
parameters and AdamW state of the step before, its parameters compared with
meshrun's after it (a relative error of that step's update, in 2-norms: an
element whose gradient a rounding halves, AdamW may move twice as far). An fp32 plan's
steps may be checked that way too (--each).

usage: check_train.py --plan PLAN --data SHARD [--val SHARD] --from CKPT
         --to CKPT --metrics JSONL [--each] [--loss-tol R] [--norm-tol R]
         [--param-tol R] [--dtype float64|float32]
       check_train.py --batch FILE   (a line of those arguments and
         --out OUT a check, in one process; see batch())

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
import contextlib
import json
import math
import os
import shlex
import sys
import traceback

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


def parser():
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
    ap.add_argument("--each", action="store_true", help="each step from meshrun's checkpoint of the step "
                    "before (train.checkpoint_every=1; always, for a bf16 or fp16 plan)")
    return ap


def checked(a):
    """check(a), a missing file, a bad checkpoint or plan a FAIL line."""
    try:
        return check(a)
    except (OSError, ValueError, KeyError) as e:
        print(f"FAIL check_train: {type(e).__name__}: {e}")
        return 1


def batch(path):
    """--batch FILE: each line a check's arguments, shell-quoted, and
    --out OUT, the file its lines go to; one process for them all (torch's
    import alone takes some 2 s). Prints `NAME: PASS` or `NAME: FAIL` a
    line, NAME the OUT file's; exits 1 if any failed."""
    ap = parser()
    ap.add_argument("--out", required=True)
    bad = 0
    with open(path) as f:
        cases = [shlex.split(line) for line in f if line.strip()]
    for words in cases:
        try:
            a = ap.parse_args(words)
        except SystemExit:  # (argparse said why, on stderr)
            print(f"FAIL check_train: bad arguments: {shlex.join(words)}", flush=True)
            bad += 1
            continue
        with open(a.out, "w") as out, contextlib.redirect_stdout(out):
            try:
                rc = checked(a)
            except Exception:  # noqa: BLE001 (one case's bug, the next case still runs)
                traceback.print_exc(file=out)
                print("FAIL check_train: the check raised the exception above")
                rc = 1
        bad += rc != 0
        print(f"{os.path.basename(a.out)}: {'FAIL' if rc else 'PASS'}", flush=True)
    return 1 if bad else 0


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--batch":
        return batch(sys.argv[2])
    return checked(parser().parse_args())


def load(ck, dtype):
    """(parameters, AdamW's moments, metadata) of a checkpoint's step folder,
    the tensors in dtype."""
    P, _ = mt.read_safetensors(os.path.join(ck, "model.safetensors"))
    S, meta = mt.read_safetensors(os.path.join(ck, "optim.safetensors"))
    return {k: v.to(dtype) for k, v in P.items()}, {k: v.to(dtype) for k, v in S.items()}, meta


def moved_apart(P, end, start, l2=False):
    """The largest of the tensors' differences between P and end, each over
    the largest change from start to end (0 where both are start's); with
    l2, each tensor's difference's 2-norm over its change's."""
    worst, worst_name = 0.0, ""
    with torch.no_grad():
        for name, p in P.items():
            if name not in end:
                raise KeyError(f"the checkpoint lacks {name}")
            diff, moved = (p - end[name].to(p.dtype)).abs(), (end[name].to(p.dtype) - start[name]).abs()
            if name.endswith(".b_qkv"):  # the key bias: see key_bias_note
                C = p.numel() // 3
                diff, moved = torch.cat([diff[:C], diff[2 * C:]]), torch.cat([moved[:C], moved[2 * C:]])
            if l2:
                diff, moved = diff.double().norm(), moved.double().norm()
            r = float(diff.max()) / max(float(moved.max()), 1e-12) if float(diff.max()) > 0 else 0.0
            if r > worst:
                worst, worst_name = r, name
    return worst, worst_name


def check(a):
    t = mt.read_plan_train(a.plan)
    half = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[t["precision"]]
    each, dtype = a.each or half is not None, getattr(torch, a.dtype)
    start = mt.checkpoint_dir(a.start)
    P, S, meta = load(start, dtype)
    P0 = {k: v.clone() for k, v in P.items()}
    step0, adam0, pos = int(meta["step"]), int(meta["adam_steps"]), int(meta["data_position"])
    with open(a.metrics) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    logged = [m for m in lines if "loss" in m and m["step"] > step0]
    if not logged:
        print(f"FAIL check_train: {a.metrics} logs no step after {step0}")
        return 1
    step_dir = lambda n: os.path.join(a.to, f"step-{n:08d}")  # noqa: E731
    if each:
        missing = [m["step"] for m in logged if not os.path.isdir(step_dir(m["step"]))]
        if missing:
            print(f"FAIL check_train: {a.to} has no checkpoint of step {missing[0]}; a {t['precision']} plan "
                  "(or --each) needs one every step: train.checkpoint_every=1")
            return 1
    tokens = mt.read_shard(a.data)
    model = mt.PlanModel(P, mt.read_plan_ops(a.plan))
    kind, loss_of = model.kind, model.loss

    def optimizer(S, adam_steps):
        """torch's AdamW over P, with AdamW's state as meshrun left it."""
        for p in P.values():
            p.requires_grad_(True)
        opt = mt.adamw(P, t["lr"], (t["beta1"], t["beta2"]), t["eps"], t["weight_decay"])
        for name, p in P.items():
            opt.state[p] = {"step": torch.tensor(float(adam_steps)), "exp_avg": S[name + ".m"].clone(),
                            "exp_avg_sq": S[name + ".v"].clone()}
        return opt

    opt = optimizer(S, adam0)
    worst = {"loss": 0.0, "norm": 0.0, "lr": 0.0}
    worst_p, worst_name, skipped = 0.0, "", 0
    B, T = t["global_batch"], t["seq_len"]

    def batch_loss(toks, first):
        """The global batch at window `first`: the mean of its micro-batches'
        losses, as meshrun takes it (moe routes each on its own)."""
        x, y = mt.batch(toks, first, B, T)
        mb = t["micro_batch"]
        return sum(loss_of(x[i:i + mb], y[i:i + mb]) for i in range(0, B, mb)) / (B // mb)

    for m in logged:
        step = m["step"]
        if step != step0 + 1:
            print(f"FAIL check_train: {a.metrics} skips from step {step0} to {step}; log every step")
            return 1
        if each and step > logged[0]["step"]:  # from meshrun's parameters and state of the step before
            P_, S, meta = end  # (read below, the step before)
            P.update(P_)  # (the model reads P)
            opt = optimizer(S, int(meta["adam_steps"]))
        before = {k: v.detach().clone() for k, v in P.items()}
        mt.set_storage(half, m.get("loss_scale", 1.0), t["tp"])
        loss = batch_loss(tokens, pos)
        loss.backward()
        params = list(P.values())
        norm = float(torch.sqrt(sum((p.grad.double() ** 2).sum() for p in params)))
        lr = mt.lr_at(t, step)
        skipped += not math.isfinite(norm)
        if math.isfinite(norm):  # else (fp16) an overflow: the step skipped
            if t["clip"] > 0:
                torch.nn.utils.clip_grad_norm_(params, t["clip"])
            for g in opt.param_groups:
                g["lr"] = lr
            opt.step()
        opt.zero_grad(set_to_none=True)
        logged_norm = m["grad_norm"] if m["grad_norm"] is not None else math.inf  # null: not finite
        d = {"loss": rel(float(loss), m["loss"]),
             "norm": 0.0 if not math.isfinite(norm) and not math.isfinite(logged_norm) else
             rel(norm, logged_norm) if math.isfinite(norm) and math.isfinite(logged_norm) else math.inf,
             "lr": rel(lr, m["lr"], 1e-12)}
        for k in worst:
            worst[k] = max(worst[k], d[k])
        scale = f" | loss scale {m['loss_scale']:g}" if "loss_scale" in m else ""
        print(f"step {step}: loss torch {float(loss):.6f} meshrun {m['loss']:.6f} (rel {d['loss']:.1e}) | "
              f"norm torch {norm:.6f} meshrun {logged_norm:.6f} (rel {d['norm']:.1e}) | lr {lr:.4e}{scale}")
        if each:  # this step's update, against meshrun's
            end = load(step_dir(step), dtype)
            r, name = moved_apart(P, end[0], before, l2=half is not None)
            if r > worst_p:
                worst_p, worst_name = r, name
        step0, pos = step, pos + B

    # the validation loss meshrun logged after the last step: the first 8
    # global batches of the validation shard, with the parameters of then
    # (meshrun's own, with --each)
    val = [m for m in lines if "val_loss" in m and m["step"] == step0]
    end = end[0] if each else load(mt.checkpoint_dir(a.to), dtype)[0]  # (the last step's)
    if val:
        if each:
            P.update(end)
        vtok = mt.read_shard(a.val or a.data)
        with torch.no_grad():
            vl = float(sum(batch_loss(vtok, g * B) for g in range(8)) / 8)
        worst["loss"] = max(worst["loss"], rel(vl, val[-1]["val_loss"]))
        print(f"val loss after step {step0}: torch {vl:.6f} meshrun {val[-1]['val_loss']:.6f} "
              f"(rel {rel(vl, val[-1]['val_loss']):.1e})")

    # A parameter's difference, against how far meshrun moved it (over all
    # the steps, or with --each in the step): a relative error of the
    # updates (an absolute one would hide a wrong weight decay of the gains
    # in their size of 1).
    if not each:
        worst_p, worst_name = moved_apart(P, end, P0)
    if kind == "gpt2":
        print(key_bias_note)
    what = ("of meshrun's change to the tensor in the step (2-norms), worst step" if half is not None else
            "of meshrun's change to the tensor in the step, worst step" if each else
            "of the largest change meshrun made to the tensor")
    print(f"parameters after step {step0}: largest difference {worst_p:.1e} {what} ({worst_name or '-'}), "
          f"over {len(P)} tensors")
    # logged rates keep 6 significant digits
    ok = (worst["loss"] <= a.loss_tol and worst["norm"] <= a.norm_tol and worst["lr"] <= 1e-5
          and worst_p <= a.param_tol)
    verdict = "PASS" if ok else "FAIL"
    print(f"{verdict} check_train {kind} {t['precision']}: {len(logged)} steps{' each from meshrun' if each else ''}"
          f"{f' ({skipped} skipped: fp16 overflowed on both sides)' if skipped else ''}"
          f"{' and the validation' if val else ''}; worst relative differences: loss "
          f"{worst['loss']:.1e} (tolerance {a.loss_tol:g}), gradient norm {worst['norm']:.1e} "
          f"({a.norm_tol:g}), lr {worst['lr']:.1e}, parameters {worst_p:.1e} ({a.param_tol:g})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
