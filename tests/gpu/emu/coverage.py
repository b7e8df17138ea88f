#!/usr/bin/env python3
"""coverage.py BUILD [--runtime]: what of the GPU code the emulated tests never ran.

Reads the gcov data of a coverage build of the emulation (make gpu-emu-cov:
BUILD built with SAN=cov, then tests/gpu/emu/run.sh BUILD forward) and
lists, for kernels/cuda/* and the runtime's CUDA-only sources (the device,
the kernel table, the NCCL communicator):

  - the lines no test ran, counted over every object and every template
    instantiation (a line that one instantiation ran counts as run);
  - the functions, template instantiations among them, never called (a
    kernel instantiated for a type no test launches it with).

Code under `#ifdef __CUDA_ARCH__` (the real GPU's branch of an instruction
wrapper) is not compiled here and so is not listed: this is what the
emulation leaves for a GPU to run first. The last line counts both.

With --runtime, then the same for the runtime's other files (runtime/*.c:
the executor, the CPU kernel table, the communicators...), counted over
the CPU's objects and the emulation's together (make gpu-emu-cov runs the
whole unit test program too, for them): what neither the unit tests nor
the emulated run reached (meshrun's own paths, MPI and SLURM launches,
make test's other sections, are not run there: expect them listed).
"""
import collections
import glob
import gzip
import json
import os
import subprocess
import sys
import tempfile

RUNTIME_CUDA = ("runtime/device_cuda.c", "runtime/kern_cuda.c") + tuple(
    f"runtime/comm_nccl{part}.c" for part in ("", "_a2a", "_p2p", "_wait", "_world"))


def gpu_code(path):
    return path.startswith("kernels/cuda/") or path in RUNTIME_CUDA


def other_runtime(path):
    return path.startswith("runtime/") and path.endswith(".c") and path not in RUNTIME_CUDA


def main():
    args = sys.argv[1:]
    runtime = "--runtime" in args
    args = [a for a in args if a != "--runtime"]
    if len(args) != 1:
        sys.exit("usage: coverage.py BUILD [--runtime]   (a SAN=cov build whose tests have run)")
    build = args[0]
    gcda = sorted(glob.glob(os.path.join(build, "emu-obj", "kernels", "cuda", "*.gcda")) +
                  glob.glob(os.path.join(build, "emu-obj", "runtime", "*.gcda")))
    if not gcda:
        sys.exit("coverage.py: no .gcda files under %s/emu-obj: build it with SAN=cov and run its "
                 "tests first (make gpu-emu-cov)" % build)
    report(build, gcda, gpu_code, "GPU code the emulated tests never ran", True)
    if runtime:
        gcda += sorted(glob.glob(os.path.join(build, "obj", "runtime", "*.gcda")))
        print()
        report(build, gcda, other_runtime, "the runtime's other files: lines no test ran", False)


def report(build, gcda, ours, title, functions):
    lines = collections.defaultdict(lambda: collections.defaultdict(int))
    funcs = collections.defaultdict(lambda: collections.defaultdict(int))
    starts = {}
    with tempfile.TemporaryDirectory() as tmp:
        for f in gcda:
            subprocess.run(["gcov", "-j", "-o", os.path.abspath(os.path.dirname(f)), os.path.abspath(f)],
                           cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
            for out in glob.glob(os.path.join(tmp, "*.gcov.json.gz")):
                with gzip.open(out) as z:
                    data = json.load(z)
                os.remove(out)
                for src in data["files"]:
                    if not ours(src["file"]):
                        continue
                    for ln in src["lines"]:
                        lines[src["file"]][ln["line_number"]] += ln["count"]
                    for fn in src["functions"]:
                        key = fn["demangled_name"]
                        funcs[src["file"]][key] += fn["execution_count"]
                        starts[(src["file"], key)] = fn["start_line"]
    total_lines = dead_lines = total_funcs = dead_funcs = 0
    print("%s (%s):" % (title, build))
    for path in sorted(lines):
        text = open(path, encoding="utf-8").read().split("\n") if os.path.exists(path) else []
        dead = sorted(n for n, c in lines[path].items() if c == 0)
        never = sorted((starts[(path, k)], k) for k, c in funcs[path].items() if c == 0) if functions else []
        total_lines += len(lines[path])
        dead_lines += len(dead)
        total_funcs += len(funcs[path])
        dead_funcs += len(never)
        if not dead and not never:
            print("%s: all %d lines run" % (path, len(lines[path])))
            continue
        print("%s: %d of %d lines never run" % (path, len(dead), len(lines[path])) +
              (", %d of %d functions never called" % (len(never), len(funcs[path])) if functions else ""))
        for n in dead:
            src = text[n - 1].strip() if 0 < n <= len(text) else ""
            print("  %5d: %s" % (n, src[:110]))
        for start, name in never:
            print("  %5d: never called: %s" % (start, name if len(name) <= 150 else name[:147] + "..."))
    if functions:
        print("%d of %d lines never run, %d of %d functions never called" %
              (dead_lines, total_lines, dead_funcs, total_funcs))
    else:
        print("%d of %d lines never run" % (dead_lines, total_lines))


if __name__ == "__main__":
    main()
