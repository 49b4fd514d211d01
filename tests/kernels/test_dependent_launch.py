"""Programmatic dependent launch (kernels/dependent_launch.py): which launches take it, and
that a chain of dependent kernels, each started before the one before it has finished,
computes what the same chain computes launched one after the other."""

import pytest

pytest.importorskip("torch")

import torch

pytest.importorskip("triton", reason="triton is not installed (CPU torch does not bring it)")

from kernels import dependent_launch
from kernels.fused_linear import fused_linear
from kernels.rms_norm import rms_norm

CUDA = torch.cuda.is_available()
HOPPER = CUDA and torch.cuda.get_device_capability()[0] >= 9
LINKS = 24  # kernels in the chain; each reads the one before's output

gpu = pytest.mark.gpu
needs_hopper = pytest.mark.skipif(not HOPPER, reason="PDL needs a GPU of compute capability 9+")


def test_cpu_tensors_never_launch_dependently() -> None:
    assert not dependent_launch.dependent(torch.zeros(1), "fused_linear")


@gpu
@needs_hopper
def test_switch_and_skipped_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    few, many = torch.zeros(1, 8, device="cuda"), torch.zeros(2, 8, device="cuda")
    monkeypatch.setattr(dependent_launch, "SKIPPED", frozenset({"rms_norm"}))
    monkeypatch.setattr(dependent_launch, "ALL_UP_TO", 1)
    assert dependent_launch.dependent(many, "fused_linear")
    assert not dependent_launch.dependent(many, "rms_norm")
    assert dependent_launch.dependent(few, "rms_norm")  # up to ALL_UP_TO rows: every kernel
    monkeypatch.setattr(dependent_launch, "ALL_UP_TO", 0)
    assert not dependent_launch.dependent(few, "rms_norm")
    monkeypatch.setattr(dependent_launch, "ENABLED", False)
    assert not dependent_launch.dependent(many, "fused_linear")


def _chain(x: torch.Tensor, weights: list[torch.Tensor], alpha: torch.Tensor) -> torch.Tensor:
    """norm -> linear + residual, LINKS times: every launch reads the previous one's output
    (and the residual the one before that), so a launch that read early reads stale values."""
    for weight in weights:
        x = fused_linear(rms_norm(x, alpha, 1e-6), weight, residual=x)
    return x


@gpu
@needs_hopper
def test_captured_chain_matches_plain_launches(monkeypatch: pytest.MonkeyPatch) -> None:
    generator = torch.Generator(device="cuda").manual_seed(0)
    dim = 4096

    def randn(*shape: int, scale: float) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", generator=generator) * scale

    weights = [randn(dim, dim, scale=dim**-0.5).bfloat16() for _ in range(LINKS)]
    alpha = randn(dim, scale=1.0).bfloat16()
    x = randn(1, 1, dim, scale=1.0).bfloat16()
    monkeypatch.setattr(dependent_launch, "ENABLED", False)
    want = _chain(x, weights, alpha)
    monkeypatch.setattr(dependent_launch, "ENABLED", True)
    monkeypatch.setattr(dependent_launch, "SKIPPED", frozenset())
    static = x.clone()
    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        _chain(static, weights, alpha)  # compiles the PDL variants outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = _chain(static, weights, alpha)
    for _ in range(3):
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, want)
