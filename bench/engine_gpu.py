"""Moshi 7B tick time vs concurrent calls on one GPU: Cadence's executors against Kyutai's.

    python bench/engine_gpu.py --slots 1,8,32,64,128 --steps 60 --json OUT.json [--reference]
        [--kv-dtype bf16|fp8] [--full-rings] [--top-k [--torch-sampling]] [--torch-delays]
        [--no-fused-glue]

For each slot count N (= calls served in lockstep) it builds Cadence's Moshi (bf16, random
weights, 2-minute KV context = 1500 frames) with N rows and measures, back to back:
- `eager`: the step launched op by op (N = 1 and 8 only: it is far off the 80 ms budget);
- `graph`: the whole step (Mimi encode, temporal transformer, text and depth sampling, Mimi
  decode) replayed as one CUDA graph, host copies in and out and the one sync included;
and with --reference, Kyutai's `moshi` 0.2.13 pipeline (`mimi.encode` -> `LMGen.step` with its
own CUDA graphs -> `mimi.decode`) batched at the same N, same context, same dtype, as moshi
runs by default: its RMSNorm, RoPE and gating under torch.compile (fused Triton kernels) inside
its CUDA graphs. `--reference-no-compile` sets NO_TORCH_COMPILE=1 for it (each of those
functions then runs op by op: ~10 ms slower per step at 1 and 128 calls, 27.3 / 57.2 ms median
in bench/results/engine_gpu.json as of commit fa202b1 against 17.9 / 45.3 compiled in
bench/results/engine_gpu_ref_compiled.json); the row records which.

Reported per N: median / p99 / max milliseconds per step, peak GPU memory, kernels launched by
one eager step (the graph replays the same kernels), and the ratio graph / reference. These are
step times back to back, not ticks on the 80 ms clock: the capacity claim (zero misses over
100,000 session-ticks) is `cadence bench engine`'s (bench/h200.sh runs both).

Weights are random (seeded on the device). The reference attends over its whole ring whatever
it holds; Cadence's ring kernel reads only what a call has written, so its calls, all a few
steps old here, cost less than full ones: --full-rings fills every temporal ring with random
K/V and puts every call past the ring's length first (the worst case, a call past 2 minutes).
Mimi's 250-frame transformer rings are not filled: they stay young (about 2 frames a step);
at full rings Mimi costs ~0.8 ms more per step at 128 calls (bench/results/mimi_gpu.json
against engine_stages_after.json). `cadence bench engine --full-context` ages both.
`--kv-dtype fp8` serves fp8 e4m3 rings (docs/kv-cache.md).
"""

import argparse
import functools
import gc
import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch
from gpu_timing import count_kernels, machine  # bench/, this folder

from engine.executors.eager import EagerExecutor
from engine.executors.graph import GraphExecutor
from engine.models import ModelOptions
from engine.models.moshi import sampling
from engine.models.moshi.config import MoshiConfig, moshiko
from engine.models.moshi.lm import MoshiLm
from engine.models.moshi.mimi.codec import MimiCodec
from engine.models.moshi.model import MoshiModel, randomize
from engine.models.moshi.sampling import AUDIO_DEFAULT, TEXT_DEFAULT, Sampling
from kernels import dependent_launch

log = logging.getLogger("engine_gpu")
SAMPLES = 1920
CONTEXT = 1500  # 2 minutes of 80 ms frames


Weights = dict[str, dict[str, torch.Tensor]]


GREEDY = Sampling(greedy=True, temperature=1.0, top_k=1)


# the delay rings in two launches a step (kernels/token_delays.py, as served), for every
# model build() makes; `--torch-delays`: TokenDelays' torch ops instead
DELAY_KERNEL = True
# Mimi's glue kernels and the temporal attention's RoPE + append in its launch, as the
# engine serves them on CUDA; `--no-fused-glue`: each in the launches of before
SERVED = ModelOptions()
FUSED_GLUE = True


def build(
    config: MoshiConfig,
    slots: int,
    weights: Weights,
    kv_dtype: torch.dtype | None = None,
    how: tuple[Sampling, Sampling] = (GREEDY, GREEDY),
) -> MoshiModel:
    """how: the text's and the audio's sampling."""
    device = torch.device("cuda")
    generator = torch.Generator(device=device).manual_seed(0)
    lm = MoshiLm(config.lm, slots, device, torch.bfloat16, *how, generator, kv_dtype)
    mimi = MimiCodec(config.mimi, slots, device)
    if weights:
        lm.load_state_dict(weights["lm"])
        mimi.load_state_dict(weights["mimi"])
    else:
        randomize(lm, 1)
        randomize(mimi, 2)
    lm.eval()
    mimi.eval()
    lm.delays.fused = None if DELAY_KERNEL else False  # --torch-delays: False
    mimi.use_glue_kernels(FUSED_GLUE and SERVED.mimi_glue_kernels)
    lm.transformer.append_in_attention(FUSED_GLUE and SERVED.rope_in_attention)
    return MoshiModel(config, lm, mimi, slots, device, None)


