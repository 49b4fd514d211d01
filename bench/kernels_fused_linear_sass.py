"""The few-rows linear's programs (kernels/fused_linear.py) in sm_90 machine code, built
without a GPU: what each tile of bench/kernels_fused_linear.py's SWEEP costs in registers,
spills and shared memory, and whether it reaches the tensor cores' wgmma (HGMMA) and
asynchronous copies (LDGSTS, cp.async), in every prologue and epilogue.

    PYTHONPATH=<the GPU's triton> python bench/kernels_fused_linear_sass.py [--rows 1]

Run it before spending device time on a sweep: a tile whose shared memory exceeds what one
program may have on an H100/H200 (227 KB) fails at launch, one that spills to the stack is
slow, and a jit helper that Triton's interpreter accepts can fail to compile (the interpreter
does not check that a helper's returns have one shape). The programs are specialized as a 7B
launch specializes them: 16-byte aligned pointers, strides and sizes divisible by 16; without
that Triton does not pipeline the weight loads at all. Counts differ between Triton versions:
build with the Triton the GPU runs (3.6 there, `pip install --target DIR triton==3.6.0`).
"""

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import triton  # type: ignore[import-not-found,import-untyped,unused-ignore]
from kernels_fused_linear import SWEEP  # bench/, this folder
from kernels_ring_sass import HOPPER, disassemble  # bench/, this folder
from triton.compiler import ASTSource  # type: ignore[import-not-found,import-untyped,unused-ignore]

from kernels import fused_linear
from kernels.fused_linear import Tiles

SHARED_LIMIT = 232448  # bytes of shared memory one program may have on sm_90
POINTERS = ["x_ptr", "pending_ptr", "alpha_ptr", "weight_ptr", "residual_ptr", "total_ptr"]
INTEGERS = ["rows", "n", "k", "stride_x", "stride_pending", "stride_weight", "stride_residual"]
# tests/kernels/test_fused_linear.py's MODES: (norm, pending, residual, gated, gelu)
MODES = {
    "norm": (True, False, False, False, False),
    "norm_pending": (True, True, False, False, False),
    "residual": (False, False, True, False, False),
    "norm_gated": (True, False, False, True, False),
    "gelu": (False, False, False, False, True),  # Mimi's linear1 (fp32 there, bf16 here)
}


def build(tiles: Tiles, rows: int, mode: tuple[bool, bool, bool, bool, bool]) -> tuple[bytes, int]:
    """The cubin of one program, bf16, and the shared memory it asks for at launch."""
    norm, pending, residual, gated, gelu = mode
    block_m = triton.next_power_of_2(rows)
    if tiles.dot:
        block_m = max(16, block_m)
    constants: dict[str, object] = {
        "block_m": block_m,
        "block_n": tiles.block_n,
        "block_k": tiles.block_k,
        "norm": norm,
        "has_pending": pending,
        "has_residual": residual,
        "gated": gated,
        "gelu": gelu,
        "widen": False,
        "pdl": True,
    }
    pointers = dict.fromkeys([*POINTERS, "out_ptr"], "*bf16")
    if tiles.swap:
        pointers |= {"partial_ptr": "*fp32", "arrived_ptr": "*i32"}
        constants |= {"norm_k": fused_linear.NORM_K, "splits": tiles.splits}
    else:
        constants["dot"] = tiles.dot
    types = pointers | dict.fromkeys(INTEGERS, "i32")
    types |= {"eps": "fp32"} | dict.fromkeys(constants, "constexpr")
    names = list(types)
    aligned = [*pointers, *INTEGERS[1:]]  # the row count is not specialized
    attrs = {(names.index(name),): [["tt.divisibility", 16]] for name in aligned}
    kernel = (
        fused_linear._swapped_linear_kernel if tiles.swap else fused_linear._fused_linear_kernel
    )
    source = ASTSource(fn=kernel, signature=types, constexprs=constants, attrs=attrs)
    stages = tiles.stages
    if tiles.swap:  # as the launcher fits them (bf16: 2 bytes)
        stages = fused_linear.fitted_stages(tiles, block_m, gated, pending, norm, 2)
    options = {"num_warps": tiles.warps, "num_stages": stages}
    compiled = triton.compile(source, target=HOPPER, options=options)
    return bytes(compiled.asm["cubin"]), int(compiled.metadata.shared)


def report(cubin: bytes, shared: int) -> str:
    path = Path("/tmp/fused_linear.cubin")
    path.write_bytes(cubin)
    usage, sass = disassemble(path)
    found = re.search(r"REG:(\d+).*?STACK:(\d+)", usage)
    registers, stack = found.groups() if found else ("?", "?")
    hgmma = len(re.findall(r"\bHGMMA\b", sass))
    copies = len(re.findall(r"\bLDGSTS\b|\bUTMALDG\b", sass))
    too_much = "  TOO MUCH SHARED MEMORY: fails at launch" if shared > SHARED_LIMIT else ""
    return (
        f"reg {registers:>3} stack {stack:>4} shared {shared // 1024:>3} KB"
        f" hgmma {hgmma:>3} async copies {copies:>3}{too_much}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1)
    args = parser.parse_args()
    print(f"triton {triton.__version__}, {args.rows} row(s), bf16, sm_90")
    for tiles in SWEEP:
        for name, mode in MODES.items():
            try:
                cubin, shared = build(tiles, args.rows, mode)
            except Exception as error:  # a compile error is the finding here
                print(f"{tiles!r} {name}: does not compile: {str(error).splitlines()[-1]}")
                continue
            print(f"{tiles!r} {name}: {report(cubin, shared)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
