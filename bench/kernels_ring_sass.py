"""The ring attention pass-1 programs' main loop in sm_90 machine code, built without a GPU.

    PYTHONPATH=<the GPU's triton> python bench/kernels_ring_sass.py [--fp8 | --rope]
        [--block 128] [--warps 4] [--stages 2] [--head-dim 128] [--splits 16]

Compiles kernels/ring_attention.py's pass 1 for an H100/H200 (Triton's own ptxas and
cuobjdump, as a 7B launch specializes it: 16-byte aligned pointers and strides) and prints
its registers, spills, shared memory and the instructions of its largest loop by opcode, for
one split (pass 1 writes the output) or `--splits` (the row's last split merges the partials;
the 7B launch at 1 slot: 16 bf16, 12 fp8). An
issue-bound loop shows here before it is timed: the fp8 pass 1 that repeated q over 16 rows
issued 800 instructions per 64-entry tile (Triton 3.6), _ring_split_fp8_kernel 528 per 128
entries at its default program. Counts differ between Triton versions (3.9 laid out a 3-d
value tile as meant where 3.6 did not): build with the Triton the GPU runs.
"""

import argparse
import collections
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton's default, stated

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import kernels.ring_attention as ring
import kernels.rope_attention as rope_attention

HOPPER = GPUTarget("cuda", 90, 32)
POINTERS = ["q_ptr", "k_ptr", "v_ptr", "last_ptr", "out_ptr", "max_ptr", "sum_ptr", "acc_ptr"]
POINTERS += ["arrived_ptr"]
INTEGERS = ["stride_q_slot", "stride_q_head", "heads", "capacity", "context", "split_frames"]
INTEGERS += ["splits"]
INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
BRANCH = re.compile(r"BRA\s+0x([0-9a-f]+)")


def signature(fp8: bool) -> dict[str, str]:
    """The pass-1 kernel's arguments and their types at 7B shapes (bf16 q)."""
    ring_type = "*fp8e4nv" if fp8 else "*bf16"
    types = {"q_ptr": "*bf16", "k_ptr": ring_type, "v_ptr": ring_type}
    if fp8:
        types |= {"k_scale_ptr": "*bf16", "v_scale_ptr": "*bf16"}
    types |= {"last_ptr": "*i64", "out_ptr": "*bf16"}
    types |= {"max_ptr": "*fp32", "sum_ptr": "*fp32", "acc_ptr": "*fp32", "arrived_ptr": "*i32"}
    types |= dict.fromkeys(INTEGERS, "i32")
    types["qk_scale_log2"] = "fp32"
    return types


def rope_signature() -> dict[str, str]:
    """kernels/rope_attention.py's pass 1 (RoPE + append inside): its arguments at 7B."""
    types = {"qkv_ptr": "*bf16", "freqs_ptr": "*fp32", "k_ptr": "*bf16", "v_ptr": "*bf16"}
    types |= {"start_ptr": "*i64", "out_ptr": "*bf16"}
    types |= {"max_ptr": "*fp32", "sum_ptr": "*fp32", "acc_ptr": "*fp32", "arrived_ptr": "*i32"}
    types |= dict.fromkeys(["stride_batch", "stride_part", "stride_head"], "i32")
    types |= dict.fromkeys(INTEGERS[2:], "i32")
    types["qk_scale_log2"] = "fp32"
    return types


