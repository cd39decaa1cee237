#!/usr/bin/env bash
# Everything that needs CUDA, in one command on a GPU machine that has torch, transformers and
# pytest but no Ray, vLLM or Hydra (tests/unit/test_device_imports.py keeps these importable
# there): the padded-gradient probe, the `gpu` tests, then the GPU benchmarks. Logs and
# bench_results/*.json go to $OUT (default ./gpu_out). GPU_CHECK_PARTS (default
# "probe tests bench") runs some of them.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-gpu_out}"
mkdir -p "$out" bench_results
export PYTHONUNBUFFERED=1 PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}."
py="${PYTHON:-python3}"
parts="${GPU_CHECK_PARTS:-probe tests bench}"
status=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
"$py" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a "$out/gpu.txt"
df -h /dev/shm | tee -a "$out/gpu.txt"
if [[ " $parts " == *" probe "* ]]; then
    "$py" -m tests.perf.padded_grad_probe 2>&1 | tee "$out/padded_probe.log" || status=1
fi
if [[ " $parts " == *" tests "* ]]; then
    "$py" -m pytest -p no:cacheprovider -m gpu -ra \
        tests/integration/trainer/test_fsdp_gpu.py tests/integration/trainer/test_weight_send_gpu.py \
        2>&1 | tee "$out/gpu_tests.log" || status=1
fi
if [[ " $parts " == *" bench "* ]]; then
    "$py" -m pytest -p no:cacheprovider -s -ra \
        tests/perf/test_bench_weight_sync_gpu.py tests/perf/test_bench_actor_gpu.py \
        2>&1 | tee "$out/gpu_bench.log" || status=1
    cp bench_results/actor_gpu.json bench_results/weight_sync_gpu.json "$out/" 2>/dev/null
fi
exit "$status"
