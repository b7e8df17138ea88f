#!/usr/bin/env python3
"""tests/gpu/report.py GPU_JSON: tests/gpu/run.sh's summary ($OUT/gpu.json)
as the Markdown section docs/benchmarks.md keeps for each GPU run, on
standard output; run.sh writes it to $OUT/report.md.

It says, from the run's own figures only (measured side by side in that
run, never against another run's):
  - when, on what, from which commit; the steps and what each said;
  - the issue's goals, each met or not: the GEMMs at 85% or more of raw
    cuBLASLt, GPT-2 124M at PyTorch's best figure of the same run or more,
    and 40% MFU or more; and which layout trained fastest at B=32 with the
    default's numbers (gpt2.json's fastest_b32), if not the default;
  - the tables: GPT-2 (mesh's runs and PyTorch's), where a step goes (the
    --profile tables run.sh keeps beside gpu.json, profile-NAME.txt),
    GEMMs, attention and the memory-bound kernels.

A missing part (a step skipped or failed: null in gpu.json) is said, not
guessed. Exits 2 if GPU_JSON cannot be read.
"""
import glob
import json
import os
import sys

GEMM_GOAL = 0.85  # of raw cuBLASLt (the goal)
MFU_GOAL = 40.0  # percent of the bf16 dense peak


def num(x, digits=1):
    """x with `digits` decimals and thousands separators, or '-' for none."""
    if x is None:
        return "-"
    return f"{x:,.{digits}f}"


def pct(x):
    return "-" if x is None else f"{100 * x:.0f}%"


def cut(s, n=160):
    s = " ".join(str(s).split())
    return s if len(s) <= n else s[: n - 3] + "..."


def header(d):
    when = d.get("date") or "date not recorded"
    dev = d.get("device") or (d.get("bench") or {}).get("device") or "device not recorded"
    commit = d.get("commit")
    out = [f"### GPU run of {when}: {dev}" + (f", commit {commit[:12]}" if commit else ""), ""]
    line = f"`tests/gpu/run.sh`: {d.get('status', '?')}"
    if d.get("elapsed_s") is not None:
        line += f" in {d['elapsed_s']} s"
    if d.get("rehearsal"):
        line += "; a rehearsal on the CPU emulation (MESH_GPU_REHEARSE=1): no figure here measures a GPU"
    if d.get("no_gpu"):
        line += f"; {d['no_gpu']}"
    out.append(line + ".")
    t = d.get("gpu_tests") or {}
    if t.get("passed") or t.get("failed"):
        out.append(f"The op tests: {t.get('passed', 0)} passed, {t.get('failed', 0)} failed.")
    out.append("")
    steps = d.get("steps") or {}
    if steps:
        out += ["| step | result | what it said |", "| --- | --- | --- |"]
        for name, s in steps.items():
            out.append(f"| {name} | {s.get('status', '?')} | {cut(s.get('detail', '')).replace('|', '/')} |")
        out.append("")
    return out


def mesh_runs(d):
    return [r for r in ((d.get("mesh_gpt2") or {}).get("runs") or []) if r.get("tokens_per_s")]


def torch_runs(d):
    return [r for r in ((d.get("torch") or {}).get("runs") or []) if r.get("tokens_per_s")]


def run_name(r):
    name = f"mesh {r.get('precision')}, B={r.get('batch')}"
    mode = r.get("mode", "default")
    return name if mode == "default" else f"{name}, {mode}"


def torch_name(r):
    return f"PyTorch {'torch.compile' if r.get('compile') else 'eager'}, B={r.get('B')}"


def gemm_ratio(g):
    """Our path's TFLOP/s over raw cuBLASLt's for one GEMM row, or None."""
    k, lt = g.get("kcuda_tflops"), g.get("cublaslt_tflops")
    return k / lt if k and lt else None


def goals(d):
    """The issue's goals, each a line: met, not met, or not measured."""
    out = ["**The issue's goals**, from this run's figures:", ""]
    bench = d.get("bench") or {}
    ratios = [(gemm_ratio(g), g["name"]) for g in bench.get("gemm") or [] if gemm_ratio(g) is not None]
    if ratios:
        lo, at = min(ratios)
        hi = max(r for r, _ in ratios)
        out.append(f"- GEMMs at {pct(GEMM_GOAL)} of raw cuBLASLt or more: {pct(lo)} ({at}) to {pct(hi)}: "
                   f"{'met' if lo >= GEMM_GOAL else 'not met'}")
    else:
        out.append("- GEMMs against raw cuBLASLt: not measured")
    mesh, torch = mesh_runs(d), torch_runs(d)
    best = max(mesh, key=lambda r: r["tokens_per_s"]) if mesh else None
    tbest = max(torch, key=lambda r: r["tokens_per_s"]) if torch else None
    if best and tbest:
        ratio = best["tokens_per_s"] / tbest["tokens_per_s"]
        out.append(f"- GPT-2 124M at PyTorch's best or more: {run_name(best)} {num(best['tokens_per_s'], 0)} "
                   f"tokens/s against {torch_name(tbest)} {num(tbest['tokens_per_s'], 0)}, {ratio:.2f} times: "
                   f"{'met' if ratio >= 1 else 'not met'}")
    else:
        out.append("- GPT-2 124M against PyTorch: not measured (" +
                   ("no mesh run" if not best else "no PyTorch run") + " in this run)")
    if best:
        mfu = max(r.get("mfu_percent_bf16_peak") or 0 for r in mesh)
        out.append(f"- {MFU_GOAL:.0f}% MFU or more: {mfu:.1f}% at best: {'met' if mfu >= MFU_GOAL else 'not met'}")
    fast = (d.get("mesh_gpt2") or {}).get("fastest_b32")
    if fast:
        if fast.get("mode") == "default":
            out.append(f"- the fastest at B=32 with the default's numbers is the default "
                       f"({num(fast['tokens_per_s'], 0)} tokens/s)")
        else:
            out.append(f"- the fastest at B=32 with the default's numbers is `{fast['mode']}` "
                       f"({num(fast['tokens_per_s'], 0)} tokens/s): a candidate for the default")
    anyf = (d.get("mesh_gpt2") or {}).get("fastest_b32_any")
    if anyf and fast and anyf.get("mode") != fast.get("mode"):
        out.append(f"- the fastest at B=32 of all (other numbers allowed) is `{anyf['mode']}` "
                   f"({num(anyf['tokens_per_s'], 0)} tokens/s)")
    return out + [""]


