"""The one-launch sampler's programs (kernels/sampling.py) in sm_90 machine code, built
without a GPU: registers and stack (spills) a thread, per row width and warp count.

    PYTHONPATH=<the GPU's triton> python bench/kernels_sampling_sass.py

The rows are the tick's: the text's 32000 logits (a 32768-wide block) and an audio step's
2048, bf16, top-k with forcing, as the launcher builds them. Counts differ between Triton
versions: build with the Triton the GPU runs (3.6 there, `pip install --target DIR
triton==3.6.0`).
"""

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import triton  # type: ignore[import-not-found,import-untyped,unused-ignore]
from kernels_ring_sass import HOPPER, disassemble  # bench/, this folder
from triton.compiler import ASTSource  # type: ignore[import-not-found,import-untyped,unused-ignore]

from kernels import sampling

POINTERS = {
    "logits_ptr": "*bf16",
    "noise_ptr": "*fp32",
    "forced_ptr": "*i64",
    "forced_mask_ptr": "*i1",
    "out_ptr": "*i64",
}
INTEGERS = ["vocab", "logits_stride", "noise_stride", "forced_stride", "forced_mask_stride"]
BUILDS = ((32768, 8), (32768, 16), (32768, 32), (2048, 4))  # (block, warps); served: 16 and 4


def report(block: int, warps: int) -> str:
    constants = {"block": block, "key_bits": 16, "greedy": False, "has_forced": True, "pdl": True}
    types = POINTERS | dict.fromkeys(INTEGERS, "i32") | {"temperature": "fp32", "top_k": "i32"}
    types |= dict.fromkeys(constants, "constexpr")
    source = ASTSource(fn=sampling._sample_kernel, signature=types, constexprs=constants, attrs={})
    compiled = triton.compile(source, target=HOPPER, options={"num_warps": warps})
    path = Path("/tmp/sampling.cubin")
    path.write_bytes(bytes(compiled.asm["cubin"]))
    usage, _ = disassemble(path)
    found = re.search(r"REG:(\d+).*?STACK:(\d+)", usage)
    registers, stack = found.groups() if found else ("?", "?")
    return f"block {block:>5} warps {warps:>2}: reg {registers:>3} stack {stack:>4} bytes"


def main() -> int:
    print(f"triton {triton.__version__}, bf16, top-k with forcing, sm_90")
    for block, warps in BUILDS:
        print(report(block, warps), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
