"""bench/gpu_timing.py's ranking of profiled kernels and their shares of a span (the rest of
it needs a GPU)."""

import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from gpu_timing import frontier_advances, ranked


def test_ranked_sums_each_name_and_keeps_the_costliest() -> None:
    kernels = [("norm", 2.0), ("gemm", 30.0), ("norm", 2.5), ("copy", 1.0), ("gemm", 31.0)]
    assert ranked(kernels, 2) == [("gemm", 2, 61.0), ("norm", 2, 4.5)]
    assert ranked([], 3) == []


def test_frontier_advances_split_the_span_among_the_kernels() -> None:
    # b starts early and waits (PDL): only its end past a's counts; c ends inside b (no
    # advance); d starts after a gap, which it carries
    kernels = [(0.0, 10.0), (4.0, 12.0), (5.0, 11.0), (15.0, 20.0)]
    advances = frontier_advances(kernels)
    assert advances == [10.0, 2.0, 0.0, 8.0]
    assert sum(advances) == kernels[-1][1] - kernels[0][0]
    assert frontier_advances([]) == []
    # the first kernel ends last: the later ones advance nothing, the span is its duration
    assert frontier_advances([(0.0, 9.0), (1.0, 3.0), (2.0, 4.0)]) == [9.0, 0.0, 0.0]
