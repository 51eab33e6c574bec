#!/usr/bin/env bash
# One command for whoever next has an NVIDIA GPU: what runs on it, what does not, and how fast.
#
#   bash benchmarks/gpu_check.sh OUTDIR               # on a GPU machine (4-5 minutes on an H200)
#   bash benchmarks/gpu_check.sh OUTDIR --simulator   # no GPU: the same steps, tiny sizes,
#                                                     # Numba's CUDA simulator (CI runs this)
#
# Steps, each writing OUTDIR/<step>.txt, and one line each in OUTDIR/summary.txt:
#   env        GPU, driver, Python and library versions, where the cuda backend keeps arrays
#   pytest     `pytest -m gpu -n auto` (the catalogue on the cuda and cupy backends)
#   bench-*    `python -m benchmarks quick gpu -o dtype=float32 -o backends=B`, one process per
#              backend B (cupy, then cuda, or those GPU_CHECK_BENCH names, e.g. "cuda"; a
#              crash in one leaves the other's rows, and a crashed worker its rows so far): whole
#              gradients first (layer-parallel per step and batched, serial, PyTorch), then
#              each layer and the step, checks against NumPy, launch counts; OUTDIR/bench-B.json.
#              On the simulator one `tiny gpu` run of every backend (OUTDIR/bench.json)
#   profile    `python -m benchmarks.gpu_profile`: where a gradient's host time goes, per
#              backend, serial and layer-parallel (OUTDIR/profile-<backend>-<mode>.txt)
#   train-*    `refbraid train` on numba, cuda and cupy; train-compare.txt sets their final
#              lines side by side (the metrics, not the times, should agree)
#   mpi        `mpiexec -n 2 refbraid train --backend cuda` when mpiexec and mpi4py exist
# Correctness first: the tests, then the timed steps (on the then idle GPU). A step whose tool
# is missing (no GPU, no CuPy, no mpiexec, no pytest-xdist) is skipped with the reason. Runs
# offline with the checkout on PYTHONPATH; nothing is installed, but for wheels carried in
# gpu-wheels/ (into a temporary folder, ahead on PYTHONPATH, removed at exit). Exit status: 0
# when no step failed (skips are not failures), 1 otherwise. The float64 rows and cuda-host
# (the cuda kernels on host arrays): `NUMBA_ENABLE_CUDASIM=0 python -m benchmarks quick gpu`. docs/gpu.md says more.
set -uo pipefail

usage="usage: bash benchmarks/gpu_check.sh OUTDIR [--simulator]"
out=${1:?$usage}
mode=gpu
if [ "${2:-}" = "--simulator" ]; then mode=simulator; elif [ -n "${2:-}" ]; then
    echo "$usage" >&2; exit 2
fi
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$root"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" MPLBACKEND=Agg PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
summary="$out/summary.txt"
: > "$summary"
failed=0

note() { echo "$*" | tee -a "$summary"; }

