"""The depth transformer of one tick at a few slots: the served few-rows kernels against the
one-launch resident program (kernels/depformer_program.py), in one run.

    python bench/kernels_depformer.py --json OUT.json [--slots 1,2,4] [--rounds 2] [--warps 16,8]

Moshi 7B depformer shapes (dim 4096 in, 1024 wide, 16 heads, 6 layers, FFN 2816, 8 steps,
card 2048), bf16, random weights (N(0, 1/fan_in)). Both paths are Depformer.forward as the
engine calls it (fused; `program_rows` 0 for the kernels, 4 for the program), input
projection and noise draw included, each captured in a CUDA graph and timed over replays
(median of CUDA-event times of single replays), greedy and with the audio default sampling
(temperature 0.8, top-k 250). The two alternate `--rounds` times (machines are shared:
compare within a round). GB/s counts the weight bytes a tick reads once (the embedding
tables aside); `phase_us` is the program's time less the input projection's, per phase (201
barriers a frame); `barrier_us` a grid barrier alone (a kernel that only synchronises, one
program per multiprocessor); `weights_only_ms` the program's weight loads and barriers with
nothing else (_weights_only: the design's floor). `--warps`: the program timed at each count
of warps (the module's WARPS). Also: whether greedy tokens are equal between the two.
"""

import argparse
import json
import logging
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import triton  # type: ignore[import-not-found,import-untyped,unused-ignore]
import triton.language as tl  # type: ignore[import-not-found,import-untyped,unused-ignore]
from gpu_timing import count_kernels, machine, replay_ms, summary  # bench/, this folder

from engine.models.moshi.config import moshiko
from engine.models.moshi.depformer import Depformer
from engine.models.moshi.sampling import AUDIO_DEFAULT, Sampling
from kernels import depformer_program as program
from kernels.depformer_program import MAX_ROWS, arrive, prepare_program, wait_for, weight_tile

log = logging.getLogger("kernels_depformer")
GREEDY = Sampling(greedy=True, temperature=1.0, top_k=1)
REPLAYS = 100
PHASES = 201  # barriers a frame at 8 steps x 6 layers (kernels/depformer_program.py)
WAYS = (("greedy", GREEDY), ("sampling", AUDIO_DEFAULT))


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def _barriers_only(counter_ptr, barriers, programs: tl.constexpr):  # type: ignore[no-untyped-def,unused-ignore]
    for _ in range(barriers):
        wait_for(counter_ptr, arrive(counter_ptr, programs))


@triton.jit(do_not_specialize=["steps", "layers"])  # type: ignore[untyped-decorator,unused-ignore]
def _weights_only(  # type: ignore[no-untyped-def,unused-ignore]
    qkv_w_ptr, out_w_ptr, gate_w_ptr, down_w_ptr, head_w_ptr, counter_ptr, sink_ptr,
    steps, layers,
    programs: tl.constexpr, dep_dim: tl.constexpr, hidden: tl.constexpr, card: tl.constexpr,
    hidden_pow2: tl.constexpr, qkv_cols: tl.constexpr, model_cols: tl.constexpr,
    gate_cols: tl.constexpr, head_cols: tl.constexpr,
):  # fmt: skip
    """The program's phases with their weight loads and barriers only: each phase sums its
    weight tile (so the loads stay), nothing else."""
    pid = tl.program_id(0)
    qkv_col = pid + programs * tl.arange(0, qkv_cols)
    model_col = pid + programs * tl.arange(0, model_cols)
    gate_col = pid + programs * tl.arange(0, gate_cols)
    head_col = pid + programs * tl.arange(0, head_cols)
    features = tl.arange(0, dep_dim)
    hiddens = tl.arange(0, hidden_pow2)
    total = 0.0
    for step in range(steps):
        for layer in range(layers):
            at = layer * steps + step
            target = arrive(counter_ptr, programs)
            w = weight_tile(
                qkv_w_ptr + at * 3 * dep_dim * dep_dim, qkv_col, 3 * dep_dim, dep_dim, features
            )
            wait_for(counter_ptr, target)
            total += tl.sum(tl.sum(w.to(tl.float32), axis=1), axis=0)
            target = arrive(counter_ptr, programs)
            w = weight_tile(
                out_w_ptr + at * dep_dim * dep_dim, model_col, dep_dim, dep_dim, features
            )
            wait_for(counter_ptr, target)
            total += tl.sum(tl.sum(w.to(tl.float32), axis=1), axis=0)
            gate_at = gate_w_ptr + at * 2 * hidden * dep_dim
            target = arrive(counter_ptr, programs)
            w = weight_tile(gate_at, gate_col, hidden, dep_dim, features)
            w_up = weight_tile(gate_at + hidden * dep_dim, gate_col, hidden, dep_dim, features)
            wait_for(counter_ptr, target)
            total += tl.sum(tl.sum(w.to(tl.float32) + w_up.to(tl.float32), axis=1), axis=0)
            target = arrive(counter_ptr, programs)
            w = weight_tile(down_w_ptr + at * dep_dim * hidden, model_col, dep_dim, hidden, hiddens)
            wait_for(counter_ptr, target)
            total += tl.sum(tl.sum(w.to(tl.float32), axis=1), axis=0)
        target = arrive(counter_ptr, programs)
        w = weight_tile(head_w_ptr + step * card * dep_dim, head_col, card, dep_dim, features)
        wait_for(counter_ptr, target)
        total += tl.sum(tl.sum(w.to(tl.float32), axis=1), axis=0)
    tl.store(sink_ptr + pid, total)


