"""Mimi's glue kernels (kernels/seanet_overlap.py, seanet_residual.py, mimi_rope.py) built
for sm_90 without a GPU: that they compile at all (Triton's interpreter, which their tests
run in, checks neither the compiler's rules nor libdevice), and what each costs in
registers, stack and shared memory, with the served window kernel (kernels/seanet_window.py)
beside them.

    PYTHONPATH=<the GPU's triton> python bench/kernels_glue_sass.py [--json OUT.json]

Each is specialized as a Mimi launch specializes it (16-byte aligned pointers, channel
counts divisible by 16). Also read off the PTX: whether the PDL wait is there
(griddepcontrol), the fused multiply-adds (none where the launch turns contraction off, as
the channel-wise overlap-add's does to round its product as torch does), and whether a
cosine went to the approximate instruction (cos.approx) instead of libdevice's. Counts
differ between Triton versions: build with the Triton the GPU runs (3.6 there, `pip install
--target DIR triton==3.6.0`).
"""

import argparse
import json
import platform
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import triton  # type: ignore[import-not-found,import-untyped,unused-ignore]
from kernels_ring_sass import compile_sm90, disassemble  # bench/, this folder

from kernels import mimi_rope, seanet_overlap, seanet_residual, seanet_window

F32 = "*fp32"


def build(
    kernel: Any,
    pointers: dict[str, str],
    integers: list[str],
    constants: dict[str, object],
    options: dict[str, object],
    aligned_integers: tuple[str, ...] = (),
) -> dict[str, Any]:
    """One program's sm_90 build and what it costs."""
    types: dict[str, str] = dict(pointers) | dict.fromkeys(integers, "i32")
    compiled = compile_sm90(kernel, types, constants, [*pointers, *aligned_integers], options)
    path = Path("/tmp/kernels_glue.cubin")
    path.write_bytes(bytes(compiled.asm["cubin"]))
    usage, _ = disassemble(path)
    found = re.search(r"REG:(\d+).*?STACK:(\d+)", usage)
    registers, stack = found.groups() if found else ("?", "?")
    ptx = str(compiled.asm["ptx"])
    return {
        "kernel": kernel.__name__,
        "constants": constants,
        "registers": registers,
        "stack_bytes": stack,
        "shared_bytes": int(compiled.metadata.shared),
        "pdl_wait": "griddepcontrol.wait" in ptx,
        "fma_f32": len(re.findall(r"\bfma\.rn(?:\.ftz)?\.f32\b", ptx)),
        "cos_approx": "cos.approx" in ptx,
    }


def programs() -> list[dict[str, Any]]:
    rows = []
    overlap = {name: F32 for name in ("taps_ptr", "x_ptr", "weight_ptr", "partial_ptr")}
    overlap |= {"bias_ptr": F32, "out_ptr": F32}
    for channelwise, bias, shares in ((False, True, 8), (True, False, 2)):
        rows.append(
            build(
                seanet_overlap._overlap_kernel,
                overlap,
                ["frames", "stride", "channels", "stride_x", "stride_partial"],
                {
                    "channelwise": channelwise,
                    "has_bias": bias,
                    "block_rows": seanet_overlap.BLOCK_ROWS,
                    "block_c": seanet_overlap.BLOCK_C,
                    "block_s": shares,
                    "pdl": True,
                },
                {"num_warps": 4, "enable_fp_fusion": False, "launch_pdl": True},
                ("channels",),
            )
        )
    residual = {name: F32 for name in ("x_ptr", "h_ptr", "weight_ptr", "bias_ptr", "out_ptr")}
    for block_m, activate in ((seanet_residual.MAX_BLOCK_M, False), (16, True)):
        rows.append(
            build(
                seanet_residual._residual_kernel,
                residual,
                ["frames", "hidden", "dim", "stride_x", "stride_h"],
                {
                    "compiled": True,
                    "activate_output": activate,
                    "block_m": block_m,
                    "block_n": seanet_residual.BLOCK_N,
                    "block_k": seanet_residual.BLOCK_K,
                    "pdl": True,
                },
                {"num_warps": 4, "launch_pdl": True},
                ("hidden", "dim"),
            )
        )
    rope = {"positions_ptr": "*i64", "freqs_ptr": F32, "cos_ptr": F32, "sin_ptr": F32}
    rows.append(
        build(
            mimi_rope._rope_kernel,
            rope | {"start_ptr": "*i64"},
            ["steps", "half"],
            {"compiled": True, "block_t": 2, "block_f": 32, "pdl": True},
            {"num_warps": 1, "launch_pdl": True},
        )
    )
    rows.append(
        build(
            seanet_window._window_kernel,
            {"x_ptr": F32, "previous_ptr": F32, "window_ptr": F32},
            ["frames", "history", "channels", "stride_x", "stride_previous"],
            {
                "activate": True,
                "compiled": True,
                "block_t": seanet_window.BLOCK_T,
                "block_c": seanet_window.BLOCK_C,
                "block_h": 8,
                "pdl": True,
            },
            {"num_warps": 4, "launch_pdl": True},
        )
    )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = programs()
    for row in rows:
        print(row)
    if args.json:
        result = {
            "command": " ".join(["python3", *sys.argv]),
            "machine": {"platform": platform.platform(), "python": platform.python_version()},
            "triton": triton.__version__,
            "target": "sm_90",
            "rows": rows,
        }
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
