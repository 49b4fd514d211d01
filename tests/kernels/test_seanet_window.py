"""The streaming convolution window kernel (kernels/seanet_window.py) against torch's ELU,
concatenation and tail copy, alone and inside SEANet stacks carried over several frames.

Triton's interpreter on CPU, compiled on a GPU (the same tests: the device is the test's)."""

import pytest

pytest.importorskip("torch")

import torch

pytest.importorskip("triton", reason="triton is not installed (CPU torch does not bring it)")

import kernels.seanet_window
from engine.models.moshi.config import tiny
from engine.models.moshi.mimi.seanet import (
    SeanetStack,
    StreamingConv1d,
    seanet_decoder,
    seanet_encoder,
    time_major,
)
from engine.models.moshi.model import randomize
from kernels.seanet_window import conv_window, conv_window_reference

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _time_major(slots: int, channels: int, length: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    values = torch.randn(slots, channels, length, generator=generator)
    return time_major(values).to(DEVICE)


@pytest.mark.parametrize("activate", [False, True], ids=["plain", "elu"])
@pytest.mark.parametrize(
    ("channels", "history", "frames"),
    # one channel (the encoder's first convolution), a channel count off the block, the
    # tail as long as the frame, and frames over one time block
    [(1, 6, 120), (33, 2, 2), (64, 8, 16), (70, 3, 130)],
)
@pytest.mark.parametrize("pooled", [False, True], ids=["packed", "pooled"])
def test_window_matches_torch(
    activate: bool, channels: int, history: int, frames: int, pooled: bool
) -> None:
    """`pooled`: the kept tail a view of a wider per-slot buffer, as seanet.StatePool keeps
    every convolution's tail (its rows farther apart than one tail)."""
    slots = 2
    x = _time_major(slots, channels, frames, seed=1)
    previous = _time_major(slots, channels, history, seed=2)
    if pooled:
        pool = torch.zeros(slots, (history + 5) * channels, device=DEVICE)
        view = pool[:, : history * channels].view(slots, history, channels).transpose(1, 2)
        view.copy_(previous)
        previous = view
        assert previous.stride(0) > history * channels
    kept = previous.clone()
    want = conv_window_reference(x, kept, activate)
    got = conv_window(x, previous, activate)
    assert got.shape == want.shape
    assert got.stride(1) == 1, "the window is time-major"
    # compiled: torch's bits (its ELU's expm1); interpreted: exp - 1, ~1e-7 apart
    tolerance = 0.0 if DEVICE.type == "cuda" else 1e-6
    torch.testing.assert_close(got, want, rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(previous, kept, rtol=tolerance, atol=tolerance)
    assert not torch.equal(kept, want[..., :history]), "the tail moved on"


def test_window_refuses_what_it_cannot_do() -> None:
    previous = _time_major(1, 4, 3, seed=3)
    with pytest.raises(AssertionError, match="history"):
        conv_window(_time_major(1, 4, 2, seed=4), previous, False)
    time_last = torch.randn(1, 4, 8, device=DEVICE)
    with pytest.raises(AssertionError, match="time-major"):
        conv_window(time_last, previous, False)


def _stacks(make: object, seed: int) -> tuple[SeanetStack, SeanetStack]:
    """Two copies of one channels-last stack: the window kernel on, and off (torch ops)."""
    assert callable(make)
    config = tiny().mimi
    pair = []
    for kernel in (True, False):
        stack: SeanetStack = make(config, 2, DEVICE, True)
        randomize(stack, seed)
        for module in stack.modules():
            if isinstance(module, StreamingConv1d):
                module.window_kernel = kernel
        pair.append(stack.eval())
    return pair[0], pair[1]


@pytest.mark.parametrize(
    ("make", "channels", "length", "plain_tails"),
    # the decoder's first convolution keeps 6 frames of a 4-frame input: torch's ops there
    [(seanet_encoder, 1, 2 * 1920, 0), (seanet_decoder, None, 4, 1)],
    ids=["encoder", "decoder"],
)
def test_stacks_match_over_frames(
    make: object,
    channels: int | None,
    length: int,
    plain_tails: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Three frames, so that each carries the tails the kernel kept into the next: compiled,
    the same bits as torch's ops (the ELU is torch's expm1); interpreted, close (exp - 1)."""
    fused, plain = _stacks(make, seed=7)
    width = channels if channels is not None else tiny().mimi.seanet_dim
    tails = -plain_tails + sum(
        1
        for module in fused.modules()
        if isinstance(module, StreamingConv1d) and module.previous.shape[2] > 0
    )
    launches: list[bool] = []

    def counted(x: torch.Tensor, previous: torch.Tensor, activate: bool) -> torch.Tensor:
        launches.append(activate)
        return conv_window(x, previous, activate)

    monkeypatch.setattr(kernels.seanet_window, "conv_window", counted)
    with torch.no_grad():
        for frame in range(3):
            x = _time_major(2, width, length, seed=10 + frame)
            before = len(launches)
            got = fused(x)
            assert len(launches) - before == tails, "every kept tail that fits takes the kernel"
            assert any(launches), "the ELUs in front run inside the kernel"
            want = plain(x)
            assert len(launches) - before == tails, "the plain stack takes torch's ops"
            if DEVICE.type == "cuda":
                assert torch.equal(got, want), (got - want).abs().max()
            else:
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