def weights_only_ms(depformer: Depformer) -> float:
    """The program's weight streaming and barriers alone (_weights_only), ms a frame."""
    qkv_w, out_w, gate_w, down_w, _, _ = prepare_program(depformer)
    programs = torch.cuda.get_device_properties(0).multi_processor_count
    counter = torch.zeros(1, device="cuda", dtype=torch.int64)
    sink = torch.empty(programs, device="cuda", dtype=torch.float32)
    layers, steps, dep_dim, hidden = down_w.shape
    card = depformer.linears.shape[1]

    def columns(width: int) -> int:
        return int(triton.next_power_of_2(triton.cdiv(width, programs)))

    def launch() -> None:
        _weights_only[(programs,)](
            qkv_w, out_w, gate_w, down_w, depformer.linears, counter, sink, steps, layers,
            programs=programs, dep_dim=dep_dim, hidden=hidden, card=card,
            hidden_pow2=triton.next_power_of_2(hidden), qkv_cols=columns(3 * dep_dim),
            model_cols=columns(dep_dim), gate_cols=columns(hidden), head_cols=columns(card),
            num_warps=16,
        )  # fmt: skip

    return statistics.median(replay_ms(launch, REPLAYS))


def build(slots: int) -> Depformer:
    lm = moshiko().lm
    depformer = Depformer.for_lm(lm, slots, torch.device("cuda"), torch.bfloat16)
    generator = torch.Generator(device="cuda").manual_seed(0)
    with torch.no_grad():
        for name, param in depformer.named_parameters():
            noise = torch.randn(param.shape, generator=generator, device="cuda")
            scale = 0.1 if name.endswith("alpha") else param.shape[-1] ** -0.5
            param.copy_((1.0 if name.endswith("alpha") else 0.0) + noise * scale)
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
    programs = torch.cuda.get_device_properties(0).multi_processor_count
    counter = torch.zeros(1, device="cuda", dtype=torch.int64)
    times = replay_ms(lambda: _barriers_only[(programs,)](counter, barriers, programs), REPLAYS)
    return 1000 * statistics.median(times) / barriers


def projection_ms(depformer: Depformer, hidden: torch.Tensor) -> float:
    """The input projection alone (one GEMM, before the program in Depformer.forward)."""
    projection = depformer.depformer_in.view(-1, hidden.shape[-1])
    return statistics.median(
        replay_ms(lambda: torch.nn.functional.linear(hidden[:, 0], projection), REPLAYS)
    )


def time_path(depformer: Depformer, rows: int, slots: int, how: Sampling) -> dict[str, Any]:
    generator = torch.Generator(device="cuda").manual_seed(slots)
    hidden = torch.randn(slots, 1, 4096, generator=generator, device="cuda").bfloat16()
    text = torch.randint(0, 32001, (slots,), generator=generator, device="cuda")
    depformer.program_rows = rows
    timed: dict[str, Any] = summary(replay_ms(lambda: depformer(hidden, text, how, None), REPLAYS))
    timed["kernels"] = count_kernels(lambda: depformer(hidden, text, how, None))
    return timed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", default="1,2,4")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--warps", default=str(program.WARPS), help="the program's, each timed")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    result: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "machine": machine(),
        "shapes": "moshiko depformer: 4096 in, 1024 wide, 16 heads, 6 layers, FFN 2816, "
        "8 steps, card 2048, bf16",
        "barrier_us": round(barrier_us(2010), 3),
        "rows": [],
    }
    result["weights_only_ms"] = round(weights_only_ms(build(1)), 4)
    for slots in (int(s) for s in args.slots.split(",")):
        depformer = build(slots)
        read_bytes = weight_bytes(depformer)
        hidden = torch.randn(slots, 1, 4096, device="cuda").bfloat16()
        text = torch.randint(0, 2048, (slots,), device="cuda")
        depformer.program_rows = MAX_ROWS
        got = depformer(hidden, text, GREEDY, None)
        depformer.program_rows = 0
        want = depformer(hidden, text, GREEDY, None)
        project_ms = projection_ms(depformer, hidden)
        entry: dict[str, Any] = {
            "slots": slots,
            "weight_bytes": read_bytes,
            "greedy_tokens_equal": bool(torch.equal(got, want)),
            "projection_ms": round(project_ms, 4),
            "rounds": [],
        }
        for _ in range(args.rounds):
            timed: dict[str, Any] = {}
            for label, how in WAYS:
                kernels = time_path(depformer, 0, slots, how)
                timed[label] = {"kernels": kernels}
                for warps in (int(w) for w in args.warps.split(",")):
                    program.WARPS = warps
                    one = time_path(depformer, MAX_ROWS, slots, how)
                    one["weight_gbs"] = round(read_bytes / one["median_ms"] / 1e6, 1)
                    one["phase_us"] = round(1000 * (one["median_ms"] - project_ms) / PHASES, 2)
                    one["speedup"] = round(kernels["median_ms"] / one["median_ms"], 3)
                    timed[label][f"program_w{warps}"] = one
            entry["rounds"].append(timed)
        result["rows"].append(entry)
        log.info("%s", json.dumps(entry))
        if args.json:
            args.json.write_text(json.dumps(result, indent=1))
    print(
        f"barrier alone: {result['barrier_us']} us; weights + barriers alone "
        f"{result['weights_only_ms']} ms a frame"
    )
    print(f"{'slots':>5} {'way':>8} {'kernels ms':>10}  program ms (x, us/phase) per warps")
    for entry in result["rows"]:
        for timed in entry["rounds"]:
            for label, _ in WAYS:
                line = timed[label]
                programs = "  ".join(
                    f"{name}: {one['median_ms']:.3f} ({one['speedup']:.2f}, {one['phase_us']:.2f})"
                    for name, one in line.items()
                    if name != "kernels"
                )
                kernels_ms = line["kernels"]["median_ms"]
                print(f"{entry['slots']:>5} {label:>8} {kernels_ms:>10.3f}  {programs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
