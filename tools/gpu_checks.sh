#!/usr/bin/env bash
# The GPU checks of one lent-machine sitting, in one call: the `gpu` tests, then the CUDA
# benchmarks, each under its own time limit so that a slow part leaves the others their turn.
#
#   tools/gpu_checks.sh OUT_DIR [PY]
#
# Writes OUT_DIR/tests.log, OUT_DIR/stitch_models_cuda.json (+ .log) and OUT_DIR/gpu.json
# (+ .log). Each benchmark writes its JSON after every part, so a part cut off by its limit
# leaves the parts before it. Limits (seconds) from the environment: TESTS_S, STITCH_S, GPU_S.
set -u
out=${1:?usage: tools/gpu_checks.sh OUT_DIR [PY]}
py=${2:-python3}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
stamp() { echo "== $(date -u +%T) $*"; }

stamp machine
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
"$py" -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'

# The gpu-marked test files in parallel (each file whole in one worker): they are bound by
# Triton's compiles, which run on the host's cores.
stamp tests
files=$(grep -rl "mark.gpu" tests)
timeout "${TESTS_S:-150}" "$py" -m pytest -q -m gpu -n 4 --dist loadfile $files \
    >"$out/tests.log" 2>&1
echo "tests: exit $?"; tail -n 15 "$out/tests.log"

stamp stitch_models
timeout "${STITCH_S:-170}" "$py" benchmarks/stitch_models.py --device cuda --quick \
    --out "$out/stitch_models_cuda.json" >"$out/stitch_models_cuda.log" 2>&1
echo "stitch_models: exit $?"; grep -E "^==|geomean|Error|error" "$out/stitch_models_cuda.log" | tail -n 20

stamp gpu.py
timeout "${GPU_S:-110}" "$py" benchmarks/gpu.py --parts "${GPU_PARTS:-stitch,spconv,moe}" \
    --out "$out/gpu.json" >"$out/gpu.log" 2>&1
echo "gpu.py: exit $?"; grep -E "^==|Error|error" "$out/gpu.log" | tail -n 20
stamp done
