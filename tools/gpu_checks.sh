#!/usr/bin/env bash
# The GPU session's standard script, on a machine with a CUDA GPU, from the repository root: the GPU test layer
# (tests marked gpu, in tests/gpu and wherever else they are), the benchmarks with per-stage profiles, qr against
# torch and CuPy, Q's products in fp32 against tf32x3 (tools/q_products.py), the host's time a call
# (tools/host_overhead.py), and with TUNE=1 a search of every reference and tall shape: up to 50 trials, no new
# trial after TUNE_SECONDS (default 90) a shape.
# Everything it prints also goes to $OUT/log.txt (default ./gpu-out); tuned schedules go to $OUT/schedules.
# Each step has a time limit, so that one slow step does not take the others' time.
#
#     OUT=gpu-out TUNE=0 tools/gpu_checks.sh
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-out}
mkdir -p "$out"
step() {
    local limit=$1
    shift
    echo "=== $*" | tee -a "$out/log.txt"
    timeout "$limit" "$@" 2>&1 | tee -a "$out/log.txt"
}
parallel=()
python3 -c "import xdist" 2>/dev/null && parallel=(-n 8)
step 420 python3 -m pytest -q -p no:cacheprovider "${parallel[@]}" -m gpu tests
step 240 python3 -m qrgen bench --reps 10 --mixed --profile
step 120 python3 -m qrgen bench --tall --reps 5 --profile
step 180 python3 -m qrgen bench --qr
step 180 python3 tools/q_products.py 2x4096x4096 8x2048x2048 60x1024x1024
step 120 python3 tools/host_overhead.py 20x32x32 40x176x176
if [ "${TUNE:-0}" = 1 ]; then
    for case in 20x32x32 40x176x176 40x352x352 640x512x512 60x1024x1024 8x2048x2048 2x4096x4096 \
                1x4096x4096 1x2048x2048 1x4096x1024 1x8192x512 1x100000x32 1x40000x256; do
        IFS=x read -r batch m n <<<"$case"
        step 600 python3 -m qrgen tune --shape "${m}x${n}" --batch "$batch" --trials 50 \
            --time-limit "${TUNE_SECONDS:-90}" --schedules "$out/schedules"
    done
fi
