"""The depth transformer of one tick: torch Depformer.forward vs the one-launch program.

    python bench/kernels_depformer.py --json OUT.json [--slots 1,8,32,128,300]

Moshi 7B depformer shapes (dim 4096 in, 1024 wide, 16 heads, 6 layers, FFN 2816, 8 steps,
card 2048), bf16, random weights (N(0, 1/fan_in)). Per slot count, each path is captured in
a CUDA graph and timed over replays (median of CUDA-event times of single replays), greedy and
with the audio default sampling (temperature 0.8, top-k 250). The torch path is
Depformer.forward with its plain torch ops (`fused = False`, the ~1500-kernel path of
bench/engine_stages.py), not the fused path the engine serves (~466 kernels, 1.90 ms at 1 slot:
bench/results/kernels_layer.json). GB/s counts the weight bytes a tick reads
once (all steps' matrices and the used embedding rows aside). Every program tile of SWEEP is
timed at every slot count ("best": the fastest greedy one). Also: the cost of a grid barrier
alone (a kernel that only synchronises, same grid), and the fraction of greedy tokens equal
to the torch path's.

results/kernels_depformer.json came from this bench's first version (one tile config, the
module's default; greedy and sampling per slot count): its run stopped at a 75 s limit after
the 1-slot row. This version has not run yet.
"""

import argparse
import json
import logging
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import depformer_program as program  # bench/depformer_program.py: this script's folder
import torch
import triton  # type: ignore[import-not-found,import-untyped,unused-ignore]
from depformer_program import depformer_program, grid_sync, prepare_program
from gpu_timing import machine, replay_ms, summary

from engine.models.moshi.config import moshiko
from engine.models.moshi.depformer import Depformer
from engine.models.moshi.sampling import AUDIO_DEFAULT, Sampling

log = logging.getLogger("kernels_depformer")
GREEDY = Sampling(greedy=True, temperature=1.0, top_k=1)
REPLAYS = 50
# program tiles timed at every slot count: (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages). The
# first is the module's default, the one timed in results/kernels_depformer.json; the others
# put more weight bytes in flight per program (fewer, longer K blocks; 16-row A tiles when
# slots are few). Each compiles once (tens of seconds); all four compile with Triton 3.6 for
# sm_90 (triton.compile on CPU: 40-144 KiB of shared memory, one program per SM fits).
SWEEP = [
    (64, 32, 64, 4, 3),
    (16, 32, 256, 4, 3),
    (64, 32, 256, 4, 3),
    (16, 32, 128, 4, 4),
]
Config = tuple[int, int, int, int, int]


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def _barriers_only(counter_ptr, programs, barriers):  # type: ignore[no-untyped-def,unused-ignore]
    for _ in range(barriers):
        grid_sync(counter_ptr, programs)


def build(slots: int) -> Depformer:
    lm = moshiko().lm
    depformer = Depformer.for_lm(lm, slots, torch.device("cuda"), torch.bfloat16)
    generator = torch.Generator(device="cuda").manual_seed(0)
    with torch.no_grad():
        for name, param in depformer.named_parameters():
            noise = torch.randn(param.shape, generator=generator, device="cuda")
            scale = 0.1 if name.endswith("alpha") else param.shape[-1] ** -0.5
            param.copy_((1.0 if name.endswith("alpha") else 0.0) + noise * scale)
    depformer.fused = False  # the plain torch path (see the module docstring)
    return depformer.requires_grad_(False)


def weight_bytes(depformer: Depformer) -> int:
    """Bytes of the matrices a tick reads (embedding tables: one row per token, left out)."""
    tables = {"depformer_text_emb", "depformer_emb"}
    return sum(
        p.numel() * p.element_size()
        for name, p in depformer.named_parameters()
        if name not in tables
    )


