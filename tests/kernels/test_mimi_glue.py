"""Mimi's glue kernels (MimiCodec.use_glue_kernels) against the codec's torch ops, alone and
inside stacks carried over frames: the transposed convolution's overlap-add
(kernels/seanet_overlap.py), the residual block's ELU + 1x1 convolution + skip
(kernels/seanet_residual.py) and a transformer step's RoPE tables (kernels/mimi_rope.py).

Triton's interpreter on CPU, compiled on a GPU (the same tests: the device is the test's)."""

from collections.abc import Iterator

import pytest

pytest.importorskip("torch")

import torch

pytest.importorskip("triton", reason="triton is not installed (CPU torch does not bring it)")

import kernels.seanet_overlap
import kernels.seanet_residual
from engine.models.moshi.config import tiny
from engine.models.moshi.mimi import seanet
from engine.models.moshi.mimi.codec import MimiCodec
from engine.models.moshi.mimi.seanet import (
    ResnetBlock,
    SeanetStack,
    StreamingConvTranspose1d,
    seanet_decoder,
    seanet_encoder,
    time_major,
)
from engine.models.moshi.mimi.transformer import MimiTransformer
from engine.models.moshi.model import randomize
from kernels.mimi_rope import step_rope_tables, step_rope_tables_reference
from kernels.seanet_overlap import channelwise_overlap_add, overlap_add
from kernels.seanet_residual import residual_conv, residual_conv_reference
from tests.support.precision import tf32

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _randn(*shape: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator).to(DEVICE)


def _partial(slots: int, stride: int, channels: int, pooled: bool, seed: int) -> torch.Tensor:
    """[slots, stride, channels]; `pooled`: a view of a wider per-slot buffer, as
    seanet.StatePool keeps every state (rows farther apart than one partial)."""
    values = _randn(slots, stride, channels, seed=seed)
    if not pooled:
        return values
    pool = torch.zeros(slots, (stride + 3) * channels, device=DEVICE)
    view = pool[:, : stride * channels].view(slots, stride, channels)
    view.copy_(values)
    return view


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize(
    ("stride", "frames", "channels"),
    # Mimi's strides (2 the upsample's, 5 and 6 not powers of two), one frame (the first
    # partial is also the last), a channel count off the block, rows over one program's
    [(2, 1, 16), (8, 2, 64), (6, 16, 70), (5, 30, 8), (4, 48, 33)],
)
@pytest.mark.parametrize("pooled", [False, True], ids=["packed", "pooled"])
def test_overlap_add_is_the_torch_ops(
    stride: int, frames: int, channels: int, bias: bool, pooled: bool
) -> None:
    """The same bits as the torch ops (the sums rounded in their order), output and the new
    partial both."""
    slots = 3
    taps = _randn(slots, frames, 2 * stride, channels, seed=1)
    partial = _partial(slots, stride, channels, pooled, seed=2)
    gain = _randn(channels, seed=3) if bias else None
    kept = partial.clone()
    want = seanet.overlap_add(taps, kept, gain)
    got = overlap_add(taps, partial, gain)
    assert got.shape == (slots, frames * stride, channels)
    assert torch.equal(got, want), (got - want).abs().max()
    assert torch.equal(partial, kept)
    assert torch.equal(partial, taps[:, -1, stride:]), "the partial moved on"


@pytest.mark.parametrize("frames", [1, 3])
def test_channelwise_overlap_add_is_the_product_and_the_torch_ops(frames: int) -> None:
    """The channel-wise form computes its taps, x * weight, rounded before the sums."""
    slots, stride, channels = 2, 2, 70
    x = _randn(slots, frames, channels, seed=4)
    weight = _randn(channels, 2 * stride, seed=5)
    partial = _partial(slots, stride, channels, True, seed=6)
    kept = partial.clone()
    taps = x[:, :, None, :] * weight.t()  # the codec's product
    want = seanet.overlap_add(taps, kept, None)
    got = channelwise_overlap_add(x, weight, partial, None)
    assert torch.equal(got, want), (got - want).abs().max()
    assert torch.equal(partial, kept)


def test_overlap_add_refuses_what_it_cannot_do() -> None:
    taps = _randn(1, 2, 8, 4, seed=7)
    with pytest.raises(AssertionError, match="partial must"):
        overlap_add(taps, _randn(1, 4, 4, seed=8).transpose(1, 2), None)
    with pytest.raises(AssertionError, match="taps strides"):
        overlap_add(taps.transpose(1, 2).contiguous().transpose(1, 2), _randn(1, 4, 4, seed=9),
                    None)  # fmt: skip
    with pytest.raises(AssertionError, match="twice the stride"):
        overlap_add(_randn(1, 2, 7, 4, seed=10), _randn(1, 3, 4, seed=11), None)