def build(
    fp8: bool, block_n: int, warps: int, stages: int, head_dim: int, splits: int, rope: bool
) -> bytes:
    """The cubin of one pass-1 program (`rope`: kernels/rope_attention.py's)."""
    constants: dict[str, object] = {"head_dim": head_dim, "block_n": block_n}
    if fp8:
        constants["groups"] = min(block_n, warps * 32 * 16 // head_dim)
    constants["splits_pow2"] = triton.next_power_of_2(splits)
    constants["direct"] = splits == 1
    constants["empty"] = ring.EMPTY_MAX
    if not fp8:
        constants["precision"] = None
    if rope:
        constants["compiled"] = True
    aligned = [*POINTERS, "k_scale_ptr", "v_scale_ptr", "stride_q_slot", "stride_q_head"]
    aligned += ["qkv_ptr", "freqs_ptr", "start_ptr", "stride_batch", "stride_part", "stride_head"]
    kernel = ring._ring_split_fp8_kernel if fp8 else ring._ring_split_kernel
    if rope:
        kernel = rope_attention._rope_split_kernel
    types = rope_signature() if rope else signature(fp8)
    options = {"num_warps": warps, "num_stages": stages}
    return bytes(compile_sm90(kernel, types, constants, aligned, options).asm["cubin"])


def compile_sm90(
    kernel: Any,
    types: dict[str, str],
    constants: dict[str, object],
    aligned: list[str],
    options: dict[str, object],
) -> Any:
    """`kernel` built for sm_90 without a GPU: its arguments' `types` (the constants added as
    constexpr), those named in `aligned` specialized as a launch with 16-byte aligned
    pointers and strides divisible by 16 specializes them."""
    types = types | dict.fromkeys(constants, "constexpr")
    names = list(types)
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in aligned if n in names}
    source = ASTSource(fn=kernel, signature=types, constexprs=constants, attrs=attrs)
    return triton.compile(source, target=HOPPER, options=options)


def tool(name: str) -> str:
    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name)


def disassemble(cubin: Path) -> tuple[str, str]:
    """(resource usage, SASS) of a cubin, by Triton's own cuobjdump."""
    usage, sass = (
        subprocess.run(
            [tool("cuobjdump"), flag, str(cubin)], capture_output=True, text=True, check=True
        ).stdout
        for flag in ("-res-usage", "-sass")
    )
    return usage, sass


def largest_loop(sass: str) -> list[str]:
    """The instructions between the target of the longest backward branch and the branch."""
    code = [(int(m.group(1), 16), m.group(2)) for m in INSTRUCTION.finditer(sass)]
    best: list[str] = []
    for address, text in code:
        branch = BRANCH.search(text)
        if branch and int(branch.group(1), 16) < address:
            body = [t for a, t in code if int(branch.group(1), 16) <= a <= address]
            best = max(best, body, key=len)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fp8", action="store_true")
    parser.add_argument("--block", type=int, default=None)
    parser.add_argument("--warps", type=int, default=None)
    parser.add_argument("--stages", type=int, default=None)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--splits", type=int, default=1, help="splits per (slot, head) row")
    parser.add_argument(
        "--rope", action="store_true", help="kernels/rope_attention.py's pass 1 (bf16 rings)"
    )
    args = parser.parse_args()
    if args.rope and args.fp8:
        parser.error("--rope is for rings in the model's dtype, not fp8")
    block = args.block or (ring.FP8_BLOCK_N if args.fp8 else ring.BLOCK_N)
    warps = args.warps or (ring.FP8_NUM_WARPS if args.fp8 else ring.NUM_WARPS)
    stages = args.stages or (ring.FP8_NUM_STAGES if args.fp8 else ring.NUM_STAGES)
    cubin = Path("/tmp/ring_pass1.cubin")
    cubin.write_bytes(build(args.fp8, block, warps, stages, args.head_dim, args.splits, args.rope))
    usage, sass = disassemble(cubin)
    loop = largest_loop(sass)
    opcodes = collections.Counter(
        re.sub(r"^@!?U?P\w+\s+", "", text).split()[0].split(".")[0] for text in loop
    )
    name = "fp8" if args.fp8 else "bf16 + RoPE and append" if args.rope else "bf16"
    shape = f"{block} x {warps} warps x {stages} stages, {args.splits} splits"
    print(f"triton {triton.__version__}, {name} pass 1: {shape}")
    print(" ".join(line.strip() for line in usage.splitlines() if "REG" in line))
    print(f"{len(loop)} instructions in the loop, per tile of {block} entries:")
    print(", ".join(f"{op} {count}" for op, count in opcodes.most_common()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
