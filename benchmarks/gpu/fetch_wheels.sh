#!/usr/bin/env bash
# Download, here, the wheels that the GPU machine lacks (benchmarks/gpu/wheels.txt) into .whl/ at the
# repository root (git-ignored), for Python 3.12 on x86-64; the device call carries .whl. Run from anywhere.
set -euo pipefail
cd "$(dirname "$0")/../.."
rm -rf .whl && mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any \
    -d .whl -r benchmarks/gpu/wheels.txt
wanted=$(grep -c '==' benchmarks/gpu/wheels.txt)
got=$(ls .whl/*.whl | wc -l)
[ "$got" -eq "$wanted" ] || { echo "expected $wanted wheels, got $got (two versions of one package stop the install)" >&2; exit 1; }
bytes=$(du -cb .whl/*.whl | tail -1 | cut -f1)
ls -l .whl
echo "$got wheels, $((bytes / 1024)) KiB in all"
[ "$bytes" -lt $((50 * 1024 * 1024)) ] || { echo "the wheels are over 50 MiB" >&2; exit 1; }