# Wheels carried to an offline GPU machine (docs/gpu.md: a NumPy numba-cuda can run,
# array-api-compat) go into a folder of their own, ahead of the machine's packages.
if [ $mode = gpu ] && compgen -G "$root/gpu-wheels/*.whl" > /dev/null; then
    site=$(mktemp -d "${TMPDIR:-/tmp}/refbraid-gpu-site.XXXXXX")
    trap 'rm -rf "$site"' EXIT
    if "$py" -m pip install -q --no-index --no-deps --no-compile --target "$site" \
            "$root"/gpu-wheels/*.whl > "$out/wheels.txt" 2>&1; then
        export PYTHONPATH="$root:$site${PYTHONPATH#"$root"}"
        note "wheels: gpu-wheels/*.whl installed to $site (ahead on PYTHONPATH; removed at exit)"
    else
        note "wheels: FAILED to install gpu-wheels/*.whl: see wheels.txt"; failed=1
    fi
fi
step() {  # step NAME COMMAND...: run, output to OUTDIR/NAME.txt, one summary line
    local name=$1 t0 rc
    shift
    t0=$(date +%s)
    "$@" > "$out/$name.txt" 2>&1
    rc=$?
    if [ $rc -eq 0 ]; then note "$name: ok ($(( $(date +%s) - t0 )) s)"; else
        note "$name: FAILED (exit $rc, $(( $(date +%s) - t0 )) s): see $name.txt"; failed=1
    fi
}
has_module() { "$py" -c "import $1" > /dev/null 2>&1; }

if [ $mode = simulator ]; then
    export NUMBA_ENABLE_CUDASIM=1
    # tiny: every simulated CUDA thread is a Python thread
    train_args=(--data peaks --samples 40 --layers 4 --levels 2 --cfactor 2 --width 4
                --epochs 1 --batch-size 8)
    pytest_args=(tests/test_gpu.py)  # its tests skip without a GPU: this checks the step
else
    export NUMBA_ENABLE_CUDASIM=0
    train_args=(--data peaks --epochs 2)
    pytest_args=()
fi

# ------------------------------------------------------------------------------ env
step env "$py" - <<'EOF'
import importlib, platform, shutil, subprocess
print("python", platform.python_version(), platform.machine())
for name in ("numpy", "numba", "numba_cuda", "cupy", "torch", "mpi4py", "array_api_compat"):
    try:
        print(name, getattr(importlib.import_module(name), "__version__", "?"))
    except Exception as err:
        print(name, "absent", f"({type(err).__name__})")
if shutil.which("nvidia-smi"):
    q = "--query-gpu=name,driver_version,memory.total,compute_cap"
    print("nvidia-smi", subprocess.run(["nvidia-smi", q, "--format=csv,noheader"],
                                       capture_output=True, text=True).stdout.strip())
else:
    print("nvidia-smi absent")
from refbraid.backends import available_backends
print("backends", " ".join(available_backends()))
try:
    from refbraid.backends.numba_cuda_memory import mode_note
    print(mode_note())
except Exception as err:
    print("cuda backend", "unavailable", err)
EOF
cat "$out/env.txt"

gpu=no
if [ $mode = gpu ] && "$py" -c "from numba import cuda; import sys; sys.exit(not cuda.is_available())" \
        > /dev/null 2>&1; then
    gpu=yes
fi
if [ $mode = gpu ] && [ $gpu = no ]; then
    note "no CUDA GPU found (numba.cuda.is_available() is False): GPU steps skipped;" \
         "run with --simulator to check the script without one"
    exit $failed
fi

# ------------------------------------------------------------------------------ tests
if has_module xdist; then parallel=(-n auto); else
    parallel=(); note "pytest: pytest-xdist absent, running in one process"
fi
if has_module pytest; then
    step pytest "$py" -m pytest -m gpu "${parallel[@]}" -q -p no:cacheprovider "${pytest_args[@]}"
else
    note "pytest: skipped: pytest is not installed"
fi

# ------------------------------------------------------------------------------ benchmark
# (after the tests, which have finished: the times are taken on an idle GPU)
if [ $mode = simulator ]; then
    step bench "$py" -m benchmarks tiny gpu -o dtype=float64 --json "$out/bench.json"
else  # median of 5 after 2 warm-ups
    for bk in ${GPU_CHECK_BENCH:-cupy cuda}; do
        if [ $bk = cupy ] && ! has_module cupy; then
            note "bench-cupy: skipped: CuPy is not installed"; continue
        fi
        step "bench-$bk" "$py" -m benchmarks quick gpu -o dtype=float32 -o backends=$bk \
            --json "$out/bench-$bk.json"
    done
fi
if [ $mode = simulator ]; then
    step profile "$py" -m benchmarks.gpu_profile "$out" --simulator
else
    step profile "$py" -m benchmarks.gpu_profile "$out"
fi

# ------------------------------------------------------------------------------ training
run_cupy() {  # refbraid on the cupy backend; in simulator mode on the CuPy-like stand-in
    if [ $mode = simulator ]; then
        "$py" -c 'import sys
from refbraid.backends.cupy_standin import install
from refbraid.cli import main
with install():
    sys.exit(main(sys.argv[1:]))' "$@"
    else
        "$py" -m refbraid "$@"
    fi
}
for bk in numba cuda cupy; do
    if [ $bk = cupy ] && [ $mode = gpu ] && ! has_module cupy; then
        note "train-cupy: skipped: CuPy is not installed"; continue
    fi
    if [ $bk = cupy ]; then
        step train-cupy run_cupy train "${train_args[@]}" --backend cupy --out "$out/run-cupy"
        # the same training with every gradient replayed from a CUDA graph
        step train-cupy-graphs run_cupy train "${train_args[@]}" --backend cupy --cuda-graphs \
            --out "$out/run-cupy-graphs"
    else
        step "train-$bk" "$py" -m refbraid train "${train_args[@]}" --backend $bk \
            --out "$out/run-$bk"
    fi
done
{
    echo "final lines (metrics before ' in '; times differ by design):"
    for bk in numba cuda cupy cupy-graphs; do
        [ -f "$out/train-$bk.txt" ] || continue
        line=$(grep '^finished' "$out/train-$bk.txt" | sed -n '$p')
        printf '%-12s %s\n' "$bk" "${line%% in *}"
    done
} > "$out/train-compare.txt"
cat "$out/train-compare.txt"
finals=$(tail -n +2 "$out/train-compare.txt" | cut -c14-)
if [ "$(grep -c '^finished' <<< "$finals")" -ge 2 ] && [ "$(sort -u <<< "$finals" | wc -l)" -eq 1 ]
then
    note "train-compare: the final lines agree"
else
    note "train-compare: the final lines DIFFER (or a run is missing): see train-compare.txt"
fi

# ------------------------------------------------------------------------------ MPI
if ! command -v mpiexec > /dev/null 2>&1; then
    note "mpi: skipped: no mpiexec on PATH"
elif ! has_module mpi4py; then
    note "mpi: skipped: mpi4py is not installed"
else
    # Open MPI refuses to run as root (a container's user) unless told; MPICH ignores these
    step mpi env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
        mpiexec -n 2 "$py" -m mpi4py -m refbraid train "${train_args[@]}" --backend cuda \
        --out "$out/run-mpi2-cuda"
fi

echo "summary ($mode mode): $summary"
exit $failed
