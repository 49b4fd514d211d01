#!/usr/bin/env bash
# Everything the GPU machine checks and times for a submission, most important first, each step
# bounded; two sections so that each stays under the device's 10-minute limit per command:
#
#   [REV=commit] bench/h200.sh OUT
#       [capacity|step|sampling|linear|delays|verify|glue|append|clock|all]
#       (default all but the last seven; REV names verify's profiles, see there)
#
# capacity: real-clock capacity with every call aged to a full 2-minute context (`cadence
#   bench engine --full-context`): 300 calls with fp8 KV rings, 152 with bf16, and 1 call
#   with the GPU's SM clock sampled every 100 ms alongside (nvidia-smi, clocks.csv);
# step: the step back to back against Kyutai's reference in the same run, every ring full
#   (bench/engine_gpu.py; the reference runs as moshi does by default, torch.compile on), fp8
#   at 128 calls, the GPU tests (every kernel test compiled, graph == eager tokens, 7B
#   conformance),
#   where the tick goes kernel by kernel (bench/tick_kernels.py) and stage by stage
#   (bench/engine_stages.py, with programmatic dependent launch on and off);
# sampling: the one-launch sampler (kernels/sampling.py) compiled against its torch rule, the
#   nine streams of a tick both ways (bench/kernels_sampling.py), the step back to back
#   sampling as served (top-k) with the kernel and with torch's ops, greedy as before;
# linear: the few-rows linear's tiles (kernels/fused_linear.py, the swapped tensor-core ones
#   too) against cuBLAS at the depformer's and the temporal transformer's shapes, and the
#   depformer stage with each GEMM's best tile (bench/kernels_fused_linear.py); its kernel
#   tests compiled first;
# delays: the token delay rings in two launches a step (kernels/token_delays.py), its test
#   compiled, then the step back to back with and without it, alternated;
# glue: Mimi's glue kernels and the temporal attention's append in its launch compiled against
#   what they replace, then Mimi's stages with and without the glue kernels
#   (bench/engine_stages.py --ab glue);
# append: the temporal stage with and without the append in the attention (--ab append);
# clock: the 1-call tick on the clock as served and with `--no-mimi-glue-kernels`,
#   `--no-rope-in-attention` and both, alternated twice (ROUNDS=n: n times);
# verify: the GPU tests alone (the engine's, the doorbell's, then every kernel test compiled,
#   spread over 8 workers with pytest-xdist) and where the 1-call tick goes kernel by kernel
#   (bench/tick_kernels.py) and in Mimi (bench/mimi_gpu.py's costliest kernels).
# Run from the repository root with torch, triton and Kyutai's `moshi` importable. Results land
# in OUT as JSON (machine, versions and command inside) and logs; copy the ones worth keeping to
# bench/results/.
set -uo pipefail
out=${1:?output folder}
section=${2:-all}
mkdir -p "$out"
export NO_TORCH_COMPILE=1 PYTHONUNBUFFERED=1
engine=(python3 -m cadence bench engine --model moshi --random-weights --device cuda
    --executor graph --metrics-port 0 --log-level warning --full-context)
if [[ $section == capacity || $section == all ]]; then
    timeout 200 "${engine[@]}" --kv-dtype fp8 --sweep 300 --seconds 30 \
        --json "$out/bench_engine_fp8_300.json" 2>&1 | tail -4
    timeout 200 "${engine[@]}" --kv-dtype bf16 --sweep 152 --seconds 60 \
        --json "$out/bench_engine_bf16_152.json" 2>&1 | tail -4
    nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw --format=csv -lms 100 \
        >"$out/clocks.csv" &
    sampler=$!
    timeout 90 "${engine[@]}" --kv-dtype bf16 --slots 1 --seconds 20 \
        --json "$out/bench_engine_bf16_1.json" 2>&1 | tail -4
    kill "$sampler"
fi
if [[ $section == step || $section == all ]]; then
    timeout 200 python3 bench/engine_gpu.py --slots 1,128 --steps 40 --full-rings --reference \
        --json "$out/engine_gpu.json" 2>&1 | tail -5
    timeout 60 python3 bench/engine_gpu.py --slots 128 --steps 40 --full-rings --kv-dtype fp8 \
        --json "$out/engine_gpu_fp8_128.json" 2>&1 | tail -3
    # every kernel test compiled (those not marked `gpu` run on both; `interpreter` ones are
    # deselected)
    timeout 170 python3 -m pytest -q -m "not interpreter" tests/kernels -p no:cacheprovider 2>&1 |
        tee "$out/gpu_tests_kernels.log" | tail -2
    timeout 120 python3 -m pytest -q -m gpu tests/engine -p no:cacheprovider 2>&1 |
        tee "$out/gpu_tests.log" | tail -5
    timeout 90 python3 bench/tick_kernels.py --slots 1,128 --json "$out/tick_kernels.json" 2>&1 |
        tail -1 | cut -c1-300
    timeout 60 python3 bench/tick_kernels.py --slots 128 --kv-dtype fp8 \
        --json "$out/tick_kernels_fp8_128.json" 2>&1 | tail -1 | cut -c1-300
    timeout 90 python3 bench/engine_stages.py --slots 1,128 --pdl both \
        --json "$out/engine_stages.json" 2>&1 | tail -2
