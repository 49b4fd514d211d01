"""`MoshiModel`: the engine's model interface over Mimi + the Moshi LM, all slots in lockstep.

Per step, for every slot (live or not; inactive rows are computed and their outputs dropped):

    pcm_in [slots, 1920] -> Mimi encode -> user codes [slots, 8]
        -> LM step (temporal, text, depformer, delays) -> frame [slots, 9]
        -> Mimi decode -> pcm [slots, 1920]

A reset row starts a call: LM and encoder state cleared (and, with a prompt, the prompt
replayed), its decoder cleared when its first frame is emitted (step 1), so every stream
matches a fresh Kyutai pipeline (`mimi.encode` -> `LMGen.step` -> `mimi.decode`). Until then
the row's tokens are -1 and its audio is silence.

Host arrays are converted at the edge of `step`; inside it nothing syncs with the host.
"""

import logging
from pathlib import Path

import numpy as np
import torch
from numpy.typing import NDArray
from torch import Tensor, nn

from engine.models.base import FrameSpec, Mask, PcmBatch, StepOutput, check_step_inputs
from engine.models.moshi.checkpoint import (
    CheckpointError,
    check_shapes,
    lm_sources,
    lm_unused,
    load_into,
    mimi_sources,
    mimi_unused,
    read_safetensors,
)
from engine.models.moshi.config import MoshiConfig
from engine.models.moshi.files import config_for, find_files
from engine.models.moshi.lm import MoshiLm
from engine.models.moshi.mimi.codec import MimiCodec
from engine.models.moshi.prompt import (
    MIMI_BINS,
    SILENCE_CODES,
    SINE_AMPLITUDE,
    SINE_CODES,
    SINE_HZ,
    personaplex_frames,
    system_tagged,
)
from engine.models.moshi.sampling import Sampling
from engine.models.moshi.tokenizer import TextTokenizer

logger = logging.getLogger(__name__)


