"""bench/gpu_timing.py's ranking of profiled kernels (the rest of it needs a GPU)."""

import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from gpu_timing import ranked


def test_ranked_sums_each_name_and_keeps_the_costliest() -> None:
    kernels = [("norm", 2.0), ("gemm", 30.0), ("norm", 2.5), ("copy", 1.0), ("gemm", 31.0)]
    assert ranked(kernels, 2) == [("gemm", 2, 61.0), ("norm", 2, 4.5)]
    assert ranked([], 3) == []
