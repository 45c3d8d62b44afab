#!/usr/bin/env bash
# The GPU run of issue 56 in one command, within 8 minutes (benchmarks/gpu/README.md): installs the
# carried wheels, prints the versions, runs the CUDA tests and the measurements (benchmarks/gpu/measure.py),
# each under a limit of its own, and prints a summary. Everything goes into ${OUT:-/tmp/gpu-out}:
# run.log, junit.xml, figures.json, summary.txt. Exits non-zero if any step failed.
#
#   bash benchmarks/gpu/run.sh             # on the GPU machine, from the repository root
#   bash benchmarks/gpu/run.sh --dry-run   # anywhere: no CUDA device expected; each step stops at its first CUDA call
set -uo pipefail
cd "$(dirname "$0")/../.."
DRY=${GPU_DRY_RUN:-0}
[ "${1:-}" = "--dry-run" ] && DRY=1
FLAGS=$([ "$DRY" = 1 ] && echo "--dry-run --seconds 0.3" || echo "--seconds 1.5")
PY=${PYTHON:-python3}
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT" && rm -f "$OUT"/{run.log,junit.xml,figures.json,summary.txt}
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD TORCH_CPP_LOG_LEVEL=ERROR PIP_ROOT_USER_ACTION=ignore
STEPS=()

step() {  # step NAME LIMIT_S COMMAND...: COMMAND under `timeout`, its output into the log; notes its exit code and time
    local name=$1 limit=$2 start=$SECONDS rc
    shift 2
    echo "=== $name (limit $limit s): $*" | tee -a "$OUT/run.log"
    timeout -k 5 "$limit" "$@" 2>&1 | tee -a "$OUT/run.log"
    rc=${PIPESTATUS[0]}
    STEPS+=("$name=$rc:$((SECONDS - start))")
    echo "=== $name: exit $rc after $((SECONDS - start)) s" | tee -a "$OUT/run.log"
}

install_wheels() {  # the wheels into /tmp/site; a dry run falls back on the packages installed here
    rm -rf /tmp/site
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && return
    [ "$DRY" = 1 ] && echo "dry run: the wheels do not install here; using the installed packages" && return
    return 1
}

print_versions() {
    $PY - <<'EOF'
import platform, torch, tensordict, gymnasium
print(f"python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
      f"tensordict {tensordict.__version__} ({tensordict.__file__}), gymnasium {gymnasium.__version__}")
print("GPU:", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none (torch.cuda.is_available() is False)")
EOF
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader \
        || echo "nvidia-smi: none"
    [ "$DRY" = 1 ] || $PY -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'"
}

export -f install_wheels print_versions
export DRY PY
step install 30 bash -c install_wheels
step versions 20 bash -c print_versions
step tests 135 $PY -m pytest -p no:cacheprovider -q -rA --junitxml="$OUT/junit.xml" \
    tests/transport/test_cuda.py tests/collectors/test_cuda_batched.py tests/worker/test_cuda_nodes.py
step probe 35 $PY benchmarks/gpu/measure.py probe --out "$OUT" --budget 30 $FLAGS
# the fork check of torch.cuda.is_available() by NVML, so that the figures come even where the probe
# finds that workers forked after the trainer's CUDA checks cannot use CUDA
for m in batches:75 weights:90 policies:75; do
    step "${m%:*}" "${m#*:}" env PYTORCH_NVML_BASED_CUDA_CHECK=1 \
        $PY benchmarks/gpu/measure.py "${m%:*}" --out "$OUT" --budget $((${m#*:} - 5)) $FLAGS
done
$PY benchmarks/gpu/measure.py summary --out "$OUT" --steps "${STEPS[*]}" 2>&1 | tee "$OUT/summary.txt"
exit "${PIPESTATUS[0]}"