def percentiles(ms: list[float]) -> dict[str, float]:
    ordered = sorted(ms)
    return {
        "median_ms": round(statistics.median(ordered), 3),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 3),
        "max_ms": round(ordered[-1], 3),
    }


def fill_rings(model: MoshiModel) -> None:
    """Every call past the ring's length, its ring full of random K/V: the worst case."""
    transformer = model.lm.transformer
    for ring in (transformer.keys, transformer.values):
        for layer in range(ring.shape[0]):
            for block in torch.split(ring[layer], 32):  # small temporaries: memory is tight
                block.copy_(torch.randn(block.shape, device=ring.device, dtype=torch.bfloat16))
    slots = transformer.positions.shape[0]
    transformer.positions.copy_(torch.arange(slots, device="cuda") + 3 * CONTEXT)


def time_steps(run: Any, model: MoshiModel, steps: int, full_rings: bool) -> list[float]:
    slots = model.slots
    rng = np.random.default_rng(0)
    pcm = (rng.standard_normal((slots, SAMPLES)) * 0.1).astype(np.float32)
    active = np.ones(slots, np.bool_)
    reset = np.zeros(slots, np.bool_)
    first = reset.copy()
    first[:] = True
    run(pcm, first, active)
    if full_rings:
        fill_rings(model)
    for _ in range(3):
        run(pcm, reset, active)
    torch.cuda.synchronize()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        run(pcm, reset, active)  # ends with the host sync of the outputs
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def cadence_row(
    config: MoshiConfig,
    slots: int,
    steps: int,
    weights: Weights,
    kv_dtype: torch.dtype | None,
    full_rings: bool,
    how: tuple[Sampling, Sampling],
) -> dict[str, Any]:
    torch.cuda.reset_peak_memory_stats()
    model = build(config, slots, weights, kv_dtype, how)
    row: dict[str, Any] = {"slots": slots}
    if slots <= 8:
        eager = EagerExecutor(model).run
        row["eager"] = percentiles(time_steps(eager, model, min(steps, 20), full_rings))
        pcm = np.zeros((slots, SAMPLES), np.float32)
        every = np.ones(slots, np.bool_)
        row["kernels_per_step"] = count_kernels(functools.partial(model.step, pcm, ~every, every))
    t0 = time.perf_counter()
    graph = GraphExecutor(model)
    row["graph_capture_s"] = round(time.perf_counter() - t0, 2)
    row["graph"] = percentiles(time_steps(graph.run, model, steps, full_rings))
    row["peak_memory_gb"] = round(torch.cuda.max_memory_allocated() / 1e9, 2)
    del graph, model
    gc.collect()
    torch.cuda.empty_cache()
    return row


