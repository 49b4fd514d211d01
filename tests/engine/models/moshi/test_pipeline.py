"""Cadence's batched Moshi against Kyutai's reference pipeline, token for token.

Greedy, fp32, random tiny weights saved by the reference and loaded through Cadence's own
checkpoint loader. Calls join and leave slots at different ticks; each call must produce
exactly the tokens, and within 1e-4 the audio, of a fresh reference pipeline
(`mimi.encode` -> `LMGen.step` -> `mimi.decode`) fed the same audio.
"""

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("moshi")

import numpy as np
import torch
from moshi.models.compression import MimiModel
from moshi.models.lm import LMModel

from engine.models.moshi.config import tiny
from engine.models.moshi.model import MoshiModel, build_moshi
from tests.engine.models.moshi import kyutai

FRAME = 1920


def speechlike(seed: int, frames: int) -> torch.Tensor:
    """Noise shaped by a slow random envelope, float32 [frames * 1920]."""
    generator = torch.Generator().manual_seed(seed)
    noise = torch.randn(frames * FRAME, generator=generator)
    envelope = torch.rand(frames, generator=generator).repeat_interleave(FRAME)
    return (0.3 * noise * envelope).float()


def build_pair(
    tmp_path: Path, seed: int, slots: int, **lm_overrides: object
) -> tuple[LMModel, MimiModel, MoshiModel]:
    config = tiny()
    kwargs = kyutai.lm_kwargs(**lm_overrides)
    lm = kyutai.build_lm(kwargs, seed)
    mimi = kyutai.build_mimi(config.mimi, seed + 1)
    kyutai.save_checkpoint(tmp_path, lm, mimi, kwargs)
    ours = build_moshi(config, slots, "cpu", torch.float32, checkpoint_dir=tmp_path, greedy=True)
    return lm, mimi, ours


# (slot, first tick, frames): slot 2 is reused by a second call after the first leaves
CALLS = [(0, 0, 60), (1, 7, 50), (2, 3, 25), (2, 33, 24)]


def test_calls_joining_and_leaving_match_fresh_reference_runs(tmp_path: Path) -> None:
    ref_lm, ref_mimi, ours = build_pair(tmp_path, seed=11, slots=3)
    ticks = max(start + frames for _, start, frames in CALLS)
    audio = [speechlike(100 + i, frames) for i, (_, _, frames) in enumerate(CALLS)]
    got_tokens = [np.zeros((frames, 9), np.int32) for _, _, frames in CALLS]
    got_pcm = [np.zeros((frames, FRAME), np.float32) for _, _, frames in CALLS]
    for tick in range(ticks):
        pcm = np.zeros((3, FRAME), np.float32)
        reset = np.zeros(3, np.bool_)
        active = np.zeros(3, np.bool_)
        live = {}
        for index, (slot, start, frames) in enumerate(CALLS):
            if start <= tick < start + frames:
                live[slot] = (index, tick - start)
                reset[slot] = tick == start
                active[slot] = True
                pcm[slot] = audio[index][
                    (tick - start) * FRAME : (tick - start + 1) * FRAME
                ].numpy()
        out = ours.step(pcm, reset, active)
        for slot in range(3):
            if slot in live:
                index, frame = live[slot]
                got_tokens[index][frame] = out.tokens[slot]
                got_pcm[index][frame] = out.pcm[slot]
            else:
                assert (out.tokens[slot] == -1).all()
                assert not out.pcm[slot].any()
    for index in range(len(CALLS)):
        want_tokens, want_pcm = kyutai.run_reference(ref_lm, ref_mimi, audio[index])
        np.testing.assert_array_equal(got_tokens[index], want_tokens.numpy())
        assert (got_tokens[index][0] == -1).all()
        assert (got_tokens[index][1:] >= 0).all()
        # frames differ from each other, so a wrong token cannot hide in a constant stream
        assert len(np.unique(got_tokens[index][1:], axis=0)) >= len(got_tokens[index]) // 2
        error = np.linalg.norm(got_pcm[index] - want_pcm.numpy())
        assert error <= 1e-4 * np.linalg.norm(want_pcm.numpy())
