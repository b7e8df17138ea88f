# tests/torch/lib.sh: sourced by tests/run.sh (the torch section) and
# tests/gpu/run.sh (its oracle step).
#
# torch_python: prints a python3 that imports torch, the first of
# $MESH_PYTHON, python3 and Debian's /usr/bin/python3 (python3-torch, which
# make deps installs); fails if none does.
torch_python() {
    local py
    for py in ${MESH_PYTHON:-} python3 /usr/bin/python3; do
        "$py" -c 'import torch' >/dev/null 2>&1 && { echo "$py"; return 0; }
    done
    return 1
}

# The small models' shared train settings for the comparisons: fp32, a step
# logged each, a cosine schedule whose warm-up is over by step 50.
TORCH_TRAIN=(--set train.precision=fp32 --set train.seq_len=64 --set train.steps=1000
    --set train.log_every=1 --set train.checkpoint_every=0
    "--set=train.lr_schedule=cosine(warmup: 50, min_lr: 3e-4)"
    "--set=train.optimizer=adamw(lr: 3e-3, betas: (0.9, 0.95), eps: 1e-8, weight_decay: 0.1, clip: 1.0)")
