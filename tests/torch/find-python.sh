# tests/torch/find-python.sh: sourced by tests/run.sh and tests/gpu/run.sh.
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
