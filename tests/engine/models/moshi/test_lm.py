"""The LM alone against Kyutai's `LMGen`: several shapes, dep_q 16, bf16 logits, prompts."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("moshi")

import torch
from moshi.models.lm import LMGen

from engine.models.moshi.checkpoint import lm_sources, lm_unused, load_into
from engine.models.moshi.config import from_kyutai_lm_kwargs, tiny
from engine.models.moshi.lm import MoshiLm
from engine.models.moshi.prompt import personaplex_frames
from engine.models.moshi.sampling import Sampling
from tests.engine.models.moshi import kyutai

GREEDY = Sampling(greedy=True, temperature=1.0, top_k=1)
CPU = torch.device("cpu")


def ours_from(
    ref: torch.nn.Module, kwargs: dict[str, object], slots: int, dtype: torch.dtype = torch.float32
) -> MoshiLm:
    config = from_kyutai_lm_kwargs(kwargs, tiny()).lm
    lm = MoshiLm(config, slots, CPU, dtype, GREEDY, GREEDY, None)
    load_into(lm, ref.state_dict(), lm_sources(config), lm_unused(config), "reference")
    return lm


def reference_frames(gen: LMGen, user: torch.Tensor, overwrite_user: bool) -> torch.Tensor:
    """Step `gen` (already streaming, batch B) on user: int64 [B, 8, T] -> [B, 9, T].

    With `overwrite_user` (a dep_q 16 model, whose LMGen takes no user tokens and feeds back
    its own predictions of them), the user streams of the token cache are overwritten after
    every step with the real codes, as PersonaPlex's generator provides them."""
    frames = []
    steps = user.shape[2]
    state = gen._streaming_state
    assert state is not None
    ring = state.cache.shape[2]
    for t in range(steps):
        given = user[:, :, t : t + 1] if not overwrite_user else user[:, :0, t : t + 1]
        out = gen.step(given)
        assert out is not None
        frames.append(out[:, :9, 0].clone())
        if overwrite_user:
            cache = state.cache
            position = (t + 1) % ring
            if t + 1 < steps:
                cache[:, 9, position] = user[:, 0, t + 1]
            cache[:, 10:17, position] = user[:, 1:, t]
    return torch.stack(frames, dim=2)


def our_frames(lm: MoshiLm, user: torch.Tensor) -> torch.Tensor:
    frames = []
    reset = torch.ones(user.shape[0], dtype=torch.bool)
    for t in range(user.shape[2]):
        frame, emitted = lm.step(user[:, :, t], reset)
        reset = torch.zeros_like(reset)
        frames.append(torch.where(emitted[:, None], frame, torch.full_like(frame, -2)))
    return torch.stack(frames, dim=2)


@pytest.mark.parametrize(
    "overrides",
    [
        {},  # ring of 24 frames: wraps
        {"num_heads": 8, "num_layers": 3, "context": 9, "hidden_scale": 4},
        {"dim": 96, "depformer_dim": 48, "depformer_num_heads": 4, "text_card": 40},
        {"dep_q": 16},
    ],
    ids=["tiny", "heads8-ctx9", "wider", "dep_q16"],
)
def test_greedy_tokens_match_lmgen(overrides: dict[str, object]) -> None:
    kwargs = kyutai.lm_kwargs(**overrides)
    ref = kyutai.build_lm(kwargs, seed=3)
    batch, steps = 2, 56
    user = torch.randint(0, 64, (batch, 8, steps), generator=torch.Generator().manual_seed(5))
    gen = LMGen(ref, use_sampling=False, support_out_of_sync=True)
    with torch.no_grad(), gen.streaming(batch):
        want = reference_frames(gen, user, overwrite_user=kwargs["dep_q"] == 16)
    with torch.no_grad():
        got = our_frames(ours_from(ref, kwargs, batch), user)
    assert torch.equal(got, want)
    assert len(torch.unique(want[:, 0, 1:])) > 3  # the text stream is not degenerate