def _decoders(seed: int) -> tuple[SeanetStack, SeanetStack]:
    """Two copies of one channels-last decoder: the overlap kernel on, and off."""
    pair = []
    for kernel in (True, False):
        stack = seanet_decoder(tiny().mimi, 2, DEVICE, True)
        randomize(stack, seed)
        for module in stack.modules():
            if isinstance(module, StreamingConvTranspose1d):
                module.overlap_kernel = kernel
        pair.append(stack.eval())
    return pair[0], pair[1]


def test_decoder_with_the_overlap_kernel_matches_over_frames(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Three frames, so each carries the partials the kernel kept into the next; every
    transposed convolution takes the kernel, the plain decoder none."""
    fused, plain = _decoders(seed=12)
    upsamplers = sum(1 for m in fused.modules() if isinstance(m, StreamingConvTranspose1d))
    assert upsamplers > 0
    launches: list[int] = []

    def counted(
        taps: torch.Tensor, partial: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        launches.append(1)
        return overlap_add(taps, partial, bias)

    monkeypatch.setattr(kernels.seanet_overlap, "overlap_add", counted)
    width = tiny().mimi.seanet_dim
    with torch.no_grad():
        for frame in range(3):
            x = time_major(_randn(2, width, 4, seed=20 + frame))
            before = len(launches)
            got = fused(x)
            assert len(launches) - before == upsamplers
            want = plain(x)
            assert len(launches) - before == upsamplers, "the plain decoder takes torch's ops"
            assert torch.equal(got, want), (got - want).abs().max()


@pytest.fixture
def full_fp32() -> Iterator[None]:
    """torch's fp32 matmuls and cuDNN's convolutions in full fp32 (not TF32) for the test,
    so the residual kernel's fp32 products are compared with fp32 ones: on CUDA cuDNN takes
    TF32 by default, and the engine turns it on for matmuls process-wide (build_model)."""
    with tf32(False):
        yield


@pytest.mark.parametrize(
    ("frames", "hidden", "dim"),
    # Mimi's widths at one frame count each (hidden half the width), a width off the
    # blocks, frames over one program's rows, one frame
    [(1920, 32, 64), (16, 256, 512), (5, 4, 8), (100, 48, 70), (1, 32, 64)],
)
@pytest.mark.usefixtures("full_fp32")
def test_residual_conv_is_the_torch_ops(frames: int, hidden: int, dim: int) -> None:
    """fp32 products and sums in another order than torch's: within fp32 rounding."""
    slots = 2
    x = _randn(slots, frames, dim, seed=30)
    h = _randn(slots, frames, hidden, seed=31)
    weight = _randn(dim, hidden, seed=32) * hidden**-0.5
    bias = _randn(dim, seed=33)
    got = residual_conv(x, h, weight, bias)
    want = residual_conv_reference(x, h, weight, bias)
    assert got.shape == want.shape
    assert got.is_contiguous()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.usefixtures("full_fp32")
def test_residual_conv_takes_strided_slots_and_refuses_time_last() -> None:
    """A slot's rows may sit farther apart (a view of a wider buffer); a time-last input
    is refused, not misread."""
    wide = _randn(2, 8, 16, seed=34)
    x = wide[:, :5]  # slot stride 128, rows of 16 unit-stride channels
    h = _randn(2, 5, 8, seed=35)
    weight, bias = _randn(16, 8, seed=36), _randn(16, seed=37)
    want = residual_conv_reference(x, h, weight, bias)
    torch.testing.assert_close(residual_conv(x, h, weight, bias), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(AssertionError, match="time-major"):
        residual_conv(x.transpose(1, 2).contiguous().transpose(1, 2), h, weight, bias)
    with pytest.raises(AssertionError, match="weight"):
        residual_conv(x, h, _randn(8, 16, seed=38).t(), bias)


@pytest.mark.parametrize("activate", [False, True], ids=["plain", "elu-after"])
@pytest.mark.usefixtures("full_fp32")
def test_residual_conv_runs_the_elu_after_the_block(activate: bool) -> None:
    x, h = _randn(1, 40, 16, seed=50), _randn(1, 40, 8, seed=51)
    weight, bias = _randn(16, 8, seed=52), _randn(16, seed=53)
    got = residual_conv(x, h, weight, bias, activate)
    want = residual_conv_reference(x, h, weight, bias, activate)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert bool((got < 0).any())
    assert bool((got >= -1).all()) is activate, "an ELU's output stays above -1"


@pytest.mark.parametrize(
    ("make", "channels", "length", "elu_after"),
    # the decoder's blocks before a transposed convolution take the ELU after them (the
    # last block is followed by the final convolution, whose window runs its ELU)
    [(seanet_encoder, 1, 2 * 1920, False), (seanet_decoder, None, 4, True)],
    ids=["encoder", "decoder"],
)
@pytest.mark.usefixtures("full_fp32")
def test_stacks_with_the_residual_kernel_match_over_frames(
    make: object,
    channels: int | None,
    length: int,
    elu_after: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Three frames; every residual block takes the kernel, the plain stack none, and in the
    decoder every block but the last runs the ELU after it inside that launch."""
    assert callable(make)
    pair = []
    for kernel in (True, False):
        stack: SeanetStack = make(tiny().mimi, 2, DEVICE, True)
        randomize(stack, 40)
        for module in stack.modules():
            if isinstance(module, ResnetBlock):
                module.residual_kernel = kernel
        pair.append(stack.eval())
    fused, plain = pair
    blocks = sum(1 for m in fused.modules() if isinstance(m, ResnetBlock))
    assert blocks > 1
    activated = blocks - 1 if elu_after else 0
    launches: list[bool] = []

    def counted(
        x: torch.Tensor, h: torch.Tensor, w: torch.Tensor, b: torch.Tensor, activate: bool = False
    ) -> torch.Tensor:
        launches.append(activate)
        return residual_conv(x, h, w, b, activate)

    monkeypatch.setattr(kernels.seanet_residual, "residual_conv", counted)
    width = channels if channels is not None else tiny().mimi.seanet_dim
    with torch.no_grad():
        for frame in range(3):
            x = time_major(_randn(2, width, length, seed=41 + frame) * 0.1)
            before = len(launches)
            got = fused(x)
            assert len(launches) - before == blocks
            assert sum(launches[before:]) == activated
            want = plain(x)
            assert len(launches) - before == blocks, "the plain stack takes torch's ops"
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("steps", [1, 2, 3])
def test_step_rope_tables_are_the_torch_ops(steps: int) -> None:
    """Positions from a new call's 0 to an hour in (90,000 frames at 25 Hz): compiled, the
    same bits as torch's (CUDA's cosf and sinf either way); interpreted, numpy's functions
    against torch's CPU ones, within a few ulp. The positions move on by the step, and the
    ones before it come back for the layers."""
    positions = torch.tensor([0, 7, 1000, 90_000], device=DEVICE)
    before = positions.clone()
    half = torch.arange(32, device=DEVICE, dtype=torch.float32)
    freqs = torch.exp(half * (-9.21 / 32))  # 10,000 ** (-2j / 64), as Mimi's
    *got, start = step_rope_tables(positions, steps, freqs)
    assert torch.equal(start, before)
    assert torch.equal(positions, before + steps)
    *want, _ = step_rope_tables_reference(before.clone(), steps, freqs)
    for g, w in zip(got, want, strict=True):
        assert g.shape == (4, steps, 32)
        assert g.is_contiguous()
        if DEVICE.type == "cuda":
            assert torch.equal(g, w), (g - w).abs().max()
        else:
            torch.testing.assert_close(g, w, rtol=0, atol=1e-6)


def test_step_rope_tables_refuse_what_they_cannot_do() -> None:
    freqs = torch.ones(4, device=DEVICE)
    with pytest.raises(AssertionError, match="int32"):
        step_rope_tables(torch.zeros(2, device=DEVICE, dtype=torch.int32), 2, freqs)
    with pytest.raises(AssertionError):
        step_rope_tables(torch.zeros(2, 1, device=DEVICE, dtype=torch.int64), 2, freqs)


def test_use_glue_kernels_switches_every_part() -> None:
    """MimiCodec.use_glue_kernels reaches every transposed convolution, residual block and
    transformer, both ways (off by default)."""
    codec = MimiCodec(tiny().mimi, 1, DEVICE, fused=True, channels_last=True)

    def switches() -> list[bool]:
        found = []
        for module in codec.modules():
            if isinstance(module, StreamingConvTranspose1d):
                found.append(module.overlap_kernel)
            elif isinstance(module, ResnetBlock):
                found.append(module.residual_kernel)
            elif isinstance(module, MimiTransformer):
                found.append(module.rope_kernel)
        return found

    # the upsample and the decoder's, the two directions' blocks, the two transformers
    assert len(switches()) >= 2 + 2 + 2
    assert not any(switches())
    codec.use_glue_kernels(True)
    assert all(switches())
    codec.use_glue_kernels(False)
    assert not any(switches())