def gpt2_table(d):
    mesh, torch = mesh_runs(d), torch_runs(d)
    if not mesh and not torch:
        return ["GPT-2 124M: no run finished.", ""]
    seq = (d.get("mesh_gpt2") or {}).get("seq")
    out = [f"GPT-2 124M, T={seq or '?'}, one GPU (tokens/s; MFU by llm.c's FLOPs a token against 989 "
           "TFLOP/s):", "", "| run | tokens/s | MFU | losses against the default's |", "| --- | --- | --- | --- |"]
    for r in mesh:
        rel = r.get("losses_vs_default")
        out.append(f"| {run_name(r)} | {num(r['tokens_per_s'], 0)} | {num(r.get('mfu_percent_bf16_peak'))}% | "
                   f"{'-' if rel is None else f'{rel:.1e}'} |")
    for r in torch:
        mfu = r.get("mfu")
        out.append(f"| {torch_name(r)} | {num(r['tokens_per_s'], 0)} | "
                   f"{'-' if mfu is None else f'{100 * mfu:.1f}%'} | - |")
    for r in (d.get("torch") or {}).get("runs") or []:
        if r.get("error"):
            out.append(f"| {torch_name(r)} | failed: {cut(r['error'], 80)} | - | - |")
    return out + [""]


def bench_tables(d):
    b = d.get("bench")
    if not b:
        return ["`gpu_bench`: no figures (the step did not pass).", ""]
    out = []
    if b.get("gemm"):
        out += ["| bf16 GEMM (M x K x N) | kcuda TFLOP/s | tuned | raw cuBLASLt | cublasGemmEx | of cuBLASLt |",
                "| --- | --- | --- | --- | --- | --- |"]
        out += [f"| {g['name']} | {num(g.get('kcuda_tflops'))} | {num(g.get('tuned_tflops'))} | "
                f"{num(g.get('cublaslt_tflops'))} | {num(g.get('cublas_tflops'))} | {pct(gemm_ratio(g))} |"
                for g in b["gemm"]]
        out.append("")
    if b.get("gemm_fp32"):
        out += ["| fp32 GEMM | fp32 TFLOP/s | TF32 TFLOP/s |", "| --- | --- | --- |"]
        out += [f"| {g['name']} | {num(g.get('fp32_tflops'))} | {num(g.get('tf32_tflops'))} |" for g in b["gemm_fp32"]]
        out.append("")
    for key, what in (("epilogue", "bias and GELU in the product's epilogue"),
                      ("dgelu", "the GELU backward in the input gradient's epilogue")):
        e = b.get(key)
        if e:
            out.append(f"{what} ({e['name']}): {num(e.get('fused_ms'), 3)} ms, against "
                       f"{num(e.get('apart_ms'), 3)} ms apart.")
    if b.get("epilogue") or b.get("dgelu"):
        out.append("")
    if b.get("attention"):
        out += ["| attention | fwd TFLOP/s | bwd TFLOP/s | fwd ms | bwd ms |", "| --- | --- | --- | --- | --- |"]
        out += [f"| {a['name']} | {num(a.get('fwd_tflops'))} | {num(a.get('bwd_tflops'))} | "
                f"{num(a.get('fwd_ms'), 3)} | {num(a.get('bwd_ms'), 3)} |" for a in b["attention"]]
        out.append("")
    if b.get("attention_cudnn"):
        out += [f"cuDNN: {b['attention_cudnn']}.", ""]
    if b.get("memory"):
        out += [f"Memory-bound kernels against a device-to-device copy ({num(b.get('memcpy_gbps'), 0)} GB/s):", "",
                "| kernel | ms | GB/s | of the copy |", "| --- | --- | --- | --- |"]
        out += [f"| {m['name']} | {num(m.get('ms'), 3)} | {num(m.get('gbps'), 0)} | {pct(m.get('of_copy'))} |"
                for m in b["memory"]]
        out.append("")
    return out


def profiles(folder):
    """The --profile tables run.sh keeps beside gpu.json (profile-NAME.txt)."""
    out = []
    for path in sorted(glob.glob(os.path.join(folder, "profile-*.txt"))):
        name = os.path.basename(path)[len("profile-"):-len(".txt")]
        with open(path) as f:
            lines = [ln.rstrip("\n").removeprefix("meshrun: ") for ln in f if ln.strip()]
        if lines:
            out += [f"Where a step goes (`{name}`, `meshrun --profile`):", "", "```text"] + lines + ["```", ""]
    return out


def report(d, folder="."):
    return "\n".join(header(d) + goals(d) + gpt2_table(d) + profiles(folder) + bench_tables(d)).rstrip() + "\n"


def main(argv):
    if len(argv) != 2:
        print("usage: report.py GPU_JSON", file=sys.stderr)
        return 2
    try:
        with open(argv[1]) as f:
            d = json.load(f)
    except (OSError, ValueError) as e:
        print(f"report.py: {argv[1]}: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(report(d, os.path.dirname(argv[1]) or "."))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
