"""Kernel tests run their Triton programs in Triton's interpreter where there is no GPU.

The interpreter is chosen when triton is first imported (`triton.language` itself is built
for one mode or the other), so the switch is set here, before any test module of this folder
imports triton; a triton imported earlier in the session without it is reported, not
silently run compiled-for-GPU on a CPU.
"""

import importlib.util
import os
import sys


def _select_interpreter() -> None:
    if importlib.util.find_spec("torch") is None:
        return
    import torch

    if torch.cuda.is_available():
        return
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(
            "triton was imported before tests/kernels could select its interpreter: "
            "run the tests with TRITON_INTERPRET=1 on a machine without CUDA"
        )
    os.environ["TRITON_INTERPRET"] = "1"


_select_interpreter()
