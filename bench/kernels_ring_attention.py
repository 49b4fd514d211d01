"""Ring decode attention on one GPU: the Triton kernel against the torch path, then the step.

    python bench/kernels_ring_attention.py --json OUT.json [--slots 1,8,32,128]
        [--step-slots 1,128] [--steps 40]

1. Ceiling: a device-to-device copy of 4 GiB, bytes read + written over its median time.
2. Attention at 7B shapes (32 heads x 128, a 1500-frame ring, bf16, every entry valid, as a
   call past two minutes has): per slot count, one layer checked against the fp32 reference,
   then L layers run back to back as the step runs them (the torch path builds its mask once),
   each version captured in a CUDA graph and timed over replays; L is chosen so the rings span
   ~12 GB, far past the 60 MB L2. GB/s counts the K and V bytes of valid entries, once each.
   Also: the kernel on fresh rings (51 valid frames), and a sweep of tile shapes.
3. The whole step (graph executor, Mimi + LM + depformer, random weights) with rings full of
   random K/V and every call past the ring's length, torch path vs kernel; and at the largest
   slot count, bf16 text logits of one temporal step through both paths.

A few hundred MB of partials aside, the kernel reads only the rings; the torch path also reads
the mask and writes scores, so its bytes are counted the same way for comparison.
"""

import argparse
import functools
import gc
import json
import logging
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch
from engine_gpu import SAMPLES, build, percentiles
from torch.nn import functional

from engine.executors.graph import GraphExecutor
from engine.models.moshi.attention import ring_mask
from engine.models.moshi.config import moshiko
from kernels.ring_attention import ring_attention, ring_attention_reference

log = logging.getLogger("kernels_ring_attention")
HEADS, HEAD_DIM, CAPACITY = 32, 128, 1500
RING_BYTES_TARGET = 12e9  # K + V of all timed layers
REPLAYS = 30
SWEEP = [(32, 4), (64, 4), (64, 8), (128, 8)]  # (block_n, num_warps)


def graph_ms(fn: Callable[[], object], replays: int = REPLAYS) -> float:
    """Median ms of one replay of fn captured as a CUDA graph (warmed up outside it)."""
    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(replays):
        begin = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        begin.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end))
    del graph
    return statistics.median(times)


def copy_bandwidth_gbs() -> float:
    src = torch.randn(2**30, device="cuda")  # 4 GiB of fp32
    dst = torch.empty_like(src)
    ms = graph_ms(lambda: dst.copy_(src))
    return 2 * src.numel() * src.element_size() / (ms * 1e-3) / 1e9


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want.double()).norm() / want.double().norm())


