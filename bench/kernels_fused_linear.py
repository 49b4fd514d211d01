"""The few-rows linear (kernels/fused_linear.py) at Moshi 7B shapes against the kernels it
replaces, and the depformer stage with it, on one GPU.

    python bench/kernels_fused_linear.py --rows 1,2,4,8 --json OUT.json [--temporal]

Per GEMM of a depformer layer step and its head (`--temporal`: and of a temporal layer),
bf16, random weights: microseconds per call of each tile of SWEEP and of what the engine ran
before (cuBLAS and the per-op kernels: rms_norm / add_rms_norm in front, gated_silu behind, a
residual addmm), REPEATS calls captured in one CUDA graph, each call on another copy of the
weight (together several times the 50 MB L2, so weights come from HBM as in a tick, where each
step has its own), and the weight bytes per second against the HBM peak. These calls are
independent of each other, so they run without programmatic dependent launch (with it they
would overlap); the depformer stage below runs as served, with it.

Then the depformer stage (8 steps x 6 layers, greedy, as bench/engine_stages.py) built alone
at the same row counts (`--temporal`: and the temporal transformer's step, every ring full):
per-op kernels (`few_rows` 0), the few-rows path with the launcher's default tiles, and with
each GEMM's fastest tile of the sweep.
"""

import argparse
import json
import logging
import math
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