def teacher_forced_text_logits(lm: MoshiLm, tokens: torch.Tensor) -> torch.Tensor:
    """Our text logits when the LM reads tokens: int64 [T, streams] step by step."""
    lm.reset(torch.ones(1, dtype=torch.bool))
    logits = []
    for t in range(tokens.shape[0]):
        lm.delays.seed(0, t, tokens[t])
        logits.append(lm.advance()[2][0].float())
    return torch.stack(logits)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_teacher_forced_text_logits_match(dtype: torch.dtype) -> None:
    kwargs = kyutai.lm_kwargs()
    ref = kyutai.build_lm(kwargs, seed=8, dtype=dtype)
    steps = 20
    generator = torch.Generator().manual_seed(9)
    tokens = torch.randint(0, 64, (steps, 17), generator=generator)
    tokens[:, 0] = torch.randint(0, 64, (steps,), generator=generator)
    initial = torch.tensor([64] + [64] * 16)
    delays = torch.tensor(kwargs["delays"])
    tokens = torch.where(torch.arange(steps)[:, None] <= delays, initial, tokens)
    with torch.no_grad():
        _, want = ref.forward_text(tokens.T[None])
        want = want[0, 0].float()
        got = teacher_forced_text_logits(ours_from(ref, kwargs, 1, dtype), tokens)
    scale = want.abs().max().item()
    error = (got - want).abs()
    # fp32: the same operations up to summation order. bf16: logits are bf16 (8-bit mantissa,
    # one unit in the last place = 2**-7 relative), intermediate sums round differently:
    # allow 4 units at the largest logit, and 1/2 unit on average
    max_tolerance, mean_tolerance = (1e-5, 1e-6) if dtype == torch.float32 else (3e-2, 4e-3)
    assert error.max().item() <= max_tolerance * scale, (error.max().item(), scale)
    assert error.mean().item() <= mean_tolerance * scale, (error.mean().item(), scale)


def test_prompt_replay_matches_stepped_reference() -> None:
    """A PersonaPlex prompt replayed as one prefill, then live steps, against the reference
    stepping through the same prompt frame by frame (its token cache forced to them)."""
    kwargs = kyutai.lm_kwargs()
    ref = kyutai.build_lm(kwargs, seed=21)
    generator = torch.Generator().manual_seed(22)
    voice = torch.randint(0, 64, (5, 8), generator=generator)
    frames = personaplex_frames(
        voice,
        [7, 9, 11],
        text_padding_id=3,
        silence_codes=(1,) * 8,
        sine_codes=(2,) * 8,
        silence_frames=2,
    )
    prompt_steps, live_steps = frames.shape[0], 12
    live = torch.randint(0, 64, (1, 8, live_steps), generator=generator)
    gen = LMGen(ref, use_sampling=False, support_out_of_sync=True)
    with torch.no_grad(), gen.streaming(1):
        state = gen._streaming_state
        assert state is not None
        cache = state.cache
        ring = cache.shape[2]
        for t in range(prompt_steps):
            gen.step(frames[t, 9:].view(1, 8, 1))
            position = (t + 1) % ring
            if t + 1 < prompt_steps:
                cache[0, :2, position] = frames[t + 1, :2]
            cache[0, 2:9, position] = frames[t, 2:9]
        want_frames = []
        for t in range(live_steps):
            out = gen.step(live[:, :, t : t + 1])
            assert out is not None
            want_frames.append(out[0, :9, 0])
        want = torch.stack(want_frames)
    lm = ours_from(ref, kwargs, 2)
    with torch.no_grad():
        lm.reset(torch.ones(2, dtype=torch.bool))
        lm.replay(1, frames)
        got = []
        for t in range(live_steps):
            user = torch.zeros(2, 8, dtype=torch.long)
            user[1] = live[0, :, t]
            frame, emitted = lm.step(user, torch.zeros(2, dtype=torch.bool))
            assert bool(emitted[1])
            got.append(frame[1])
    assert torch.equal(torch.stack(got), want)
