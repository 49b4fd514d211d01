"""The delay rings' two launches a step (kernels/token_delays.py) against TokenDelays' torch
ops: integer work, so the outputs and the rings themselves must agree exactly, step after
step, through resets and tokens provided from outside (as a prompt replay leaves them)."""

import pytest

pytest.importorskip("torch")

import torch

pytest.importorskip("triton", reason="triton is not installed (CPU torch does not bring it)")

from engine.models.moshi.config import MOSHI_DELAYS, tiny
from engine.models.moshi.delays import TokenDelays
from engine.models.moshi.lm import MoshiLm
from engine.models.moshi.model import randomize
from engine.models.moshi.sampling import Sampling

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
CARD = 50
STEPS = 24
# Moshi's, and one with a 2-frame delay (a ring of 4, emitted positions below the offset)
DELAYS = [MOSHI_DELAYS, (0, 2, 1, 0, 0, 1, 2)]


def _rings(delays: tuple[int, ...], slots: int, fused: bool) -> TokenDelays:
    model_streams = (len(delays) + 1) // 2
    initial = tuple([CARD + 1] + [CARD] * (len(delays) - 1))
    rings = TokenDelays(delays, model_streams, initial, slots, DEVICE)
    rings.fused = fused
    return rings


def _same_rings(got: TokenDelays, want: TokenDelays, step: int) -> None:
    for name in ("cache", "provided", "offsets"):
        assert torch.equal(getattr(got, name), getattr(want, name)), f"{name}, step {step}"


@pytest.mark.parametrize("delays", DELAYS)
@pytest.mark.parametrize("slots", [1, 5])
def test_two_launches_a_step_keep_the_rings_as_the_torch_ops_do(
    delays: tuple[int, ...], slots: int
) -> None:
    want, got = _rings(delays, slots, False), _rings(delays, slots, True)
    model_streams, streams = want.model_streams, len(delays)
    generator = torch.Generator().manual_seed(slots * len(delays))

    def draw(*shape: int) -> torch.Tensor:
        return torch.randint(0, CARD, shape, generator=generator).to(DEVICE)

    emitted = 0  # frames emitted along the way
    for step in range(STEPS):
        # the first step starts every row; later some rows start over
        share = 1.0 if step == 0 else 0.15
        reset = (torch.rand(slots, generator=generator) < share).to(DEVICE)
        if step % 5 == 3:  # model-stream tokens given from outside, as a prompt replay does
            streams_given = torch.zeros(slots, streams, dtype=torch.bool)
            streams_given[:, :model_streams] = torch.rand(slots, model_streams) < 0.5
            tokens_given = draw(slots, streams)
            for rings in (want, got):
                rings.provide(tokens_given, streams_given.to(DEVICE))
        user = draw(slots, streams - model_streams)
        begun = want.begin_step(reset, user), got.begin_step(reset, user)
        for index, (w, g) in enumerate(zip(*begun, strict=True)):
            assert g.dtype == w.dtype, (index, g.dtype, w.dtype)
            assert torch.equal(g, w), f"begin_step output {index}, step {step}"
        _same_rings(got, want, step)
        text, audio = draw(slots), draw(slots, model_streams - 1)
        ended = want.end_step(text, audio), got.end_step(text, audio)
        for index, (w, g) in enumerate(zip(*ended, strict=True)):
            assert g.dtype == w.dtype, (index, g.dtype, w.dtype)
            assert torch.equal(g, w), f"end_step output {index}, step {step}"
        _same_rings(got, want, step)
        emitted += int(ended[0][1].sum())
    assert emitted > 0, "the steps emitted frames"


def test_the_lm_steps_to_the_same_frames_with_the_rings_fused_or_not() -> None:
    """MoshiLm.step through begin_step and end_step, the kernels or the torch ops: the same
    greedy frames step for step (the rest of the LM on torch's ops in both)."""
    config = tiny().lm
    greedy = Sampling(greedy=True, temperature=1.0, top_k=1)
    frames = []
    for fused in (False, True):
        lm = MoshiLm(config, 2, DEVICE, torch.float32, greedy, greedy, None)
        randomize(lm, 3)
        lm.delays.fused = fused
        generator = torch.Generator().manual_seed(7)
        run = []
        for step in range(6):
            codes = torch.randint(0, config.card, (2, config.audio_codebooks), generator=generator)
            reset = torch.tensor([step == 0, step in (0, 4)])
            frame, emitted = lm.step(codes.to(DEVICE), reset.to(DEVICE))
            run.append((frame.cpu(), emitted.cpu()))
        frames.append(run)
    torch_run, fused_run = frames
    for step, ((frame, emitted), (fused_frame, fused_emitted)) in enumerate(
        zip(torch_run, fused_run, strict=True)
    ):
        assert torch.equal(fused_emitted, emitted), f"step {step}"
        assert torch.equal(fused_frame, frame), f"step {step}"
    assert any(bool(emitted.any()) for _, emitted in torch_run), "frames were emitted"