os.environ.setdefault("NO_TORCH_COMPILE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import triton  # type: ignore[import-not-found,import-untyped,unused-ignore]
from gpu_timing import count_kernels, machine, replay_ms, summary
from torch import Tensor
from torch.nn import functional
from triton.runtime.errors import OutOfResources  # type: ignore[import-not-found,import-untyped,unused-ignore]

import kernels.fused_linear as fused_linear_module
from engine.models.moshi.config import moshiko
from engine.models.moshi.depformer import Depformer
from engine.models.moshi.model import randomize
from engine.models.moshi.sampling import Sampling
from engine.models.moshi.transformer import TemporalTransformer
from kernels import dependent_launch
from kernels.fused_linear import (
    MAX_ROWS,
    RESIDENT_PER_SM,
    Tiles,
    add_fused_linear,
    default_tiles,
    fused_linear,
)
from kernels.gated_silu import gated_silu
from kernels.rms_norm import add_rms_norm, rms_norm

log = logging.getLogger("kernels_fused_linear")
REPEATS = 20
HBM_BYTES_PER_S = 4.8e12  # H200 HBM3e peak
COPIES_BYTES = 256 << 20  # weight copies cycled through per graph: 5x the L2
EPS = 1e-8
GREEDY = Sampling(greedy=True, temperature=1.0, top_k=1)
SWEEP = [
    Tiles(16, 256, True),
    Tiles(16, 512, True),
    Tiles(64, 128, True, stages=4),
    Tiles(1, 1024, False),
    Tiles(1, 2048, False),
    Tiles(2, 1024, False),
    Tiles(2, 1024, False, warps=8),
    Tiles(2, 2048, False, warps=8),
    Tiles(4, 1024, False),
    Tiles(4, 512, False),
    Tiles(2, 1024, False, programs_per_sm=8),
    # the weight as the tensor cores' left operand, several stages in flight (not timed yet)
    Tiles(64, 128, True, stages=4, swap=True),
    Tiles(64, 128, True, stages=6, swap=True),
    Tiles(128, 64, True, stages=5, swap=True),
    Tiles(128, 128, True, stages=3, swap=True),
    Tiles(256, 64, True, warps=8, stages=3, swap=True),
    Tiles(128, 64, True, stages=5, programs_per_sm=1, swap=True),
    # split units, so that every multiprocessor streams (the launcher fits the stages)
    Tiles(64, 128, True, stages=6, swap=True, splits=2),
    Tiles(64, 128, True, stages=4, swap=True, splits=2),
    Tiles(64, 128, True, stages=6, swap=True, splits=3),
    Tiles(64, 128, True, stages=6, swap=True, splits=4),
    Tiles(64, 64, True, stages=8, swap=True, splits=2),
    Tiles(128, 64, True, stages=5, swap=True, splits=2),
    Tiles(128, 64, True, stages=5, swap=True, splits=3),
    Tiles(128, 128, True, stages=3, swap=True, splits=2),
]
# (name, mode, n, k): mode as tests/kernels/test_fused_linear.py's MODES
DEP, DEP_HIDDEN = 1024, 2816
DIM, HIDDEN = 4096, 11264
DEPFORMER_SHAPES = [
    ("dep_qkv", "norm_pending", 3 * DEP, DEP),
    ("dep_out", "residual", DEP, DEP),
    ("dep_gate", "norm_gated", DEP_HIDDEN, DEP),
    ("dep_down", "residual", DEP, DEP_HIDDEN),
    ("dep_head", "plain", 2048, DEP),
]
TEMPORAL_SHAPES = [
    ("temporal_qkv", "norm", 3 * DIM, DIM),
    ("temporal_out", "residual", DIM, DIM),
    ("temporal_gate", "norm_gated", HIDDEN, DIM),
    ("temporal_down", "residual", DIM, HIDDEN),
]


def us_per_call(call: Callable[[int], object]) -> float:
    """Median microseconds of one call(i), i = 0..REPEATS-1 captured in one graph."""
    index = iter(range(1 << 30))
    graph_ms = statistics.median(replay_ms(lambda: call(next(index) % REPEATS), 20, REPEATS))
    return 1e3 * graph_ms / REPEATS


def shape_row(name: str, mode: str, n: int, k: int, rows: int) -> tuple[dict[str, Any], Tiles]:
    """The GEMM's timings, and its fastest tile of SWEEP."""
    cuda, bf16 = torch.device("cuda"), torch.bfloat16
    gated = mode.endswith("gated")
    weight_bytes = (2 * n if gated else n) * k * 2
    copies = max(1, min(REPEATS, math.ceil(COPIES_BYTES / weight_bytes)))
    weights = [
        torch.randn(2 * n if gated else n, k, device=cuda, dtype=bf16) * k**-0.5
        for _ in range(copies)
    ]
    x = torch.randn(rows, 1, k, device=cuda, dtype=bf16)
    pending = torch.randn_like(x)
    alpha = torch.rand(1, 1, k, device=cuda, dtype=bf16)
    residual = torch.randn(rows, 1, n, device=cuda, dtype=bf16)

    def ours(tiles: Tiles | None) -> Callable[[int], object]:
        def call(i: int) -> object:
            w = weights[i % copies]
            if mode == "norm_pending":
                return add_fused_linear(x, pending, w, alpha=alpha, eps=EPS, tiles=tiles)
            norm = mode.startswith("norm")
            return fused_linear(
                x,
                w,
                alpha=alpha if norm else None,
                eps=EPS,
                residual=residual if mode == "residual" else None,
                gated=gated,
                tiles=tiles,
            )

        return call

    def before(i: int) -> object:
        w = weights[i % copies]
        if mode == "norm_pending":
            return functional.linear(add_rms_norm(x, pending, alpha, EPS)[1], w)
        if mode == "norm":
            return functional.linear(rms_norm(x, alpha, EPS), w)
        if mode == "norm_gated":
            return gated_silu(functional.linear(rms_norm(x, alpha, EPS), w))
        if mode == "residual":
            return torch.addmm(residual.view(rows, n), x.view(rows, k), w.t())
        return functional.linear(x, w)

    row: dict[str, Any] = {"gemm": name, "mode": mode, "rows": rows, "n": n, "k": k}
    row["before_us"] = round(us_per_call(before), 2)
    row["before_kernels"] = count_kernels(lambda: before(0))
    resident = RESIDENT_PER_SM * torch.cuda.get_device_properties(0).multi_processor_count
    row["default_tiles"] = repr(default_tiles(rows, n, k, resident))
    row["default_us"] = round(us_per_call(ours(None)), 2)
    swept: dict[Tiles, float] = {}
    for tiles in SWEEP:
        if not tiles.dot and triton.next_power_of_2(rows) * tiles.block_n * tiles.block_k > 16384:
            continue  # the broadcast product would not fit in registers
        try:
            swept[tiles] = round(us_per_call(ours(tiles)), 2)
        except OutOfResources as error:  # e.g. a gated tile's stages beyond shared memory
            log.info("%s %s: %s", name, tiles, error)
    best = min(swept, key=swept.__getitem__)
    row["swept_us"] = {repr(tiles): us for tiles, us in swept.items()}
    row["best_tiles"] = repr(best)
    row["best_us"] = swept[best]
    for key in ("before", "default", "best"):
        row[f"{key}_hbm_share"] = round(
            weight_bytes / (row[f"{key}_us"] * 1e-6) / HBM_BYTES_PER_S, 3
        )
    log.info("%s", row)
    return row, best


class FewRows(Protocol):
    few_rows: int


def few_rows_variants(
    name: str, module: FewRows, stage: Callable[[], object], best: dict[tuple[int, int], Tiles]
) -> dict[str, Any]:
    """The stage with `module`'s per-op kernels (`few_rows` 0), on the few-rows path with the
    launcher's default tiles, and with each GEMM's fastest tile of the sweep."""
    default = fused_linear_module.default_tiles

    def swept_tiles(count: int, n: int, k: int) -> Tiles:
        return best.get((n, k), default(count, n, k))

    found: dict[str, Any] = {}
    variants: list[tuple[str, int, Callable[[int, int, int], Tiles]]] = [
        ("per_op", 0, default),
        ("few_rows", MAX_ROWS, default),
        ("few_rows_best", MAX_ROWS, swept_tiles),
    ]
    for variant, few_rows, tiles in variants:
        module.few_rows = few_rows
        # swaps the launcher's choice for this bench only (an experiment's knob)
        fused_linear_module.default_tiles = tiles  # type: ignore[assignment]
        found[variant] = summary(replay_ms(stage)) | {"kernels": count_kernels(stage)}
        log.info("%s %s %s", name, variant, found[variant])
    fused_linear_module.default_tiles = default
    return found


def depformer_rows(rows: int, best: dict[tuple[int, int], Tiles]) -> dict[str, Any]:
    config = moshiko().lm
    cuda = torch.device("cuda")
    depformer = Depformer.for_lm(config, rows, cuda, torch.bfloat16)
    randomize(depformer, 1)
    depformer.eval()
    hidden = torch.randn(rows, 1, config.dim, device=cuda, dtype=torch.bfloat16)
    text = torch.zeros(rows, device=cuda, dtype=torch.long)
    generator = torch.Generator(device=cuda).manual_seed(0)

    def stage() -> Tensor:
        tokens: Tensor = depformer(hidden, text, GREEDY, generator)
        return tokens

    return {"rows": rows} | few_rows_variants(f"depformer {rows} rows", depformer, stage, best)


def temporal_rows(rows: int, best: dict[tuple[int, int], Tiles]) -> dict[str, Any]:
    """The temporal transformer's step (32 layers, every ring full) at `rows` slots."""
    config = moshiko().lm
    cuda = torch.device("cuda")
    transformer = TemporalTransformer.for_lm(config, rows, cuda, torch.bfloat16)
    randomize(transformer, 2)
    transformer.eval()
    transformer.positions.fill_(2 * config.context)  # every ring full
    x = torch.randn(rows, 1, config.dim, device=cuda, dtype=torch.bfloat16)

    def stage() -> Tensor:
        out: Tensor = transformer.step(x)
        transformer.positions.sub_(1)  # the same position at every replay
        return out

    return {"rows": rows} | few_rows_variants(f"temporal {rows} rows", transformer, stage, best)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,8")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--temporal", action="store_true", help="the temporal GEMMs too")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    result: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "machine": machine(),
        "gemms": [],
        "depformer": [],
        "temporal": [],
    }
    with torch.no_grad():
        for rows in [int(r) for r in args.rows.split(",")]:
            best: dict[tuple[int, int], Tiles] = {}
            shapes = DEPFORMER_SHAPES + (TEMPORAL_SHAPES if args.temporal else [])
            # a graph's calls here are independent: with programmatic dependent launch they
            # would overlap, and the time per call would not be a call's own
            dependent_launch.ENABLED = False
            for name, mode, n, k in shapes:
                row, best[(n, k)] = shape_row(name, mode, n, k, rows)
                result["gemms"].append(row)
                if args.json:
                    args.json.write_text(json.dumps(result, indent=1))
            dependent_launch.ENABLED = True  # the stages as served
            result["depformer"].append(depformer_rows(rows, best))
            if args.temporal:
                result["temporal"].append(temporal_rows(rows, best))
                torch.cuda.empty_cache()
            torch.cuda.empty_cache()
            if args.json:
                args.json.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
