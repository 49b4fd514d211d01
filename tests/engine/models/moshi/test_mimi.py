"""Cadence's Mimi against Kyutai's streaming Mimi: identical codes, audio within 1e-4."""

import dataclasses

import pytest

pytest.importorskip("torch")
pytest.importorskip("moshi")

import torch

from engine.models.moshi.checkpoint import load_into, mimi_sources, mimi_unused
from engine.models.moshi.config import tiny
from engine.models.moshi.mimi.codec import MimiCodec
from engine.models.moshi.mimi.seanet import StreamingConv1d, StreamingConvTranspose1d
from engine.models.moshi.model import randomize
from tests.engine.models.moshi import kyutai

FRAME = 1920


@pytest.mark.parametrize("channels_last", [False, True], ids=["time-last", "channels-last"])
@pytest.mark.parametrize("context", [250, 6], ids=["context250", "context6-wraps"])
def test_streaming_codes_and_audio_match_reference(context: int, channels_last: bool) -> None:
    """Both SEANet layouts (channels-last is the default on CUDA, seanet.py)."""
    config = dataclasses.replace(tiny().mimi, transformer_context=context)
    ref = kyutai.build_mimi(config, seed=41)
    ours = MimiCodec(config, 3, torch.device("cpu"), channels_last=channels_last)
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


def test_channels_last_codec_keeps_every_convolution_time_major() -> None:
    """Every convolution's input and output, and every convolution's state buffer, is stored
    [slots, T, channels] (channel stride 1), so cuDNN's channels-last kernels take them as
    they are, and the transposed convolutions' matrix products too."""
    config = tiny().mimi
    codec = MimiCodec(config, 2, torch.device("cpu"), channels_last=True)
    seen: list[str] = []

    def check(module: torch.nn.Module, inputs: tuple[torch.Tensor], output: torch.Tensor) -> None:
        for name, tensor in (("input", inputs[0]), ("output", output)):
            if tensor.shape[1] > 1 and tensor.shape[2] > 1:
                assert tensor.stride(1) == 1, (type(module).__name__, name, tensor.stride())
        seen.append(type(module).__name__)

    for module in codec.modules():
        if isinstance(module, StreamingConv1d | StreamingConvTranspose1d):
            module.register_forward_hook(check)
            state = module.previous if isinstance(module, StreamingConv1d) else module.partial
            if state.shape[1] > 1 and state.shape[2] > 1:
                assert state.stride(1) == 1, state.stride()
    with torch.no_grad():
        codes = codec.encode(torch.randn(2, FRAME))
        codec.decode(codes)
    assert "StreamingConv1d" in seen
    assert "StreamingConvTranspose1d" in seen


@pytest.mark.parametrize("channels_last", [False, True], ids=["time-last", "channels-last"])
def test_reset_clears_one_slots_pooled_convolution_states(channels_last: bool) -> None:
    """The convolution states live in one pool per direction (seanet.StatePool, the
    replicating downsample's tail too): a reset of slot 0 zeroes every one of its states,
    sets its first-frame flag again, and leaves slot 1's as they were."""
    codec = MimiCodec(tiny().mimi, 2, torch.device("cpu"), channels_last=channels_last)
    randomize(codec, 5)  # codebooks of zeros would leave the decoder's states zero
    with torch.no_grad():
        codec.decode(codec.encode(torch.randn(2, FRAME)))
        states = [
            module.previous if isinstance(module, StreamingConv1d) else module.partial
            for module in codec.modules()
            if isinstance(module, StreamingConv1d | StreamingConvTranspose1d)
        ]
        states = [state for state in states if state.numel() > 0]
        # one buffer per direction
        buffers = {state.untyped_storage().data_ptr() for state in states}
        assert len(buffers) == 2, len(buffers)
        before = [state.clone() for state in states]
        assert all(bool(state[1].any()) for state in before)
        assert not codec.downsample.first.any(), "the first frame went by"
        codec.reset_encoder(torch.tensor([True, False]))
        codec.reset_decoder(torch.tensor([True, False]))
    for state, old in zip(states, before, strict=True):
        assert not bool(state[0].any())
        assert torch.equal(state[1], old[1])
    assert codec.downsample.first.flatten().tolist() == [True, False]


def test_transposed_convolution_weights_keep_their_gemm_layout_through_a_load() -> None:
    """The transposed convolutions read their weight as [in, kernel * out] without a copy
    (seanet.StreamingConvTranspose1d): stored so, and a state-dict load keeps that layout."""
    codec = MimiCodec(tiny().mimi, 1, torch.device("cpu"))
    state = {name: torch.randn_like(tensor) for name, tensor in codec.state_dict().items()}
    codec.load_state_dict(state)
    transposed = [m for m in codec.modules() if isinstance(m, StreamingConvTranspose1d)]
    assert len(transposed) >= 2  # the upsample and the decoder's
    for module in transposed:
        weight = module.convtr.weight
        assert weight.permute(0, 2, 1).is_contiguous(), weight.stride()
        name = next(n for n, p in codec.named_parameters() if p is weight)
        assert torch.equal(weight, state[name])


def test_codeword_norms_are_kept_until_the_codebooks_change() -> None:
    """The fused encode's |c|^2 (quantizer.ResidualQuantizer) is computed once, not per step,
    and again after a load (or any write) into the codebooks."""
    codec = MimiCodec(tiny().mimi, 1, torch.device("cpu"))
    rvq = codec.quantizer.rvq_rest
    randomize(codec, 5)
    first = rvq._codeword_norms()
    assert torch.equal(first, rvq.codebooks.detach().square().sum(dim=-1))
    assert rvq._codeword_norms() is first  # kept: no recomputation
    state = {name: torch.randn_like(tensor) for name, tensor in codec.state_dict().items()}
    codec.load_state_dict(state)
    again = rvq._codeword_norms()
    assert again is not first
    assert torch.equal(again, state["quantizer.rvq_rest.codebooks"].square().sum(dim=-1))
    with torch.no_grad():
        rvq.codebooks.mul_(2.0)
    assert torch.equal(rvq._codeword_norms(), rvq.codebooks.detach().square().sum(dim=-1))