def reference_row(slots: int, steps: int) -> dict[str, Any]:
    # moshi reads NO_TORCH_COMPILE once, when it is first imported (main sets it)
    from moshi.models import loaders
    from moshi.models.lm import LMGen

    torch.cuda.reset_peak_memory_stats()
    device = torch.device("cuda")
    kwargs = loaders._lm_kwargs | {"context": CONTEXT}
    lm = loaders.get_moshi_lm(None, lm_kwargs=kwargs, device=device, dtype=torch.bfloat16)
    mimi = loaders.get_mimi(None, device=device, num_codebooks=8)
    gen = LMGen(lm, use_sampling=False, support_out_of_sync=True)
    pcm = torch.randn(slots, 1, SAMPLES, device=device) * 0.1
    times: list[float] = []
    with torch.no_grad(), mimi.streaming(slots), gen.streaming(slots):
        for i in range(steps + 6):
            t0 = time.perf_counter()
            codes = mimi.encode(pcm)
            tokens = gen.step(codes)
            if tokens is not None:
                # the first steps return the initial token (2048) for delayed codebooks
                mimi.decode(tokens[:, 1:9].clamp(0, 2047))
            torch.cuda.synchronize()
            if i >= 6:
                times.append((time.perf_counter() - t0) * 1e3)
    row = {"slots": slots, **percentiles(times)}
    row["torch_compile"] = not os.environ.get("NO_TORCH_COMPILE")
    row["peak_memory_gb"] = round(torch.cuda.max_memory_allocated() / 1e9, 2)
    del gen, lm, mimi
    gc.collect()
    torch.cuda.empty_cache()
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", default="1,8,32,64,128")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--reference", action="store_true")
    parser.add_argument(
        "--kv-dtype", choices=["bf16", "fp8"], default="bf16", help="Cadence's temporal KV rings"
    )
    parser.add_argument(
        "--full-rings",
        action="store_true",
        help="time Cadence with every temporal ring full (calls past 2 minutes): the ring "
        "kernel's worst case (Mimi's rings stay young)",
    )
    parser.add_argument("--reference-slots", help="default: the same as --slots")
    parser.add_argument(
        "--reference-no-compile",
        action="store_true",
        help="run the reference with NO_TORCH_COMPILE=1 (its compiled functions op by op)",
    )
    parser.add_argument(
        "--no-pdl",
        action="store_true",
        help="Cadence's kernels without programmatic dependent launch (kernels/dependent_launch)",
    )
    parser.add_argument(
        "--top-k",
        action="store_true",
        help="Cadence samples as it serves by default (temperature + top-k) instead of greedy",
    )
    parser.add_argument(
        "--torch-sampling",
        action="store_true",
        help="sample with torch ops instead of kernels/sampling.py's one launch per stream",
    )
    parser.add_argument(
        "--torch-delays",
        action="store_true",
        help="the token delay rings on TokenDelays' ~33 torch ops a step instead of "
        "kernels/token_delays.py's two launches",
    )
    parser.add_argument(
        "--no-fused-glue",
        action="store_true",
        help="Mimi's glue in torch's ops and the temporal RoPE + ring append in a launch of "
        "their own, as before they were served (the engine's --no-mimi-glue-kernels "
        "--no-rope-in-attention)",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.backends.cuda.matmul.allow_tf32 = True
    global DELAY_KERNEL, FUSED_GLUE
    DELAY_KERNEL = not args.torch_delays
    FUSED_GLUE = not args.no_fused_glue
    dependent_launch.ENABLED = not args.no_pdl
    sampling.KERNEL = not args.torch_sampling
    how = (TEXT_DEFAULT, AUDIO_DEFAULT) if args.top_k else (GREEDY, GREEDY)
    config = moshiko()
    assert config.lm.context == CONTEXT
    result: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "machine": machine(),
        "model": "moshiko 7B shapes, random weights, bf16, context 1500 frames",
        "kv_dtype": args.kv_dtype,
        "full_rings": args.full_rings,
        "pdl": dependent_launch.ENABLED,
        "sampling": "top-k" if args.top_k else "greedy",
        "sampling_kernel": sampling.KERNEL,
        "delay_kernel": DELAY_KERNEL,
        "fused_glue": FUSED_GLUE,
        "cadence": [],
        "reference": [],
    }
    kv_dtype = torch.float8_e4m3fn if args.kv_dtype == "fp8" else None
    t0 = time.perf_counter()
    master = build(config, 1, {})
    weights: Weights = {
        "lm": {k: v.cpu() for k, v in master.lm.state_dict().items()},
        "mimi": {k: v.cpu() for k, v in master.mimi.state_dict().items()},
    }
    del master
    gc.collect()
    torch.cuda.empty_cache()
    log.info("weights ready in %.1f s", time.perf_counter() - t0)
    for slots in [int(s) for s in args.slots.split(",")]:
        try:
            row = cadence_row(config, slots, args.steps, weights, kv_dtype, args.full_rings, how)
        except torch.OutOfMemoryError:
            row = {"slots": slots, "error": "out of memory"}
            gc.collect()
            torch.cuda.empty_cache()
        log.info("cadence %s", json.dumps(row))
        result["cadence"].append(row)
        if args.json:
            args.json.write_text(json.dumps(result, indent=1))
    if args.reference:
        if args.reference_no_compile:
            os.environ["NO_TORCH_COMPILE"] = "1"
        else:
            os.environ.pop("NO_TORCH_COMPILE", None)
        del weights
        gc.collect()
        ref_slots = args.reference_slots or args.slots
        for slots in [int(s) for s in ref_slots.split(",")]:
            try:
                try:
                    row = reference_row(slots, args.steps)
                except RuntimeError as error:
                    if "unable to find an engine" not in str(error):
                        raise
                    # seen on torch 2.11 + cuDNN: the reference Mimi's conv_transpose1d finds no
                    # cuDNN engine; its PyTorch kernels are used instead, and the row says so
                    torch.backends.cudnn.enabled = False
                    row = reference_row(slots, args.steps) | {"cudnn": False}
            except torch.OutOfMemoryError:
                row = {"slots": slots, "error": "out of memory"}
                gc.collect()
                torch.cuda.empty_cache()
            log.info("reference %s", json.dumps(row))
            result["reference"].append(row)
            if args.json:
                args.json.write_text(json.dumps(result, indent=1))
    print(
        f"{'N':>5} {'eager ms':>9} {'graph ms':>9} {'p99':>7} {'ref ms':>8} {'ratio':>6} {'GB':>6}"
    )
    ref = {r["slots"]: r for r in result["reference"] if "median_ms" in r}
    for row in result["cadence"]:
        n = row["slots"]
        g = row.get("graph", {}).get("median_ms")
        e = row.get("eager", {}).get("median_ms")
        r = ref.get(n, {}).get("median_ms")
        ratio = f"{g / r:.2f}" if g and r else "-"
        print(
            f"{n:>5} {e or '-':>9} {g or row.get('error', '-'):>9} "
            f"{row.get('graph', {}).get('p99_ms', '-'):>7} {r or '-':>8} {ratio:>6} "
            f"{row.get('peak_memory_gb', '-'):>6}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