def attention_row(slots: int, copy_gbs: float) -> dict[str, Any]:
    layer_bytes = 2 * slots * HEADS * CAPACITY * HEAD_DIM * 2
    layers = int(max(2, min(32, RING_BYTES_TARGET // layer_bytes)))
    shape = (layers, slots, HEADS, CAPACITY, HEAD_DIM)
    keys = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    values = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    q = torch.randn(layers, slots, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    full = torch.arange(slots, device="cuda") + 7 * CAPACITY + 3  # every entry valid, wrapped
    fresh = torch.full((slots,), 50, device="cuda")
    out = torch.empty_like(q)

    def kernel(last: torch.Tensor, block_n: int = 64, num_warps: int = 4) -> None:
        for layer in range(layers):
            out[layer] = ring_attention(
                q[layer], keys[layer], values[layer], last, CAPACITY, None, block_n, num_warps
            )

    def torch_path() -> None:
        mask = ring_mask(full, 1, CAPACITY, CAPACITY)
        for layer in range(layers):
            attended = functional.scaled_dot_product_attention(
                q[layer][:, :, None], keys[layer], values[layer], attn_mask=mask
            )
            out[layer] = attended[:, :, 0]

    want = ring_attention_reference(q[0], keys[0], values[0], full, CAPACITY)
    kernel(full)
    kernel_error = relative_error(out[0], want)
    torch_path()
    torch_error = relative_error(out[0], want)
    kernel(fresh)
    fresh_error = relative_error(
        out[0], ring_attention_reference(q[0], keys[0], values[0], fresh, CAPACITY)
    )
    del want
    kernel_ms = graph_ms(lambda: kernel(full)) / layers
    torch_ms = graph_ms(torch_path) / layers
    fresh_ms = graph_ms(lambda: kernel(fresh)) / layers
    sweep = {
        f"block{block_n}_warps{warps}": round(
            graph_ms(functools.partial(kernel, full, block_n, warps)) / layers * 1e3, 1
        )
        for block_n, warps in SWEEP
    }
    gbs = layer_bytes / (kernel_ms * 1e-3) / 1e9
    return {
        "slots": slots,
        "layers_timed": layers,
        "bytes_per_layer": layer_bytes,
        "kernel_us_per_layer": round(kernel_ms * 1e3, 1),
        "kernel_gbs": round(gbs, 1),
        "kernel_fraction_of_copy": round(gbs / copy_gbs, 3),
        "torch_us_per_layer": round(torch_ms * 1e3, 1),
        "torch_gbs": round(layer_bytes / (torch_ms * 1e-3) / 1e9, 1),
        "speedup": round(torch_ms / kernel_ms, 2),
        "fresh_kernel_us_per_layer": round(fresh_ms * 1e3, 1),
        "sweep_us_per_layer": sweep,
        "kernel_rel_error": kernel_error,
        "torch_rel_error": torch_error,
        "fresh_kernel_rel_error": fresh_error,
        "per_step_ms_32_layers": {
            "kernel": round(32 * kernel_ms, 3),
            "torch": round(32 * torch_ms, 3),
        },
    }


def fill_rings(model: Any) -> None:
    """Random K/V in every ring entry, every call past the ring's length (all valid)."""
    transformer = model.lm.transformer
    for layer in range(transformer.keys.shape[0]):
        transformer.keys[layer].normal_()
        transformer.values[layer].normal_()
    slots = transformer.positions.shape[0]
    transformer.positions.copy_(torch.arange(slots, device="cuda") + 3 * CAPACITY)


def timed_steps(graph: GraphExecutor, slots: int, steps: int) -> list[float]:
    rng = np.random.default_rng(0)
    pcm = (rng.standard_normal((slots, SAMPLES)) * 0.1).astype(np.float32)
    keep = np.zeros(slots, np.bool_)
    active = np.ones(slots, np.bool_)
    for _ in range(3):
        graph.run(pcm, keep, active)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        graph.run(pcm, keep, active)  # ends with the host sync of the outputs
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def logits_check(model: Any) -> dict[str, Any]:
    """One temporal step of every slot through both paths from the same state (bf16)."""
    lm, transformer = model.lm, model.lm.transformer
    slots = transformer.positions.shape[0]
    generator = torch.Generator(device="cuda").manual_seed(0)
    streams = 1 + 2 * lm.config.audio_codebooks
    tokens = torch.randint(0, 2048, (slots, 1, streams), generator=generator, device="cuda")
    saved = transformer.positions.clone()
    logits = {}
    with torch.no_grad():
        for flag in (False, True):
            transformer.decode_kernel = flag
            transformer.positions.copy_(saved)
            hidden = lm.out_norm(transformer.step(lm.embed(tokens)))
            logits[flag] = lm.text_linear(hidden)[:, 0].float()
    transformer.decode_kernel = None
    want, got = logits[False], logits[True]
    return {
        "slots": slots,
        "logits_rel_error": relative_error(got, want),
        "max_abs_diff_over_max_abs": float((got - want).abs().max() / want.abs().max()),
        "argmax_agreement": float((got.argmax(-1) == want.argmax(-1)).float().mean()),
    }


def step_row(slots: int, steps: int, check_logits: bool) -> dict[str, Any]:
    model = build(moshiko(), slots, {})
    row: dict[str, Any] = {"slots": slots}
    for name, flag in (("torch", False), ("kernel", True)):
        model.lm.transformer.decode_kernel = flag
        graph = GraphExecutor(model)  # the flag is read while capturing
        fill_rings(model)
        row[name] = percentiles(timed_steps(graph, slots, steps))
        del graph
        gc.collect()
        torch.cuda.empty_cache()
    row["kernel_over_torch"] = round(row["kernel"]["median_ms"] / row["torch"]["median_ms"], 3)
    if check_logits:
        fill_rings(model)
        row["logits"] = logits_check(model)
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", default="1,8,32,128")
    parser.add_argument("--step-slots", default="1,128")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.backends.cuda.matmul.allow_tf32 = True
    result: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "machine": {
            "gpu": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
        },
        "shapes": f"{HEADS} heads x {HEAD_DIM}, ring {CAPACITY} frames, bf16",
    }

    def save() -> None:
        if args.json:
            args.json.write_text(json.dumps(result, indent=1))

    copy_gbs = copy_bandwidth_gbs()
    gc.collect()
    torch.cuda.empty_cache()
    result["copy_gbs"] = round(copy_gbs, 1)
    result["attention"] = []
    for slots in [int(s) for s in args.slots.split(",")]:
        result["attention"].append(attention_row(slots, copy_gbs))
        gc.collect()  # the rings of this slot count
        torch.cuda.empty_cache()
        log.info("attention %s", json.dumps(result["attention"][-1]))
        save()
    result["step"] = []
    step_slots = [int(s) for s in args.step_slots.split(",")]
    for slots in step_slots:
        result["step"].append(step_row(slots, args.steps, slots == max(step_slots)))
        log.info("step %s", json.dumps(result["step"][-1]))
        save()
    print(f"copy {copy_gbs:.0f} GB/s")
    print(
        f"{'slots':>5} {'kernel us':>10} {'GB/s':>7} {'of copy':>8} {'torch us':>9} {'x':>6} "
        f"{'fresh us':>9} {'rel err':>8}"
    )
    for row in result["attention"]:
        print(
            f"{row['slots']:>5} {row['kernel_us_per_layer']:>10} {row['kernel_gbs']:>7} "
            f"{row['kernel_fraction_of_copy']:>8} {row['torch_us_per_layer']:>9} "
            f"{row['speedup']:>6} {row['fresh_kernel_us_per_layer']:>9} "
            f"{row['kernel_rel_error']:>8.1e}"
        )
    print(f"{'slots':>5} {'torch step ms':>14} {'p99':>7} {'kernel step ms':>15} {'p99':>7}")
    for row in result["step"]:
        print(
            f"{row['slots']:>5} {row['torch']['median_ms']:>14} {row['torch']['p99_ms']:>7} "
            f"{row['kernel']['median_ms']:>15} {row['kernel']['p99_ms']:>7}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
