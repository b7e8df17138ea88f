#!/usr/bin/env bash
# tests/gpu/fetch-debs.sh: download (never install) the Debian packages that
# tests/gpu/run.sh may need on a GPU machine with no network, into
# tests/gpu/debs/ (git-ignored; MESH_GPU_DEBS moves it). Run it on a machine
# with network to a Debian 12 mirror (the project's CI class), then carry the
# folder to the GPU machine (the device tool: carry ["tests/gpu/debs"]).
#
# The list: the build tools and libraries mesh needs (make, flex, bison and the m4
# they run, pkg-config, libyaml, OpenBLAS, PCRE2), with the shared libraries
# they load at run time that a CUDA image may lack. run.sh unpacks them with
# `dpkg -x` into a private prefix only when something is missing there.
# Debian 12's binaries need glibc >= 2.36, which Ubuntu 24.04 (or newer) has.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DEBS=${MESH_GPU_DEBS:-$ROOT/tests/gpu/debs}

PACKAGES=(
    make                                     # the build itself, where an image has none
    flex bison m4                            # the front end's generators
    pkg-config pkgconf pkgconf-bin libpkgconf3 # pkg-config, as the Makefile calls it
    libyaml-dev libyaml-0-2                  # the plan file
    libopenblas-dev libopenblas-pthread-dev  # the CPU kernels' BLAS ...
    libopenblas0 libopenblas0-pthread        # ... its libraries
    libgfortran5 libquadmath0                # ... and theirs
    libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 # GPT-2's pre-tokenizer
)

command -v apt-get >/dev/null || { echo "fetch-debs: needs apt-get (Debian 12)" >&2; exit 1; }
mkdir -p "$DEBS"
cd "$DEBS"
rm -f ./*.deb
# (apt-get download warns when it runs as root that it cannot drop to the
# _apt user; the files are the same)
if ! apt-get download "${PACKAGES[@]}" 2>"$DEBS/.err"; then
    echo "fetch-debs: apt-get download failed; updating the package lists and retrying" >&2
    cat "$DEBS/.err" >&2
    apt-get update >/dev/null
    apt-get download "${PACKAGES[@]}"
fi
rm -f "$DEBS/.err"
n=$(ls ./*.deb | wc -l)
if [ "$n" -ne "${#PACKAGES[@]}" ]; then
    echo "fetch-debs: got $n .deb files for ${#PACKAGES[@]} packages" >&2
    exit 1
fi
echo "fetch-debs: ${n} packages, $(du -sh . | cut -f1), in $DEBS:"
ls -1 ./*.deb | sed 's|^\./|  |'
