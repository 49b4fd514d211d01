"""How many launches a Mimi tick makes, counted on the CPU: the torch ops that launch a kernel
on CUDA and the Triton launches, per stage, with Mimi's glue in torch's ops (`torch_glue`)
and in its Triton kernels (`glue_kernels`, MimiCodec.use_glue_kernels; as served on CUDA).

    python3 bench/mimi_launches.py [--json OUT.json]

Moshi's Mimi at one slot, fused and channels-last as on CUDA (the convolutions' windows in
their kernel too), its Triton kernels in Triton's interpreter. A torch op counts when it
reaches the dispatcher outside a Triton launch and is not one that only makes a view or
allocates (VIEWS). This counts ops, not CUDA kernels: on a GPU a cuDNN convolution can be
two kernels and a GEMM with split-k more (bench/tick_kernels.py counts the captured graph's
kernels on a GPU); the difference between two settings is what the count is for.
"""

import argparse
import json
import os
import platform
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from triton.runtime.interpreter import InterpretedFunction

from engine.models.moshi.config import moshiko
from engine.models.moshi.mimi.codec import MimiCodec
from engine.models.moshi.mimi.seanet import StreamingConv1d
from engine.models.moshi.model import randomize

# ops that only make a view, read metadata or allocate: no kernel on CUDA
VIEWS = {
    "alias",
    "as_strided",
    "detach",
    "empty",
    "empty_like",
    "empty_strided",
    "expand",
    "lift_fresh",
    "new_empty",
    "permute",
    "select",
    "set_",
    "slice",
    "split",
    "squeeze",
    "t",
    "transpose",
    "unbind",
    "unsqueeze",
    "view",
    "_unsafe_view",
}


class Launches(TorchDispatchMode):
    """The kernel-launching torch ops and the Triton launches of the block, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.torch: Counter[str] = Counter()
        self.triton: Counter[str] = Counter()
        self._inside = 0  # > 0 while a Triton launch runs (the interpreter's own torch ops)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func.__name__.split(".")[0]
        if not self._inside and name not in VIEWS:
            self.torch[name] += 1
        return func(*args, **(kwargs or {}))

    def __enter__(self) -> "Launches":
        launches = self
        run = InterpretedFunction.run

        def counted(kernel: Any, *args: Any, **kwargs: Any) -> Any:
            launches.triton[kernel.fn.__name__] += 1
            launches._inside += 1
            try:
                return run(kernel, *args, **kwargs)
            finally:
                launches._inside -= 1

        self._run = run
        InterpretedFunction.run = counted  # type: ignore[method-assign]
        super().__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        InterpretedFunction.run = self._run  # type: ignore[method-assign]


def count(stages: dict[str, Callable[[], object]]) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for stage, run in stages.items():
        with Launches() as launches:
            run()
        rows[stage] = {
            "torch": sum(launches.torch.values()),
            "triton": sum(launches.triton.values()),
            "torch_ops": dict(launches.torch.most_common()),
        }
    rows["tick"] = {
        "torch": sum(row["torch"] for row in rows.values()),
        "triton": sum(row["triton"] for row in rows.values()),
    }
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    codec = MimiCodec(moshiko().mimi, 1, torch.device("cpu"), fused=True, channels_last=True)
    randomize(codec, 2)
    for module in codec.modules():
        if isinstance(module, StreamingConv1d):
            module.window_kernel = True  # as on CUDA
    pcm = torch.randn(1, 1920) * 0.1
    codes = torch.zeros(1, 8, dtype=torch.long)
    none = torch.zeros(1, dtype=torch.bool)
    stages: dict[str, Callable[[], object]] = {
        "reset_encoder": lambda: codec.reset_encoder(none),
        "encode": lambda: codec.encode(pcm),
        "reset_decoder": lambda: codec.reset_decoder(none),
        "decode": lambda: codec.decode(codes),
    }
    result: dict[str, Any] = {
        "command": " ".join(["python3", *sys.argv]),
        "machine": {"platform": platform.platform(), "torch": torch.__version__},
        "model": "moshiko Mimi, 1 slot, fused, channels-last, windows in their kernel",
    }
    with torch.no_grad():
        for stage in stages.values():  # a first step: lazy state settles
            stage()
        for name, glue in (("torch_glue", False), ("glue_kernels", True)):
            codec.use_glue_kernels(glue)
            result[name] = count(stages)
            print(
                name, {stage: row["torch"] + row["triton"] for stage, row in result[name].items()}
            )
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
