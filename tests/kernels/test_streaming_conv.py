"""The SEANet convolution kernel against torch's convolution over the same window, frame
after frame, so that the tail it keeps (in the half the phase does not name) is checked too.

Runs in Triton's interpreter on CPU and compiled on a GPU (fp32 products there: TF32 would
need a tolerance of its own; the codec test, tests/kernels/test_mimi_codec.py, runs TF32).
"""

import pytest

pytest.importorskip("torch")

import torch

pytest.importorskip("triton", reason="triton is not installed (CPU torch does not bring it)")

from kernels.streaming_conv import history_frames, streaming_conv, streaming_conv_reference

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TOLERANCE = 1e-4  # fp32 sums in another order than torch's (relative to the output's scale)


def _time_major(x: torch.Tensor) -> torch.Tensor:
    return x.permute(0, 2, 1).contiguous().permute(0, 2, 1)


@pytest.mark.parametrize(
    ("slots", "c_in", "c_out", "taps", "step", "dilation", "frames", "elu", "residual"),
    [
        (2, 1, 16, 7, 1, 1, 40, False, False),  # the encoder's first: one input channel
        (3, 8, 4, 3, 1, 2, 40, True, False),  # dilated, fewer outputs than a tile
        (3, 4, 8, 1, 1, 1, 20, True, True),  # a residual block's 1x1 with its add: no tail
        (5, 8, 16, 8, 4, 1, 8, True, False),  # strided, 2 frames out: slots share a tile
        (4, 16, 8, 7, 1, 1, 2, False, False),  # a frame shorter than the tail (history 6)
        (2, 20, 36, 4, 2, 1, 140, True, False),  # channels off the blocks, rows over a tile
    ],
)
@pytest.mark.parametrize("time_major", [False, True], ids=["time-last", "time-major"])
def test_frames_match_torch_and_keep_the_tail(
    slots: int,
    c_in: int,
    c_out: int,
    taps: int,
    step: int,
    dilation: int,
    frames: int,
    elu: bool,
    residual: bool,
    time_major: bool,
) -> None:
    generator = torch.Generator().manual_seed(slots * 100 + taps)

    def randn(*shape: int) -> torch.Tensor:
        x = torch.randn(*shape, generator=generator).to(DEVICE)
        return _time_major(x) if time_major else x

    history = history_frames(taps, step, dilation)
    weight = randn(c_out, c_in, taps) / (c_in * taps) ** 0.5
    bias = torch.randn(c_out, generator=generator).to(DEVICE)
    tail = torch.randn(slots, c_in, history, generator=generator).to(DEVICE)
    state = phase = None
    if history:
        # a pooled state, as seanet.StatePool lays it out: a column slice of [slots, size]
        pool = torch.randn(slots, 2 * history * c_in + 5, generator=generator).to(DEVICE)
        state = pool[:, 3 : 3 + 2 * history * c_in].view(slots, 2, history, c_in)
        phase = torch.ones(1, dtype=torch.int32, device=DEVICE)
        state[:, 1] = tail.transpose(1, 2)
        stale = state[:, 0].clone()
    for frame in range(3):
        x = randn(slots, c_in, frames)
        want, next_tail = streaming_conv_reference(
            x, weight, bias, tail, step=step, dilation=dilation, elu=elu
        )
        added = randn(*want.shape) if residual else None
        if added is not None:
            want = added + want
        got = streaming_conv(
            x,
            weight,
            bias,
            state,
            phase,
            step=step,
            dilation=dilation,
            elu=elu,
            residual=added,
            time_major=time_major,
        )
        assert got.shape == want.shape
        assert (got.stride(1) == 1) == (time_major and c_out > 1), got.stride()
        error = float((got - want).abs().max() / want.abs().max())
        assert error <= TOLERANCE, (frame, error)
        if state is not None and phase is not None:
            read = int(phase)
            # the ELU's last bit may differ from torch's: the tails within 1e-6
            kept = state[:, read].transpose(1, 2)
            assert float((kept - tail).abs().max()) <= 1e-6, "the read half changed"
            written = state[:, 1 - read].transpose(1, 2)
            assert float((written - next_tail).abs().max()) <= 1e-6, frame
            if frame == 0:
                assert not torch.equal(state[:, 0], stale)
            phase ^= 1
        tail = next_tail


def test_launcher_refuses_a_convolution_without_its_state() -> None:
    x = torch.zeros(1, 4, 8, device=DEVICE)
    weight = torch.zeros(4, 4, 3, device=DEVICE)
    with pytest.raises(AssertionError, match="needs its state"):
        streaming_conv(x, weight, None, None, None, step=1, dilation=1, elu=False)
    state = torch.zeros(1, 2, 2, 4, device=DEVICE)
    with pytest.raises(AssertionError, match="do not divide"):
        streaming_conv(
            x[..., :7],
            weight,
            None,
            state,
            torch.zeros(1, dtype=torch.int32),
            step=2,
            dilation=1,
            elu=False,
        )