fi
if [[ $section == sampling ]]; then
    timeout 150 python3 -m pytest -q -m "not interpreter" tests/kernels/test_sampling.py \
        tests/kernels/test_depformer_program.py -p no:cacheprovider 2>&1 |
        tee "$out/gpu_tests_sampling.log" | tail -2
    timeout 90 python3 bench/kernels_sampling.py --slots 1,128,300 \
        --json "$out/kernels_sampling.json" 2>&1 | tail -3 | cut -c1-400
    for run in "top_k:--top-k" "top_k_torch:--top-k --torch-sampling" "greedy:"; do
        # shellcheck disable=SC2086 # the flags after the colon are a list
        timeout 170 python3 bench/engine_gpu.py --slots 1,128 --steps 40 --full-rings ${run#*:} \
            --json "$out/engine_gpu_sampling_${run%%:*}.json" 2>&1 | grep cadence | cut -c1-300
    done
fi
if [[ $section == delays ]]; then
    # the delay rings in two launches (kernels/token_delays.py): compiled against the torch
    # ops, then the step with and without it, twice in turn
    timeout 120 python3 -m pytest -q tests/kernels/test_token_delays.py -p no:cacheprovider \
        2>&1 | tee "$out/gpu_tests_token_delays.log" | tail -2
    for round in 1 2; do
        for run in "torch:--torch-delays" "kernel:"; do
            # shellcheck disable=SC2086 # the flag after the colon is a list
            timeout 170 python3 bench/engine_gpu.py --slots 1,128 --steps 60 --full-rings \
                ${run#*:} --json "$out/engine_gpu_delays_${run%%:*}_$round.json" 2>&1 |
                grep cadence | cut -c1-300
        done
    done
fi
if [[ $section == verify ]]; then
    timeout 240 python3 -m pytest -q -m gpu tests/engine tests/kernels/test_doorbell.py \
        -p no:cacheprovider 2>&1 | tee "$out/gpu_tests_engine_verify.log" | tail -3
    timeout 300 python3 -m pytest -q -n 8 -m "not interpreter" tests/kernels \
        -p no:cacheprovider 2>&1 | tee "$out/gpu_tests_kernels_verify.log" | tail -2
    # the profiles named for the commit: committed results of earlier runs keep their names.
    # REV from the caller: the GPU machine's copy of .git can be older than the working tree
    # it runs (seen: a run of one commit's tree that git there named by an earlier one)
    rev=${REV:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
    timeout 90 python3 bench/tick_kernels.py --slots 1 --json "$out/tick_kernels_1_$rev.json" \
        2>&1 | tail -1 | cut -c1-300
    timeout 90 python3 bench/mimi_gpu.py --slots 1 --no-sweep --json "$out/mimi_gpu_1_$rev.json" \
        2>&1 | tail -2 | cut -c1-300
fi
if [[ $section == glue ]]; then
    # the kernels served since 2026-12-07, compiled against what they replace: Mimi's glue
    # kernels (MimiCodec.use_glue_kernels; also in the codec's CUDA-graph test) and the
    # temporal attention's RoPE + append inside its launch (kernels/rope_attention.py; also in
    # the tiny LM and the whole model's graph test), spread over 8 workers
    timeout 300 python3 -m pytest -q -n 8 -m "not interpreter" tests/kernels/test_mimi_glue.py \
        tests/kernels/test_mimi_codec.py tests/kernels/test_rope_attention.py \
        tests/kernels/test_ring_attention_moshi.py -p no:cacheprovider 2>&1 |
        tee "$out/gpu_tests_glue.log" | tail -2
    # each stage with and without them, twice in turn
    timeout 280 python3 bench/engine_stages.py --slots 1,128,300 --stages mimi_encode,mimi_decode \
        --ab glue --json "$out/engine_stages_glue.json" 2>&1 | tail -2 | cut -c1-400
fi
if [[ $section == append ]]; then
    timeout 280 python3 bench/engine_stages.py --slots 1,4,32 --stages temporal --ab append \
        --json "$out/engine_stages_append.json" 2>&1 | tail -2 | cut -c1-400
fi
if [[ $section == clock ]]; then
    # the whole 1-call tick on the 80 ms clock as served, without Mimi's glue kernels,
    # without the append in the attention, and without both, twice in turn
    for round in $(seq "${ROUNDS:-2}"); do
        for run in "served:" "no_glue:--no-mimi-glue-kernels" \
            "no_append:--no-rope-in-attention" \
            "neither:--no-mimi-glue-kernels --no-rope-in-attention"; do
            # shellcheck disable=SC2086 # the flags after the colon are a list
            timeout 90 "${engine[@]}" --kv-dtype bf16 --slots 1 --seconds 15 ${run#*:} \
                --json "$out/bench_engine_bf16_1_${run%%:*}_$round.json" 2>&1 | tail -1
        done
    done
fi
if [[ $section == linear ]]; then
    timeout 120 python3 -m pytest -q -x -m "not interpreter" tests/kernels/test_fused_linear.py \
        -p no:cacheprovider 2>&1 | tee "$out/gpu_tests_fused_linear.log" | tail -2
    timeout 420 python3 bench/kernels_fused_linear.py --rows 1,8 --temporal \
        --json "$out/kernels_fused_linear.json" 2>&1 | grep -E "best_us|gemm" | tail -40
fi
