"""When a launch sends its reads towards L2 first (kernels/l2_prefetch.py)."""

import pytest

pytest.importorskip("torch")

import torch

pytest.importorskip("triton", reason="triton is not installed (CPU torch does not bring it)")

from kernels import l2_prefetch


def test_only_cuda_tensors_prefetch_and_only_while_enabled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert not l2_prefetch.prefetching(torch.zeros(1))
    if torch.cuda.is_available():
        on_gpu = torch.zeros(1, device="cuda")
        major, _ = torch.cuda.get_device_capability()
        assert l2_prefetch.prefetching(on_gpu) == (major >= 9)
        monkeypatch.setattr(l2_prefetch, "ENABLED", False)
        assert not l2_prefetch.prefetching(on_gpu)
