#!/usr/bin/env bash
# Everything the GPU machine checks and times for a submission, most important first, each step
# bounded so that one command stays under the device's 10-minute limit:
#
#   bench/h200.sh OUT
#
# 1. real-clock capacity: 300 calls with fp8 KV rings aged to a full 2-minute context
#    (`cadence bench engine --full-context`), zero misses or not;
# 2. step time against Kyutai's reference in the same run, every ring full (bench/engine_gpu.py);
# 3. the GPU tests (graph == eager tokens, kernels compiled, 7B conformance);
# 4. where the tick goes: time and kernels per stage (bench/engine_stages.py);
# 5. fp8 step time at 128 calls.
# Run from the repository root with torch, triton and Kyutai's `moshi` importable. Results land
# in OUT as JSON (machine, versions and command inside) and logs; copy the ones worth keeping to
# bench/results/.
set -uo pipefail
out=${1:?output folder}
mkdir -p "$out"
export NO_TORCH_COMPILE=1 PYTHONUNBUFFERED=1
timeout 200 python3 -m cadence bench engine --model moshi --random-weights --device cuda \
    --executor graph --metrics-port 0 --log-level warning --full-context --kv-dtype fp8 \
    --sweep 300 --seconds 40 --json "$out/bench_engine_fp8_300.json" 2>&1 | tail -25
timeout 170 python3 bench/engine_gpu.py --slots 1,128 --steps 40 --full-rings --reference \
    --json "$out/engine_gpu.json" 2>&1 | tail -6
timeout 150 python3 -m pytest -q -m gpu tests/engine tests/kernels -p no:cacheprovider 2>&1 | tee "$out/gpu_tests.log" |
    tail -15
timeout 60 python3 bench/engine_stages.py --slots 1,128 --json "$out/engine_stages.json" 2>&1 |
    tail -2
timeout 60 python3 bench/engine_gpu.py --slots 128 --steps 40 --full-rings --kv-dtype fp8 \
    --json "$out/engine_gpu_fp8.json" 2>&1 | tail -4
