"""Where a Moshi 7B tick goes: time and kernels per stage of the device step, on one GPU.

    python bench/engine_stages.py --slots 1,128 --json OUT.json [--stages temporal,depformer]
        [--per-op]

For each slot count it builds Cadence's Moshi (bf16, random weights, 1500-frame KV rings,
greedy) and captures each stage of `MoshiModel.device_step` as its own CUDA graph:

- `mimi_encode`: pcm [slots, 1920] -> user codes [slots, 8] (SEANet, transformer, RVQ), fp32,
  its transformer rings young: they start empty and the ~60 runs of a stage fill ~120 of
  their 250 frames (bench/mimi_gpu.py times Mimi at full rings);
- `temporal`: token embedding + 32-layer temporal transformer + out norm + text head + text
  sampling (every ring full: each slot's position is set past the context first);
- `depformer`: 8 dependent depth steps x 6 layers, with sampling;
- `mimi_decode`: codes [slots, 8] -> pcm [slots, 1920], fp32, young rings likewise.

`--per-op` also times the depformer with its per-op kernels (`few_rows` 0: no few-rows
linear, kernels/fused_linear.py) as `depformer_per_op`, the before of that kernel; and the
temporal stage with its per-op kernels (`temporal_per_op`) and, up to the kernel's MAX_ROWS
slots, on the few-rows path whatever the default threshold (`temporal_few_rows`).
`--pdl both` times every stage also with programmatic dependent launch off
(`<stage>_no_pdl`, kernels/dependent_launch.py). `--tiles` times the depformer's few-rows
path with each given fused_linear tile (`block_n:block_k:warps[:programs_per_sm]`, CUDA
cores; `served`, the launcher's default) as `depformer_tiles`, the sweep run twice in turn.
`--pdl-skip` names kernels that launch without PDL in every run
(kernels/dependent_launch.SKIPPED). `--ab` names A/B experiments, each timing every stage
twice per arm, alternating (the second round's keys end in `_again`): `skip`, the skipped
kernels skipped at every slot count (`<stage>_skipping`, dependent_launch.ALL_UP_TO 0)
against PDL everywhere (`_pdl_all`); `blas`, torch's default BLAS library choice
(`_blas_default`) against cuBLASLt preferred (`_cublaslt`); `window`, Mimi's convolution
windows in one launch (`_window`, kernels/seanet_window.py) against torch's ops
(`_no_window`); `glue`, Mimi's glue kernels (`_glue`, MimiCodec.use_glue_kernels: the
transposed convolutions' overlap-add, the residual blocks' end and the transformers' RoPE
tables, one launch each; as served) against torch's ops (`_no_glue`); `append`, the
temporal attention's RoPE + ring append inside its launch (`_append`, as served;
RingAttention.append_in_attention, kernels/rope_attention.py) against the two launches
(`_no_append`); `cudnn`, cuDNN's
convolution algorithms timed and chosen per shape at the first call (`_cudnn_benchmark`,
torch.backends.cudnn.benchmark) against its heuristics (`_cudnn_heuristics`, as served).
Each knob is set back as served after its experiment. (An arm `prefetch`, for the ring
attention kernels' L2 prefetch of commit ec42be0, went with it:
bench/results/engine_stages_prefetch_ec42be0.json.)

Reported per stage: median and p99 ms per replay (CUDA events, 50 replays after 5), and the
number of kernels one eager run of the stage launches (torch profiler). The sum of the
stages is close to, not equal to, the whole step (the whole step also does the delay
bookkeeping and the resets).
"""

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("NO_TORCH_COMPILE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from gpu_timing import count_kernels, machine, replay_ms, summary  # bench/, this folder

import kernels.fused_linear as fused_linear_module
from engine.models import ModelOptions
from engine.models.moshi.config import moshiko
from engine.models.moshi.depformer import FEW_ROWS
from engine.models.moshi.lm import MoshiLm
from engine.models.moshi.mimi.codec import MimiCodec
from engine.models.moshi.mimi.seanet import StreamingConv1d
from engine.models.moshi.model import randomize
from engine.models.moshi.sampling import Sampling, sample
from engine.models.moshi.transformer import FEW_ROWS as TEMPORAL_FEW_ROWS
from kernels import dependent_launch
from kernels.fused_linear import MAX_ROWS, Tiles

log = logging.getLogger("engine_stages")
SERVED_ALL_UP_TO = dependent_launch.ALL_UP_TO
SERVED_CUDNN_BENCHMARK = torch.backends.cudnn.benchmark


def timed(stage: Callable[[], object]) -> dict[str, Any]:
    return summary(replay_ms(stage)) | {"kernels": count_kernels(stage)}


Chooser = Callable[[int, int, int, int], Tiles]  # (rows, n, k, resident) -> a launch's tiles


def parse_tiles(spec: str) -> tuple[str, Chooser]:
    """`block_n:block_k:warps[:programs_per_sm]` -> CUDA-core Tiles for every launch;
    `served` -> the launcher's default."""
    if spec == "served":
        return spec, fused_linear_module.default_tiles
    block_n, block_k, warps, *per_sm = (int(part) for part in spec.split(":"))
    tiles = Tiles(block_n, block_k, False, warps, programs_per_sm=per_sm[0] if per_sm else 0)
    return str(tiles), lambda *_: tiles


Arms = list[tuple[str, Callable[[], None]]]


def convolutions(mimi: MimiCodec) -> list[StreamingConv1d]:
    return [module for module in mimi.modules() if isinstance(module, StreamingConv1d)]


def serve(mimi: MimiCodec, lm: MoshiLm) -> None:
    """Every experiment's knob as served."""
    dependent_launch.ALL_UP_TO = SERVED_ALL_UP_TO
    torch.backends.cuda.preferred_blas_library("default")
    torch.backends.cudnn.benchmark = SERVED_CUDNN_BENCHMARK
    for module in convolutions(mimi):
        module.window_kernel = None
    served = ModelOptions()  # the engine's choices on CUDA
    mimi.use_glue_kernels(served.mimi_glue_kernels)
    lm.transformer.append_in_attention(served.rope_in_attention)


def experiments(slots: int, mimi: MimiCodec, lm: MoshiLm, names: list[str]) -> list[Arms]:
    """The A/B experiments asked for (`--ab`), each as its two arms (key suffix, setter)."""

    def all_up_to(rows: int) -> Callable[[], None]:
        return lambda: setattr(dependent_launch, "ALL_UP_TO", rows)

    def blas(library: str) -> Callable[[], None]:
        def apply() -> None:
            torch.backends.cuda.preferred_blas_library(library)

        return apply

    def window(on: bool) -> Callable[[], None]:
        def apply() -> None:
            for module in convolutions(mimi):
                module.window_kernel = on

        return apply

    def glue(on: bool) -> Callable[[], None]:
        return lambda: mimi.use_glue_kernels(on)

    def append(on: bool) -> Callable[[], None]:
        return lambda: lm.transformer.append_in_attention(on)

    def cudnn_benchmark(on: bool) -> Callable[[], None]:
        return lambda: setattr(torch.backends.cudnn, "benchmark", on)

    known: dict[str, Arms] = {
        "skip": [("_skipping", all_up_to(0)), ("_pdl_all", all_up_to(slots))],
        "blas": [("_blas_default", blas("default")), ("_cublaslt", blas("cublaslt"))],
        "window": [("_window", window(True)), ("_no_window", window(False))],
        "glue": [("_glue", glue(True)), ("_no_glue", glue(False))],
        "append": [("_append", append(True)), ("_no_append", append(False))],
        "cudnn": [
            ("_cudnn_benchmark", cudnn_benchmark(True)),
            ("_cudnn_heuristics", cudnn_benchmark(False)),
        ],
    }
    return [known[name] for name in names]


def stages(
    slots: int,
    names: list[str],
    per_op: bool,
    pdl: str,
    tiles_swept: list[tuple[str, Chooser]],
    ab: list[str],
) -> dict[str, Any]:
    config = moshiko()
    device = torch.device("cuda")
    greedy = Sampling(greedy=True, temperature=1.0, top_k=1)
    generator = torch.Generator(device=device).manual_seed(0)
    lm = MoshiLm(config.lm, slots, device, torch.bfloat16, greedy, greedy, generator)
    mimi = MimiCodec(config.mimi, slots, device)
    randomize(lm, 1)
    randomize(mimi, 2)
    lm.eval()
    mimi.eval()
    lm.transformer.positions.fill_(2 * config.lm.context)  # every ring full
    pcm = torch.randn(slots, config.mimi.frame_samples, device=device) * 0.1
    codes = torch.zeros(slots, config.lm.audio_codebooks, device=device, dtype=torch.long)
    tokens = torch.zeros(slots, 1, lm.delays.delays.shape[0], device=device, dtype=torch.long)
    hidden = torch.zeros(slots, 1, config.lm.dim, device=device, dtype=torch.bfloat16)
    text = torch.zeros(slots, device=device, dtype=torch.long)

    def temporal() -> None:
        out = lm.out_norm(lm.transformer.step(lm.embed(tokens)))
        hidden.copy_(out)
        text.copy_(sample(lm.text_linear(out)[:, 0].float(), greedy, generator))

    plan: dict[str, Callable[[], object]] = {
        "mimi_encode": lambda: mimi.encode(pcm),
        "temporal": temporal,
        "depformer": lambda: lm.depformer(hidden, text, greedy, generator),
        "mimi_decode": lambda: mimi.decode(codes),
    }
    plan = {name: plan[name] for name in names}
    row: dict[str, Any] = {"slots": slots, "pdl_skipped": sorted(dependent_launch.SKIPPED)}
    modes = {"on": [True], "off": [False], "both": [True, False]}[pdl]
    with torch.no_grad():
        for enabled in modes:
            dependent_launch.ENABLED = enabled
            suffix = "" if enabled else "_no_pdl"
            for name, stage in plan.items():
                row[name + suffix] = timed(stage)
                log.info("%d slots %s %s", slots, name + suffix, row[name + suffix])
            # with PDL on only: off, the skip arms would be one setting twice
            for arms in experiments(slots, mimi, lm, ab) if enabled else []:
                for round_, (arm, apply) in enumerate(arms * 2):
                    apply()
                    key = suffix + arm + ("_again" if round_ >= 2 else "")
                    for name, stage in plan.items():
                        row[name + key] = timed(stage)
                        log.info("%d slots %s %s", slots, name + key, row[name + key])
                serve(mimi, lm)
            if per_op and "depformer" in plan:
                lm.depformer.few_rows = 0
                row["depformer_per_op" + suffix] = timed(plan["depformer"])
                lm.depformer.few_rows = FEW_ROWS
            if per_op and "temporal" in plan:
                for name, few_rows in (("temporal_per_op", 0), ("temporal_few_rows", MAX_ROWS)):
                    if few_rows == 0 or slots <= few_rows:
                        lm.transformer.few_rows = few_rows
                        row[name + suffix] = timed(plan["temporal"])
                        log.info("%d slots %s %s", slots, name + suffix, row[name + suffix])
                lm.transformer.few_rows = TEMPORAL_FEW_ROWS
        dependent_launch.ENABLED = True
        if tiles_swept and "depformer" in plan and slots <= lm.depformer.few_rows:
            default = fused_linear_module.default_tiles
            row["depformer_tiles"] = {}
            for _ in range(2):  # twice, alternating: the machine is shared and noisy
                for name, choose in tiles_swept:
                    # swaps the launcher's choice for this bench only (an experiment's knob)
                    fused_linear_module.default_tiles = choose
                    key = name if name not in row["depformer_tiles"] else name + " again"
                    row["depformer_tiles"][key] = timed(plan["depformer"])
                    log.info("%d slots depformer %s %s", slots, key, row["depformer_tiles"][key])
                    fused_linear_module.default_tiles = default
    row["sum_median_ms"] = round(sum(row[name]["median_ms"] for name in plan), 3)
    row["sum_kernels"] = sum(row[name]["kernels"] for name in plan)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", default="1,128")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--stages", default="mimi_encode,temporal,depformer,mimi_decode")
    parser.add_argument("--per-op", action="store_true")
    parser.add_argument("--pdl", choices=["on", "off", "both"], default="on")
    parser.add_argument("--pdl-skip", help="kernels launched without PDL (default: the module's)")
    parser.add_argument(
        "--tiles",
        default="",
        help="block_n:block_k:warps[:programs_per_sm] or served, ...",
    )
    parser.add_argument(
        "--ab", default="", help="A/B experiments: skip,blas,window,glue,append,cudnn"
    )
    args = parser.parse_args()
    tiles = [parse_tiles(spec) for spec in args.tiles.split(",") if spec]
    if args.pdl_skip is not None:
        dependent_launch.SKIPPED = frozenset(name for name in args.pdl_skip.split(",") if name)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.backends.cuda.matmul.allow_tf32 = True  # the engine's setting (build_model)
    result: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "machine": machine(),
        "model": "moshiko 7B shapes, random weights, bf16, context 1500 frames, rings full",
        "rows": [],
    }
    ab = [name for name in args.ab.split(",") if name]
    for slots in [int(s) for s in args.slots.split(",")]:
        row = stages(slots, args.stages.split(","), args.per_op, args.pdl, tiles, ab)
        result["rows"].append(row)
        torch.cuda.empty_cache()
        if args.json:
            args.json.write_text(json.dumps(result, indent=1))
    print(json.dumps(result["rows"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