class MoshiModel:
    def __init__(
        self,
        config: MoshiConfig,
        lm: MoshiLm,
        mimi: MimiCodec,
        slots: int,
        device: torch.device,
        tokenizer: TextTokenizer | None = None,
    ) -> None:
        self.config = config
        self.lm = lm
        self.mimi = mimi
        self.tokenizer = tokenizer
        self.device = device
        self._slots = slots
        self._frame = FrameSpec(
            sample_rate=config.mimi.sample_rate,
            samples=config.mimi.frame_samples,
            tokens=1 + config.lm.audio_codebooks,
        )
        self._prompt: Tensor | None = None  # int64 [P, streams], replayed into every new call

    @property
    def name(self) -> str:
        return "moshi"

    @property
    def frame(self) -> FrameSpec:
        return self._frame

    @property
    def slots(self) -> int:
        return self._slots

    def set_prompt(self, frames: Tensor | None) -> None:
        """Frames (see prompt.py) every call replays when it joins; None for none."""
        if frames is not None:
            streams = self.config.lm.num_streams
            if frames.dim() != 2 or frames.shape[1] != streams:
                raise ValueError(f"prompt frames must be [P, {streams}], got {tuple(frames.shape)}")
            if not 0 < frames.shape[0] <= self.config.lm.context:
                raise ValueError(f"prompt of {frames.shape[0]} frames does not fit the context")
        self._prompt = None if frames is None else frames.to(self.device, torch.long)

    def set_personaplex_prompt(
        self, voice_pcm: NDArray[np.float32] | None, role_text: str | None
    ) -> None:
        """Replay PersonaPlex's prompt into every new call: the voice (float32 samples at the
        model rate) and the role text (needs the checkpoint's tokenizer); see prompt.py."""
        text: list[int] = []
        if role_text:
            if self.tokenizer is None:
                raise ValueError("a role text needs the checkpoint's tokenizer file")
            text = self.tokenizer.encode(system_tagged(role_text))
        audio = self.config.lm.audio_codebooks
        voice = torch.zeros(0, audio, dtype=torch.long)
        if voice_pcm is not None and voice_pcm.size:
            voice = self.encode_audio(voice_pcm).cpu()
        silence, sine = SILENCE_CODES, SINE_CODES
        if self.config.mimi.bins != MIMI_BINS:
            # another codec (tiny configs): the codes of the same two signals under it
            samples = self._frame.samples
            time_s = np.arange(samples, dtype=np.float32) / self._frame.sample_rate
            tone = (SINE_AMPLITUDE * np.sin(2 * np.pi * SINE_HZ * time_s)).astype(np.float32)
            silence = tuple(self.encode_audio(np.zeros(samples, np.float32))[0].tolist())
            sine = tuple(self.encode_audio(tone)[0].tolist())
        frames = personaplex_frames(
            voice,
            text,
            text_padding_id=self.config.lm.text_padding_id,
            silence_codes=silence,
            sine_codes=sine,
        )
        self.set_prompt(frames)

    @torch.no_grad()
    def encode_audio(self, pcm: NDArray[np.float32]) -> Tensor:
        """Mimi codes of a whole recording (e.g. a voice prompt): float32 [samples] at the
        model rate -> int64 [frames, 8]. Uses slot 0's encoder state; call before serving."""
        samples = self._frame.samples
        frames = -(-pcm.shape[0] // samples)
        padded = np.zeros((frames * samples,), dtype=np.float32)
        padded[: pcm.shape[0]] = pcm
        everyone = torch.ones(self._slots, dtype=torch.bool, device=self.device)
        self.mimi.reset_encoder(everyone)
        codes = []
        batch = torch.zeros(self._slots, samples, device=self.device)
        for index in range(frames):
            batch[0] = torch.from_numpy(padded[index * samples : (index + 1) * samples])
            codes.append(self.mimi.encode(batch)[0].clone())
        self.mimi.reset_encoder(everyone)
        return torch.stack(codes)

    @property
    def generator(self) -> torch.Generator | None:
        """The device generator sampling draws from (an executor capturing a graph registers it)."""
        return self.lm.generator

    @torch.no_grad()
    def step(self, pcm_in: PcmBatch, reset: Mask, active: Mask) -> StepOutput:
        check_step_inputs(self, pcm_in, reset, active)
        self.prepare(reset)
        out_pcm, tokens = self.device_step(
            torch.from_numpy(pcm_in).to(self.device),
            torch.from_numpy(reset).to(self.device),
            torch.from_numpy(active).to(self.device),
        )
        return StepOutput(pcm=out_pcm.cpu().numpy(), tokens=tokens.cpu().numpy())

    @property
    def prepare_queues_work(self) -> bool:
        """Only a prompt to replay makes `prepare` queue device work."""
        return self._prompt is not None

    def prepare(self, reset: Mask) -> None:
        """The host-decided part of a step, run before `device_step` (and outside any graph):
        clear and replay the prompt into the rows that start a call this tick. Without work
        to do it enters no torch.no_grad, which is on the tick's critical path: entering it
        took 3.3 us back to back and 71 us at the median 6 ms after its last entry, on the
        2-core development machine (`python3 bench/tick_gap.py --piece no_grad`,
        bench/results/tick_gap_no_grad_cpu.json)."""
        if self._prompt is None or not reset.any():
            return
        with torch.no_grad():
            self.lm.reset(torch.from_numpy(reset).to(self.device))
            for slot in np.flatnonzero(reset):
                self.lm.replay(int(slot), self._prompt)

    @torch.no_grad()
    def age_contexts(self, rows: Mask) -> None:
        """Benchmarks only (AgeableModel): move the rows' temporal and Mimi transformer
        positions one whole context on, so every ring entry counts as written and attention
        reads all of it, as it does two minutes into a call."""
        # pinned and asynchronous: a graph executor's armed step may hold the stream, and a
        # pageable copy would wait for it (the ageing then takes effect from the next step)
        mask = torch.from_numpy(rows)
        if self.device.type == "cuda":
            mask = mask.pin_memory().to(self.device, non_blocking=True)
        for transformer in (
            self.lm.transformer,
            self.mimi.encoder_transformer,
            self.mimi.decoder_transformer,
        ):
            transformer.positions.add_(mask.long() * transformer.context)

    @torch.no_grad()
    def device_step(
        self, pcm: Tensor, reset_rows: Tensor, active_rows: Tensor
    ) -> tuple[Tensor, Tensor]:
        """The step on device tensors only, with fixed shapes and no host sync, so an
        executor can capture it as one CUDA graph:

            pcm float32 [slots, 1920], reset_rows / active_rows bool [slots]
            -> pcm float32 [slots, 1920], tokens int32 [slots, 9]
        """
        self.mimi.reset_encoder(reset_rows)
        # `prepare` reset the rows of a prompted model and replayed the prompt into them;
        # without a prompt the LM step starts them over
        lm_reset = reset_rows if self._prompt is None else torch.zeros_like(reset_rows)
        user_codes = self.mimi.encode(pcm)
        frame, emitted = self.lm.step(user_codes, lm_reset)
        first = self.lm.delays.offsets == self.lm.delays.max_delay + 1
        if self._prompt is not None:
            first |= reset_rows  # a replayed row starts its decoder over
        self.mimi.reset_decoder(first)
        # rows that emitted nothing decode a placeholder; their audio is dropped below
        audio_codes = frame[:, 1:].clamp(0, self.config.lm.card - 1)
        out_pcm = self.mimi.decode(audio_codes)
        live = (emitted & active_rows)[:, None]
        # scalars, not filled tensors: two launches fewer a tick
        out_pcm = torch.where(live, out_pcm, 0.0)
        tokens = torch.where(live, frame, -1)
        return out_pcm.to(torch.float32), tokens.to(torch.int32)


def randomize(module: nn.Module, seed: int) -> None:
    """Seeded random weights with sensible scales (for tests and benchmarks without weights).

    Drawn on the module's own device (at 7B, CPU draws take minutes): a seed gives the same
    weights on every CPU and on every GPU, but a GPU's differ from a CPU's.
    """
    generators: dict[torch.device, torch.Generator] = {}
    with torch.no_grad():
        for name, param in module.named_parameters():
            if name.endswith(("alpha", "norm1.weight", "norm2.weight")):
                param.fill_(1.0)
            elif name.endswith("bias"):
                param.zero_()
            elif name.endswith("scale"):
                param.fill_(0.01)
            else:
                fan_in = param.shape[-1] if param.dim() > 1 else 1
                if param.dim() == 3 and "codebooks" not in name:
                    fan_in = param.shape[1] * param.shape[2]  # convolutions
                std = 0.02 if "codebooks" in name else fan_in**-0.5
                device = param.device
                if device not in generators:
                    generators[device] = torch.Generator(device=device).manual_seed(seed)
                values = torch.randn(param.shape, generator=generators[device], device=device)
                param.copy_((values * std).to(param.dtype))


def build_moshi(
    config: MoshiConfig,
    slots: int,
    device: torch.device | str,
    dtype: torch.dtype,
    checkpoint_dir: Path | None = None,
    random_weights_seed: int | None = None,
    *,
    greedy: bool = False,
    temperature: float = 0.8,
    top_k: int = 250,
    text_temperature: float = 0.7,
    text_top_k: int = 25,
    sampling_seed: int = 0,
    kv_dtype: torch.dtype | None = None,
) -> MoshiModel:
    """A ready `MoshiModel`: weights from `checkpoint_dir` (Kyutai/NVIDIA layout), or seeded
    random weights when `random_weights_seed` is given instead. `kv_dtype`: the temporal KV
    rings' entries, the model's dtype (None) or torch.float8_e4m3fn (docs/kv-cache.md)."""
    if (checkpoint_dir is None) == (random_weights_seed is None):
        raise ValueError("give exactly one of checkpoint_dir and random_weights_seed")
    device = torch.device(device)
    files = find_files(checkpoint_dir) if checkpoint_dir is not None else None
    if files is not None:
        config = config_for(files, config)
        check_shapes(files.lm, lm_sources(config.lm))  # before allocating the configured LM
    generator = torch.Generator(device=device).manual_seed(sampling_seed)
    lm = MoshiLm(
        config.lm,
        slots,
        device,
        dtype,
        Sampling(greedy, text_temperature, text_top_k),
        Sampling(greedy, temperature, top_k),
        generator,
        kv_dtype=kv_dtype,
    )
    mimi = MimiCodec(config.mimi, slots, device)
    tokenizer = None
    if files is None:
        assert random_weights_seed is not None
        randomize(lm, random_weights_seed)
        randomize(mimi, random_weights_seed + 1)
    else:
        logger.info("loading LM weights from %s", files.lm)
        state = read_safetensors(files.lm)
        load_into(lm, state, lm_sources(config.lm), lm_unused(config.lm), str(files.lm))
        del state
        logger.info("loading Mimi weights from %s", files.mimi)
        state = read_safetensors(files.mimi)
        sources = mimi_sources(mimi, config.mimi)
        load_into(mimi, state, sources, mimi_unused(config.mimi), str(files.mimi))
        if files.tokenizer is not None:
            tokenizer = TextTokenizer(files.tokenizer)
            if tokenizer.vocab_size != config.lm.text_card:
                raise CheckpointError(
                    f"tokenizer {files.tokenizer} has {tokenizer.vocab_size} tokens, "
                    f"the LM {config.lm.text_card}"
                )
    lm.eval()
    mimi.eval()
    return MoshiModel(config, lm, mimi, slots, device, tokenizer)
