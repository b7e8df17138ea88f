#!/usr/bin/env bash
# .ci/deps.sh: install the Debian packages mesh needs to build and test.
#
# `.ci/deps.sh --demo`: all but the packages only the tests need.
#
# Checks each package first, so it is a quick no-op (and needs no root) when
# all are present; otherwise runs apt-get update and installs the missing
# ones. Written for Debian 12 as root (`make deps` runs it).
set -euo pipefail

PACKAGES=(
    gcc make flex bison         # build: compiler, make, front-end generators
    g++ python3                 # make gpu-emu: the CUDA kernels on a CPU emulation (C++, its launch rewriting)
    clang libclang-rt-14-dev    # make fuzz: clang and libFuzzer
    pkg-config                  # mesh.pc, and finding OpenBLAS and libyaml
    libopenblas-dev libyaml-dev # BLAS for the CPU kernels, YAML for the plan file
    libpcre2-dev curl           # GPT-2 BPE pre-tokenizer; curl fetches its files in a test
    libopenmpi-dev openmpi-bin  # MPI: libmesh's one-rank-per-process communicator, mpirun for its tests
    munge slurmctld slurmd slurm-client # a throw-away SLURM cluster in a test (srun, sbatch)
    ca-certificates
)
# For the tests only: `make demo` runs `.ci/deps.sh --demo`, without them.
TEST_PACKAGES=(
    python3-torch               # tests/torch: PyTorch (Debian's, on the CPU), the oracle meshrun's models are trained against
)
[ "${1:-}" = --demo ] || PACKAGES+=("${TEST_PACKAGES[@]}")

missing=()
for p in "${PACKAGES[@]}"; do
    status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
    [ "$status" = installed ] || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    echo "deps: all ${#PACKAGES[@]} packages installed"
    exit 0
fi

echo "deps: installing ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
    echo "deps: error: installing packages needs root; run as root:" >&2
    echo "  apt-get update && apt-get install -y --no-install-recommends ${missing[*]}" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends "${missing[@]}"
