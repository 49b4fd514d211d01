"""The arrival counts' buffers (kernels/arrivals.py): made once, grown, never shrunk.

The counting itself runs inside the kernels that merge their splits: tests/kernels/
test_ring_attention.py and test_mimi_transformer.py launch them again on the same counts.
"""

import pytest

pytest.importorskip("torch")

import torch

pytest.importorskip("triton", reason="triton is not installed (CPU torch does not bring it)")

from kernels.arrivals import _COUNTS, arrival_counts


def test_a_larger_request_grows_the_counts_and_keeps_the_smaller() -> None:
    device = torch.device("cpu")
    before = list(_COUNTS.get(device, []))
    largest = before[-1].numel() if before else 0
    small = arrival_counts(device, largest + 8)
    assert small.numel() == largest + 8
    assert small.dtype == torch.int32
    assert int(small.abs().sum()) == 0
    assert arrival_counts(device, 1) is small  # fewer rows: the same buffer
    large = arrival_counts(device, largest + 100)
    assert large.numel() == largest + 100
    assert arrival_counts(device, largest + 8) is large
    # a graph captured with a smaller buffer may still replay it: all are kept
    kept = _COUNTS[device]
    assert len(kept) == len(before) + 2
    assert kept[-2] is small
    assert kept[-1] is large
