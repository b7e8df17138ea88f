#!/usr/bin/env python3
"""tests/sweep/mesh_sweep.py: the project's central guarantee, on meshes no
one picked. Draws random trainings (a model: a small GPT, Llama or
mixture-of-experts; a mesh dp x tp x pp x ep; a pipeline schedule, ZeRO
stage, recomputation, sequence parallelism, gradient buckets, precision,
batch and sequence lengths), compiles each with meshc, trains it with
meshrun for a few steps, and checks that:

  - meshc either accepts the training or rejects it with a diagnostic in
    the `file:line:col: error:` form (exit 1), never anything else;
  - meshrun trains every plan meshc accepts, and rank 0 sends the bytes
    the plan predicts (its `bytes rank 0 sent per step` line);
  - the losses at every step are those of one rank training the same
    model, seed and global batch (fp32: 1e-4 relative, as an 8-layer
    model amplifies the rounding of sums in another order past the unit
    tests' 1e-5 by step 4, on dp 2 as on tp 2; bf16 and fp16: 2e-2, the
    unit tests' bound), and so is the validation loss;
  - some trainings stop halfway with a checkpoint and resume on another
    mesh (a checkpoint loads into any mesh; on the emulated GPUs, half of
    them on the CPU: any device too): the steps after the resume
    are the uninterrupted one rank's too;
  - some run again with --no-overlap (the same losses, bit for bit), some
    with a process per rank, under mpirun or as torchrun starts them (over
    TCP): the threads' losses, bit for bit; some with a process per
    rank, one of which is killed or stopped once the job trains: every
    other one must end with an error within 30 s; and data parallelism
    alone with --deterministic (one rank's, bit for bit); on the emulated
    GPUs, some with MESH_NCCL_BLOCKING=1 and some bf16 and fp16 ones with
    MESH_ATTN_WGMMA=1 (each the same losses, bit for bit: the emulation
    sums a warpgroup's products as mma.sync's).

With --device cuda it runs meshrun_emu: the CUDA executor on emulated GPUs,
NCCL between them (MESH_EMU_GPUS), against the one-rank CPU run; a step
after the second may also be off by NOISE_TIMES one emulated GPU's own
distance from the CPU there (rounding, grown by an ill-conditioned draw).

Each case is printed as one line (`ok N ...` or `FAIL N ...` with the
commands to run it again); the last line is `N passed, N failed, N
rejected`. Exit 1 if any failed. The draws depend only on --seed, so a
failure is found again with the same seed and --first N.

  tests/sweep/mesh_sweep.py --seconds 600            (make sweep)
  tests/sweep/mesh_sweep.py --cases 12 --seed 1      (CI: make sweep-ci)
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAULT_TIMEOUT_S = 3  # MESH_COLLECTIVE_TIMEOUT_S of a job with a rank stopped
FAULT_S = 30  # how soon the other ranks of a job with a rank killed or stopped must end
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1", "OMPI_MCA_btl": "self,vader",
           "OMPI_MCA_mpi_yield_when_idle": "1"}
# The ways a case runs again whose losses must be its first run's, bit
# for bit: meshrun's options and environment, what they are called in a
# failure, and what the first run was.
SAME_BITS = {
    "blocking": ([], {"MESH_NCCL_BLOCKING": "1"}, "MESH_NCCL_BLOCKING=1", "ordered on the stream"),
    "wgmma": ([], {"MESH_ATTN_WGMMA": "1"}, "MESH_ATTN_WGMMA=1", "on mma.sync"),
    "no-overlap": (["--no-overlap"], None, "--no-overlap", "overlapped"),
}
DIAG = re.compile(r"^[^:\n]+:\d+:\d+: error: ", re.M)
SENT = re.compile(r"^meshrun: bytes rank 0 sent per step \(the plan's\): (.*)$", re.M)


def draw(rng, device):
    """One random training: (source, kind, {KEY: VALUE}, the mesh it resumes on or None, how it
    runs again or None, the device it resumes on)."""
    kind = rng.choice(["gpt", "gpt", "llama", "moe"])
    sets = {}
    if kind == "gpt":
        src = "examples/gpt-tiny.mesh"
        heads = rng.choice([2, 4, 8])
        sets["model.heads"] = heads
        if rng.random() < 0.3:
            sets["model.dim"] = 32 * rng.choice([1, 2, 3])
    else:
        src = "examples/llama.mesh" if kind == "llama" else "examples/moe.mesh"
        heads = rng.choice([2, 4, 8])
        kv = rng.choice([h for h in (1, 2, 4, 8) if heads % h == 0])
        sets.update({"model.vocab": 256, "model.dim": 64, "model.heads": heads, "model.kv_heads": kv,
                     "model.ffn_dim": rng.choice([64, 96, 128])})
        if kind == "moe":
            sets["model.experts"] = rng.choice([2, 4, 8])
            sets["model.top_k"] = rng.choice([1, 2])
    mesh = random_mesh(rng, kind, device)
    dp, tp, pp, ep = mesh
    # mostly a stack the stages split evenly (meshc rejects the others, a case of its own)
    layers = pp * rng.choice([1, 1, 2]) if rng.random() < 0.9 else rng.choice([1, 2, 3, 4, 5])
    sets["model.layers"] = layers
    sets.update({"mesh.dp": dp, "mesh.tp": tp, "mesh.pp": pp, "mesh.ep": ep})
    sched = "1f1b"
    if pp > 1:
        sched = rng.choice(["1f1b", "1f1b", "gpipe", "interleaved"])
        if sched == "interleaved" and layers % (2 * pp) != 0:
            sched = "1f1b"
    sets["train.schedule"] = sched
    sets["train.virtual_stages"] = 2 if sched == "interleaved" else 1
    micro = rng.choice([1, 1, 2, 3])
    n_micro = rng.choice([1, 2, 3, 4])
    if pp > 1:
        n_micro = max(n_micro, pp)  # 1F1B needs a micro-batch per stage in flight
    sets["train.micro_batch"] = micro
    sets["train.global_batch"] = dp * ep * micro * n_micro
    sets["train.seq_len"] = rng.choice([16, 32, 64]) if kind == "gpt" else rng.choice([16, 32])
    sets["train.zero"] = rng.choice([0, 0, 1, 2, 3]) if dp * ep > 1 else 0
    sets["train.recompute"] = rng.choice(["none", "none", "full"])
    sets["train.sequence_parallel"] = "true" if tp > 1 and rng.random() < 0.4 else "false"
    if rng.random() < 0.3:
        sets["train.bucket_size"] = rng.choice([500, 5000, 50000])
    r = rng.random()
    prec = "fp32" if r < 0.7 else ("bf16" if r < 0.85 else "fp16")
    sets["train.precision"] = prec
    if prec == "fp16":
        sets["train.loss_scale"] = 1024  # a fixed scale: a dynamic one may skip a step in one order only
    sets["train.seed"] = rng.randrange(1, 10000)
    sets["train.log_every"] = 1
    sets["train.eval_every"] = 0
    sets["train.lr_schedule"] = "cosine(warmup: 2, min_lr: 1e-4)"
    sets["train.checkpoint_every"] = 0
    resume, resume_on = None, device
    if rng.random() < 0.25:
        resume = random_mesh(rng, kind, device)
        # on GPUs, half resume on the CPU (a checkpoint loads on any device)
        if device == "cuda" and rng.random() < 0.5:
            resume_on = "cpu"
    # and again with --no-overlap: the gradient sync and ZeRO's collectives
    # in their turn, not on the communication thread: the same losses, bit for bit
    again = "no-overlap" if dp * ep > 1 and resume is None and rng.random() < 0.2 else None
    # one process per rank (mpirun, or torchrun's variables over TCP): the
    # threads run's losses, bit for bit
    # (on the emulated GPUs, whose processes meet through files, which
    # tests/gpu/emu/meshrun.sh tests: none; the NCCL calls waited for,
    # MESH_NCCL_BLOCKING=1, instead of ordered on the stream: the same
    # losses, bit for bit)
    if device == "cuda" and dp * tp * pp * ep > 1 and resume is None and not again and rng.random() < 0.3:
        again = "blocking"
    # on the emulated GPUs, 2-byte precisions with the attention on
    # warpgroup products (MESH_ATTN_WGMMA=1), whose products the emulation
    # sums as mma.sync's: the same losses, bit for bit
    if device == "cuda" and prec != "fp32" and resume is None and not again and rng.random() < 0.5:
        again = "wgmma"
        # sequences of 2 or 3 key tiles of 64 (the last one ragged), so
        # that the kernels' overlap of one tile's softmax with the tile
        # before's product runs
        sets["train.seq_len"] = rng.choice([96, 160])
        if kind == "gpt":
            sets["model.context"] = 160
    if device == "cpu" and dp * tp * pp * ep > 1 and resume is None and not again and rng.random() < 0.25:
        again = rng.choice(["mpirun", "torchrun"])
    # a rank per process (torchrun's way), one of them killed or stopped
    # once the job trains: every other process ends with an error, soon
    if device == "cpu" and dp * tp * pp * ep > 1 and resume is None and not again and rng.random() < 0.1:
        again = ("fault", rng.randrange(dp * tp * pp * ep), rng.choice(["KILL", "STOP"]))
    # data parallelism alone (ZeRO 0) with --deterministic: one rank's losses, bit for bit
    if dp > 1 and tp == pp == ep == 1 and sets["train.zero"] == 0 and resume is None and not again \
            and rng.random() < 0.8:
        again = "deterministic"
    return src, kind, sets, resume, again, resume_on


def random_mesh(rng, kind, device):
    limit = 4 if device == "cuda" else 8
    while True:
        dp = rng.choice([1, 1, 2, 2, 3, 4])
        tp = rng.choice([1, 1, 2, 2, 4])
        pp = rng.choice([1, 1, 2, 2, 3, 4])
        ep = rng.choice([1, 2, 2, 4]) if kind == "moe" else 1
        if dp * tp * pp * ep <= limit:
            return dp, tp, pp, ep


def world_of(sets):
    return sets["mesh.dp"] * sets["mesh.tp"] * sets["mesh.pp"] * sets["mesh.ep"]


def one_rank(sets):
    ref = dict(sets)
    ref.update({"mesh.dp": 1, "mesh.tp": 1, "mesh.pp": 1, "mesh.ep": 1, "train.schedule": "1f1b",
                "train.virtual_stages": 1, "train.zero": 0, "train.recompute": "none",
                "train.sequence_parallel": "false"})
    ref.pop("train.bucket_size", None)
    return ref


def with_mesh(sets, mesh):
    s = dict(sets)
    dp, tp, pp, ep = mesh
    s.update({"mesh.dp": dp, "mesh.tp": tp, "mesh.pp": pp, "mesh.ep": ep})
    if pp == 1 or s["train.schedule"] == "interleaved" and s["model.layers"] % (2 * pp):
        s["train.schedule"], s["train.virtual_stages"] = "1f1b", 1
    if tp == 1:
        s["train.sequence_parallel"] = "false"
    # the same global batch and micro-batch size: as many micro-batches as the new mesh's share
    if s["model.layers"] % pp:
        return None
    share = dp * ep * s["train.micro_batch"]
    if s["train.global_batch"] % share or s["train.global_batch"] // share < pp:
        return None
    return s


def sets_args(sets):
    out = []
    for k, v in sets.items():
        out += ["--set", "%s=%s" % (k, v)]
    return out


def describe(kind, sets):
    s = sets
    d = "%s L%d h%s dp%d tp%d pp%d ep%d %s z%d mb%dx%d T%d %s" % (
        kind, s["model.layers"], s["model.heads"], s["mesh.dp"], s["mesh.tp"], s["mesh.pp"], s["mesh.ep"],
        s["train.schedule"], s["train.zero"], s["train.micro_batch"], s["train.global_batch"],
        s["train.seq_len"], s["train.precision"])
    if s["train.recompute"] == "full":
        d += " recompute"
    if s["train.sequence_parallel"] == "true":
        d += " sp"
    if "train.bucket_size" in s:
        d += " bucket%d" % s["train.bucket_size"]
    if "model.experts" in s:
        d += " E%dk%d" % (s["model.experts"], s["model.top_k"])
    return d


class Sweep:
    def __init__(self, args):
        self.a = args
        self.tmp = tempfile.mkdtemp(prefix="mesh-sweep-")
        self.meshc = os.path.join(args.build, "meshc")
        self.meshrun = os.path.join(args.build, "meshrun_emu" if args.device == "cuda" else "meshrun")
        self.env = dict(os.environ, OPENBLAS_NUM_THREADS="1", MESH_COLLECTIVE_TIMEOUT_S="60")
        if args.device == "cuda":
            self.env["MESH_EMU_GPUS"] = "4"
        self.cpu_meshrun = os.path.join(args.build, "meshrun")
        self.train = os.path.join(self.tmp, "train.bin")
        self.val = os.path.join(self.tmp, "val.bin")
        subprocess.run([self.cpu_meshrun, "tokenize", os.path.join(ROOT, "examples/data/devils-dictionary.txt"),
                        "-o", self.train, "--val", self.val], check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
        self.refs = {}
        self.have_mpirun = shutil.which("mpirun") is not None

    def device_ok(self, launcher):
        """One process per rank: on the CPU (the emulated GPUs of several
        processes meet through files, which tests/gpu/emu/meshrun.sh tests)."""
        return self.a.device == "cpu" and (launcher != "mpirun" or self.have_mpirun)

    def compile(self, src, sets, plan):
        p = subprocess.run([self.meshc, "-o", plan] + sets_args(sets) + [src], cwd=ROOT, env=self.env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
        return p.returncode, p.stdout

    def train_run(self, plan, log, steps, device, extra=(), launcher=None, world=1, more_env=None):
        """meshrun on plan; launcher None: its ranks as threads of one process;
        "mpirun" or "torchrun": one process per rank (world of them);
        more_env: variables added to its environment (threads only)."""
        metrics = log + ".jsonl"
        if os.path.exists(metrics):
            os.remove(metrics)
        prog = self.cpu_meshrun if device == "cpu" else self.meshrun
        cmd = [prog, plan, "--data", self.train, "--val", self.val, "--steps", str(steps), "--threads", "1",
               "--metrics", metrics, "--device", device] + list(extra)
        if launcher == "mpirun":
            cmd = ["mpirun", "-n", str(world)] + cmd
        if launcher == "torchrun":
            out, rc = self.torchrun(cmd, world)
        else:
            env = dict(self.env, **MPI_ENV) if launcher == "mpirun" else dict(self.env, **(more_env or {}))
            if launcher == "mpirun" and "ASAN_OPTIONS" in env:  # (Open MPI's own leaks cannot be suppressed)
                env["ASAN_OPTIONS"] += ":detect_leaks=0:abort_on_error=0"
            try:
                p = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, timeout=self.a.case_timeout)
                out, rc = p.stdout, p.returncode
            except subprocess.TimeoutExpired as e:
                out, rc = text_of(e.stdout) + "\n(timed out)", -1
        with open(log, "w") as f:
            f.write(out)
        losses, val = {}, None
        if os.path.exists(metrics):
            for line in open(metrics):
                j = json.loads(line)
                if "val_loss" in j:
                    val = j["val_loss"]
                elif "loss" in j:
                    losses[j["step"]] = j["loss"]
        return rc, out, losses, val, cmd

    def torchrun(self, cmd, world):
        """The ranks as torchrun starts them: a process each, RANK, WORLD_SIZE,
        LOCAL_RANK, MASTER_ADDR and MASTER_PORT; they meet over TCP."""
        port = 20000 + random.randrange(10000)
        procs = []
        for r in range(world):
            env = dict(self.env, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port))
            procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True))
        outs, rc = [], 0
        deadline = time.time() + self.a.case_timeout
        for r, p in enumerate(procs):
            try:
                o, _ = p.communicate(timeout=max(1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                o, _ = p.communicate()
                o += "\n(timed out)"
            outs.append(o if r == 0 else "".join("[rank %d] %s\n" % (r, l) for l in o.splitlines()))
            rc = rc or p.returncode
        return "".join(outs), rc

    def rerun(self, plan, steps, name, options, launcher=None, world=1, env=None):
        """plan trained again with options (its own checkpoint folder) and
        env's variables: (losses, validation loss, output), or a str saying
        how it failed."""
        rc, out, losses, val, cmd = self.train_run(plan, plan + "." + name, steps, self.a.device,
                                                   list(options) + ["--checkpoint", plan + ".ck-" + name],
                                                   launcher, world, env)
        if rc != 0:
            how = " ".join(options) or launcher or " ".join("%s=%s" % kv for kv in (env or {}).items())
            return "meshrun %s exited %d:\n%s\n%s" % (how, rc, tail(out, 40), " ".join(cmd))
        return losses, val, out

    def fault(self, plan, d, world, victim, sig):
        """A job of a process per rank (torchrun's variables) trains; once rank
        0 has logged a step, rank `victim` gets SIGKILL or SIGSTOP. Every
        other process must end with an exit status not 0 and an error line
        within FAULT_S seconds (a stopped rank: the survivors' collectives
        time out after MESH_COLLECTIVE_TIMEOUT_S). None, or what went wrong."""
        port = 20000 + random.randrange(10000)
        procs, logs = [], []
        for r in range(world):
            env = dict(self.env, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port), MESH_COLLECTIVE_TIMEOUT_S=str(FAULT_TIMEOUT_S))
            log = os.path.join(d, "fault.%d" % r)
            logs.append(log)
            with open(log, "w") as f:
                procs.append(subprocess.Popen([self.cpu_meshrun, plan, "--data", self.train, "--val", self.val,
                                               "--steps", "100000",
                                               "--threads", "1", "--checkpoint", os.path.join(d, "ck-fault")],
                                              cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT))
        try:
            start = time.time()
            while time.time() - start < 60 and "\nstep 1/" not in "\n" + open(logs[0]).read():
                if any(p.poll() is not None for p in procs):
                    return "a rank ended before the job trained:\n" + tail(open(logs[0]).read())
                time.sleep(0.05)
            else:
                if time.time() - start >= 60:
                    return "the job logged no step in 60 s"
            os.kill(procs[victim].pid, getattr(signal, "SIG" + sig))
            t0 = time.time()
            late = []
            for r, p in enumerate(procs):
                if r == victim:
                    continue
                try:
                    p.wait(timeout=max(0.1, t0 + FAULT_S - time.time()))
                except subprocess.TimeoutExpired:
                    late.append(r)
            if late:
                return "rank %d got SIG%s: ranks %s still ran %d s later (rank %d's output:\n%s)" % (
                    victim, sig, late, FAULT_S, late[0], tail(open(logs[late[0]]).read(), 12))
            for r, p in enumerate(procs):
                if r == victim:
                    continue
                text = open(logs[r]).read()
                if p.returncode == 0 or "error" not in text:
                    return "rank %d got SIG%s: rank %d ended with status %d%s:\n%s" % (
                        victim, sig, r, p.returncode, "" if "error" in text else " and no error line",
                        tail(text, 12))
            return None
        finally:
            for p in procs:
                if p.poll() is None:
                    try:
                        os.kill(p.pid, signal.SIGCONT)
                    except OSError:
                        pass
                    p.kill()
                p.wait()

    def reference(self, src, sets, steps, device="cpu"):
        """One rank's losses and validation loss on the same model, seed and
        global batch (on the CPU, the reference; or on the device under test,
        for what must be its bits)."""
        ref = one_rank(sets)
        key = (src, tuple(sorted(ref.items())), steps, device)
        if key not in self.refs:
            plan = os.path.join(self.tmp, "ref%d.plan" % len(self.refs))
            rc, out = self.compile(src, ref, plan)
            if rc != 0:
                self.refs[key] = (None, "the one-rank plan does not compile:\n" + out)
            else:
                log = plan + ".log"
                rc, out, losses, val, cmd = self.train_run(plan, log, steps, device, ["--checkpoint", plan + ".ck"])
                self.refs[key] = ((losses, val), None) if rc == 0 else (None, "one rank failed:\n" + out)
        return self.refs[key]

    def case(self, n, rng):
        src, kind, sets, resume, again_in_turn, resume_on = draw(rng, self.a.device)
        what = describe(kind, sets)
        d = os.path.join(self.tmp, "c%d" % n)
        os.makedirs(d, exist_ok=True)
        plan = os.path.join(d, "case.plan")
        rc, out = self.compile(src, sets, plan)
        remake = "meshc -o case.plan %s %s" % (" ".join(sets_args(sets)), src)
        if rc == 1 and DIAG.search(out):
            return "rejected", what, DIAG.search(out).group(0) + out[DIAG.search(out).end():].split("\n")[0][:120]
        if rc != 0:
            return "fail", what, "meshc exited %d without a diagnostic:\n%s\n%s" % (rc, out, remake)
        steps = self.a.steps
        ref, why = self.reference(src, sets, steps)
        if ref is None:
            return "fail", what, why
        ref_losses, ref_val = ref
        tol = 1e-4 if sets["train.precision"] == "fp32" else 2e-2
        bad = []
        # On GPUs, rounding's own spread: one GPU's losses against the CPU's
        # one rank. An ill-conditioned draw grows it past the tolerance in a
        # few steps (seed 900's draw 16: 8 layers of 2 heads, a gradient
        # spike at step 5, one GPU 1.8e-3 off the CPU at step 6), so a step
        # may be off by NOISE_TIMES that too; before rounding can grow
        # (steps 1 and 2) one GPU must be within the tolerance itself.
        noise, dev = None, ref  # (dev: one rank's on the device under test)
        if self.a.device == "cuda":
            dev, why = self.reference(src, sets, steps, "cuda")
            if dev is None:
                return "fail", what, why
            noise = {k: abs(dev[0][k] - ref_losses[k]) for k in dev[0] if k in ref_losses}
            if dev[1] is not None and ref_val is not None:
                noise["val"] = abs(dev[1] - ref_val)
            for k in (1, 2):
                if k in noise and noise[k] > tol * abs(ref_losses[k]):
                    bad.append("one GPU's step %d: loss %r against the CPU's one rank's %r" % (k, dev[0][k],
                                                                                           ref_losses[k]))
        rsets = with_mesh(sets, resume) if resume else None
        rplan = os.path.join(d, "resume.plan")
        if rsets:
            rc, rout = self.compile(src, rsets, rplan)
            if rc == 1 and DIAG.search(rout):
                rsets = None  # a mesh this model does not split over (heads over tp...): no resume
            elif rc != 0:
                return "fail", what, "meshc exited %d without a diagnostic:\n%s" % (rc, rout)
        first = steps // 2 if rsets else steps
        ck = os.path.join(d, "ck")
        extra = ["--checkpoint", ck]  # (not the example's checkpoint_dir, in the source tree)
        rc, out, losses, val, cmd = self.train_run(plan, plan + ".log", first, self.a.device, extra)
        if rc == 1 and "does not train this plan yet" in out:  # (a refusal saying why: the GPUs' limits)
            return "rejected", what, [l for l in out.splitlines() if "does not train" in l][0][:160]
        if rc != 0:
            return "fail", what, "meshrun exited %d:\n%s\n%s\n%s" % (rc, tail(out), remake, " ".join(cmd))
        m = SENT.search(out)
        if m:
            for item in m.group(1).split(", "):
                mm = re.match(r"(\S+) (\d+) \((\d+)\)", item)
                if not mm or mm.group(2) != mm.group(3):
                    bad.append("rank 0 sent other bytes than the plan's: " + item)
        elif world_of(sets) > 1:
            bad.append("no line of the bytes rank 0 sent")
        compare(bad, ref_losses, losses, range(1, first + 1), tol, "", noise)
        if again_in_turn == "deterministic":
            what += " deterministic"
            got = self.rerun(plan, first, "det", ["--deterministic"])
            if isinstance(got, str):
                return "fail", what, got
            if got[:2] != dev:
                bad.append("--deterministic: losses %s (validation %s), one rank's on the %s %s (%s)" % (
                    got[0], got[1], self.a.device, dev[0], dev[1]))
        elif again_in_turn in ("mpirun", "torchrun") and self.device_ok(again_in_turn):
            what += " " + again_in_turn
            got = self.rerun(plan, first, again_in_turn, [], again_in_turn, world_of(sets))
            if isinstance(got, str):
                return "fail", what, got
            if "one per process (%s)" % again_in_turn not in got[2]:
                bad.append("%s: meshrun did not say it ran a rank per process" % again_in_turn)
            if got[:2] != (losses, val):
                bad.append("%s: losses %s, as threads %s" % (again_in_turn, got[0], losses))
        elif isinstance(again_in_turn, tuple) and self.device_ok("torchrun"):
            _, victim, sig = again_in_turn
            what += " %s-rank-%d" % (sig.lower(), victim)
            why = self.fault(plan, d, world_of(sets), victim, sig)
            if why:
                bad.append(why)
        elif again_in_turn in SAME_BITS:
            options, env, how, first_run = SAME_BITS[again_in_turn]
            what += " " + again_in_turn
            got = self.rerun(plan, first, again_in_turn, options, env=env)
            if isinstance(got, str):
                return "fail", what, got
            if got[:2] != (losses, val):
                bad.append("%s: losses %s, %s %s" % (how, got[0], first_run, losses))
        if rsets:
            what += " resumed dp%d tp%d pp%d ep%d" % resume + (" on the cpu" if resume_on != self.a.device else "")
            rc, out, losses, val, cmd = self.train_run(rplan, rplan + ".log", steps, resume_on,
                                                       ["--checkpoint", ck, "--resume"])
            if rc != 0:
                return "fail", what, "meshrun --resume exited %d:\n%s\n%s" % (rc, tail(out), " ".join(cmd))
            compare(bad, ref_losses, losses, range(first + 1, steps + 1), tol, " after the resume", noise)
        if ref_val is not None and (val is None or abs(val - ref_val) > room(tol, ref_val, noise, "val")):
            bad.append("validation loss %r against one rank's %r" % (val, ref_val))
        if bad:
            return "fail", what, "\n".join(bad[:6]) + "\n" + remake + "\n" + " ".join(cmd)
        return "ok", what, ""


def text_of(b):
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")


NOISE_TIMES = 4  # (a GPU run's room past the tolerance: that many times one GPU's distance from the CPU)


def room(tol, ref, noise, k):
    """How far a loss may be from one rank's ref at step k (or "val")."""
    return max(tol * abs(ref) + 1e-12, NOISE_TIMES * noise.get(k, 0.0) if noise else 0.0)


def compare(bad, ref, got, steps, tol, where, noise=None):
    for k in steps:
        if k not in got:
            bad.append("step %d%s: no loss logged" % (k, where))
        elif k not in ref or abs(got[k] - ref[k]) > room(tol, ref[k], noise, k):
            spread = " (one GPU's: %.2g off it)" % noise[k] if noise and k in noise else ""
            bad.append("step %d%s: loss %.7f against one rank's %s%s" % (k, where, got[k], ref.get(k), spread))


def tail(text, n=25):
    return "\n".join(text.splitlines()[-n:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cases", type=int, default=0, help="stop after N cases (0: --seconds decides)")
    ap.add_argument("--first", type=int, default=1, help="start at case N of the seed's draws")
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--case-timeout", type=float, default=300)
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder")
    a = ap.parse_args()
    a.build = os.path.abspath(a.build)
    # a SIGTERM (timeout, kill) ends the sweep as Ctrl-C does: through the
    # finally blocks, which kill a fault case's ranks (one may be stopped)
    # and remove the scratch folder
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    s = Sweep(a)
    rng = random.Random(a.seed)
    counts = {"ok": 0, "fail": 0, "rejected": 0}
    reasons = {}
    start = time.time()
    n = 0
    try:
        while True:
            n += 1
            if n < a.first:  # (drawn and passed over: case n's draw is the same with --first)
                draw(rng, a.device)
                continue
            if a.cases and n - a.first >= a.cases or not a.cases and time.time() - start > a.seconds:
                break
            try:
                result, what, detail = s.case(n, rng)
            except (OSError, ValueError, subprocess.SubprocessError) as e:  # a binary gone, a garbled metrics line
                result, what, detail = "fail", "case %d" % n, "the sweep could not run it: %r" % e
            counts[result] += 1
            if result == "ok":
                print("ok %d %s" % (n, what), flush=True)
            elif result == "rejected":
                key = DIAG.sub("", detail)[:70]
                reasons[key] = reasons.get(key, 0) + 1
                print("rejected %d %s: %s" % (n, what, detail), flush=True)
            else:
                print("FAIL %d %s (seed %d)\n%s" % (n, what, a.seed,
                                                    "\n".join("#   " + l for l in detail.splitlines())), flush=True)
    finally:
        if a.keep:
            print("# scratch kept in " + s.tmp)
        else:
            shutil.rmtree(s.tmp, ignore_errors=True)
    for k, v in sorted(reasons.items(), key=lambda kv: -kv[1]):
        print("# rejected %d times: %s" % (v, k))
    print("%d passed, %d failed, %d rejected (%.0f s)" % (counts["ok"], counts["fail"], counts["rejected"],
                                                          time.time() - start))
    return 1 if counts["fail"] else 0


if __name__ == "__main__":
    sys.exit(main())