def barrier_us(barriers: int) -> float:
    """us per grid barrier: a kernel that only synchronises, one program per SM."""
    programs = torch.cuda.get_device_properties(0).multi_processor_count
    counter = torch.zeros(1, device="cuda", dtype=torch.int64)
    times = replay_ms(lambda: _barriers_only[(programs,)](counter, programs, barriers), REPLAYS)
    return 1000 * statistics.median(times) / barriers


def use_config(config: Config) -> None:
    """Make `config` the program's tiles (read at each launch)."""
    (program.BLOCK_M, program.BLOCK_N, program.BLOCK_K, program.NUM_WARPS,
     program.NUM_STAGES) = config  # fmt: skip


def config_name(config: Config) -> str:
    return "m{}_n{}_k{}_w{}_s{}".format(*config)


def row(depformer: Depformer, slots: int, read_bytes: int) -> dict[str, Any]:
    generator = torch.Generator(device="cuda").manual_seed(slots)
    hidden = torch.randn(slots, 1, 4096, generator=generator, device="cuda").bfloat16()
    text = torch.randint(0, 32001, (slots,), generator=generator, device="cuda")
    result: dict[str, Any] = {"slots": slots, "torch": {}, "program": {}}
    ways = (("greedy", GREEDY), ("sampling", AUDIO_DEFAULT))

    def torch_path(how: Sampling) -> Callable[[], object]:
        return lambda: depformer(hidden, text, how, None)

    def program_path(how: Sampling) -> Callable[[], object]:
        return lambda: depformer_program(depformer, hidden, text, how, None)

    for label, how in ways:
        result["torch"][label] = summary(replay_ms(torch_path(how), REPLAYS))
    for config in SWEEP:
        use_config(config)
        timed: dict[str, Any] = {}
        for label, how in ways:
            times = replay_ms(program_path(how), REPLAYS)
            timed[label] = summary(times)
            timed[label]["weight_gbs"] = round(read_bytes / statistics.median(times) / 1e6, 1)
        got = depformer_program(depformer, hidden, text, GREEDY, None)
        want = depformer(hidden, text, GREEDY, None)
        timed["greedy_tokens_equal"] = round(float((got == want).float().mean()), 4)
        result["program"][config_name(config)] = timed
    best = min(result["program"], key=lambda name: result["program"][name]["greedy"]["median_ms"])
    result["best"] = best
    for label, _ in ways:
        torch_ms = result["torch"][label]["median_ms"]
        result[f"speedup_{label}"] = round(
            torch_ms / result["program"][best][label]["median_ms"], 2
        )
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", default="1,8,32,128,300")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    slot_counts = [int(s) for s in args.slots.split(",")]
    depformer = build(max(slot_counts))
    prepare_program(depformer)
    read_bytes = weight_bytes(depformer)
    result: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "machine": machine(),
        "shapes": "moshiko depformer: 4096 in, 1024 wide, 16 heads, 6 layers, FFN 2816, "
        "8 steps, card 2048, bf16",
        "weight_bytes": read_bytes,
        "barrier_us": {str(n): round(barrier_us(n), 3) for n in (257, 2570)},
        "rows": [],
    }
    for slots in slot_counts:
        result["rows"].append(row(depformer, slots, read_bytes))
        log.info("%s", json.dumps(result["rows"][-1]))
        if args.json:
            args.json.write_text(json.dumps(result, indent=1))
    print(f"barrier: {result['barrier_us']} us each")
    print(f"{'slots':>5} {'way':>8} {'torch ms':>9} {'program ms':>11} {'x':>6} {'GB/s':>7}  best")
    for entry in result["rows"]:
        best = entry["best"]
        for label in ("greedy", "sampling"):
            line = entry["program"][best][label]
            print(
                f"{entry['slots']:>5} {label:>8} {entry['torch'][label]['median_ms']:>9.3f} "
                f"{line['median_ms']:>11.3f} {entry[f'speedup_{label}']:>6.2f} "
                f"{line['weight_gbs']:>7.0f}  {best}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
