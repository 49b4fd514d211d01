"""Cadence's Mimi against Kyutai's streaming Mimi: identical codes, audio within 1e-4."""

import dataclasses

import pytest

pytest.importorskip("torch")
pytest.importorskip("moshi")

import torch

from engine.models.moshi.checkpoint import load_into, mimi_sources, mimi_unused
from engine.models.moshi.config import tiny
from engine.models.moshi.mimi.codec import MimiCodec
from tests.engine.models.moshi import kyutai

FRAME = 1920


@pytest.mark.parametrize("context", [250, 6], ids=["context250", "context6-wraps"])
def test_streaming_codes_and_audio_match_reference(context: int) -> None:
    config = dataclasses.replace(tiny().mimi, transformer_context=context)
    ref = kyutai.build_mimi(config, seed=41)
    ours = MimiCodec(config, 3, torch.device("cpu"))
    load_into(ours, ref.state_dict(), mimi_sources(ours, config), mimi_unused(config), "ref")
    frames = 24
    generator = torch.Generator().manual_seed(42)
    # noise under a per-frame envelope: stationary noise would give near-constant codes
    envelope = torch.rand(3, frames, generator=generator).repeat_interleave(FRAME, dim=1)
    pcm = 0.5 * envelope * torch.randn(3, frames * FRAME, generator=generator)
    # slot 2 starts a new stream at frame 10: its state must be as fresh as the reference's
    restart = 10
    with torch.no_grad():
        every = torch.ones(3, dtype=torch.bool)
        ours.reset_encoder(every)
        ours.reset_decoder(every)
        codes, audio = [], []
        for t in range(frames):
            if t == restart:
                only_2 = torch.tensor([False, False, True])
                ours.reset_encoder(only_2)
                ours.reset_decoder(only_2)
            frame_codes = ours.encode(pcm[:, t * FRAME : (t + 1) * FRAME])
            codes.append(frame_codes)
            audio.append(ours.decode(frame_codes))
        got_codes = torch.stack(codes, dim=2)
        got_audio = torch.cat(audio, dim=1)
        for row, start in ((0, 0), (1, 0), (2, restart)):
            with ref.streaming(1):
                want_codes = torch.cat(
                    [
                        ref.encode(pcm[row, None, None, t * FRAME : (t + 1) * FRAME])
                        for t in range(start, frames)
                    ],
                    dim=2,
                )[0]
            with ref.streaming(1):
                want_audio = torch.cat(
                    [ref.decode(want_codes[None, :, t : t + 1]) for t in range(frames - start)],
                    dim=2,
                )[0, 0]
            assert torch.equal(got_codes[row, :, start:], want_codes)
            # the frames' codes differ from each other: a wrong code cannot hide
            assert torch.unique(want_codes, dim=1).shape[1] >= (frames - start) // 2
            mine = got_audio[row, start * FRAME :]
            assert (mine - want_audio).norm() <= 1e-4 * want_audio.norm()
