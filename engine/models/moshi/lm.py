"""The Moshi multistream LM for all slots: embeddings -> temporal transformer -> text head ->
depth transformer, with the token delays, one frame per step.

    step(user_codes int64 [slots, 8], reset bool [slots])
        -> frame int64 [slots, 9] (text + model audio codes), emitted bool [slots]

Parameter names follow Kyutai's checkpoint where the layout allows (`emb` is their
`emb.{k}.weight` stacked); `checkpoint.py` maps the rest.
"""

import torch
from torch import Tensor, nn
from torch.nn import functional

from engine.models.moshi.attention import RmsNorm, fused_on
from engine.models.moshi.config import LmConfig
from engine.models.moshi.delays import TokenDelays
from engine.models.moshi.depformer import Depformer
from engine.models.moshi.sampling import Sampling, sample
from engine.models.moshi.transformer import RMS_EPS, TemporalTransformer


def embed_streams(tokens: Tensor, audio: Tensor, text: Tensor) -> Tensor:
    """tokens: int64 [..., 1 + audio streams] (text first) -> [..., dim]: the audio streams'
    embeddings summed in order, then the text's, as the reference does (the order matters
    for bit-exact sums)."""
    x = functional.embedding(tokens[..., 1], audio[0])
    for k in range(1, audio.shape[0]):
        x = x + functional.embedding(tokens[..., 1 + k], audio[k])
    return x + functional.embedding(tokens[..., 0], text)


class MoshiLm(nn.Module):
    def __init__(
        self,
        config: LmConfig,
        slots: int,
        device: torch.device,
        dtype: torch.dtype,
        text_sampling: Sampling,
        audio_sampling: Sampling,
        generator: torch.Generator | None,
        kv_dtype: torch.dtype | None = None,
    ) -> None:
        """`kv_dtype`: the temporal KV rings' entries (None: the model's dtype; or fp8 e4m3,
        see attention.py)."""
        super().__init__()
        self.config = config
        self.text_sampling = text_sampling
        self.audio_sampling = audio_sampling
        self.generator = generator
        audio = config.audio_codebooks
        self.emb = nn.Parameter(
            torch.zeros(2 * audio, config.card + 1, config.dim, device=device, dtype=dtype)
        )
        self.text_emb = nn.Parameter(
            torch.zeros(config.text_card + 1, config.dim, device=device, dtype=dtype)
        )
        self.transformer = TemporalTransformer.for_lm(config, slots, device, dtype, kv_dtype)
        self.out_norm = RmsNorm(config.dim, RMS_EPS, device, dtype)
        self.text_linear = nn.Linear(
            config.dim, config.text_card, bias=False, device=device, dtype=dtype
        )
        self.depformer = Depformer.for_lm(config, slots, device, dtype)
        initial = (config.text_card,) + (config.card,) * (2 * audio)
        self.delays = TokenDelays(config.delays, 1 + audio, initial, slots, device)
        # None: the embedding kernel on CUDA only (see fused_on). Read at every step: set it
        # before a graph is captured
        self.fused: bool | None = None

    def embed(self, tokens: Tensor) -> Tensor:
        """tokens: int64 [B, T, streams] -> [B, T, dim] (embed_streams); on CUDA in one
        launch of kernels/embed_sum.py, bit for bit the same."""
        if fused_on(tokens, self.fused):
            # imported here: triton is absent from CPU-only installs, which never take this path
            from kernels.embed_sum import embed_sum

            return embed_sum(tokens, self.emb, self.text_emb)
        return embed_streams(tokens, self.emb, self.text_emb)

    def reset(self, mask: Tensor) -> None:
        # `step` resets the same two on its own
        self.transformer.reset(mask)
        self.delays.reset(mask)

    def step(self, user_codes: Tensor, reset: Tensor) -> tuple[Tensor, Tensor]:
        """See the module docstring; `reset` rows start a new call before this step."""
        # `reset`'s two halves: the transformer's here, the delay rings' inside begin_step
        # (one launch with the rest of their work on CUDA)
        self.transformer.reset(reset)
        tokens, forced, forced_mask = self.delays.begin_step(reset, user_codes)
        frame, emitted, _ = self._advance(tokens, forced, forced_mask)
        return frame, emitted

    def advance(self) -> tuple[Tensor, Tensor, Tensor]:
        """One LM step on what the delay rings hold; returns the emitted frame, whether it
        exists, and the text logits ([slots, text_card], the model's dtype) of this step."""
        return self._advance(self.delays.inputs(), *self.delays.targets())

    def _advance(
        self, tokens: Tensor, forced: Tensor, forced_mask: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """advance() on the step's inputs (int64 [slots, streams]) and its provided tokens
        (int64 and bool [slots, model streams])."""
        hidden = self.out_norm(self.transformer.step(self.embed(tokens[:, None])))
        text_logits = self.text_linear(hidden)[:, 0]
        text = sample(
            text_logits,
            self.text_sampling,
            self.generator,
            forced[:, 0],
            forced_mask[:, 0],
            fused=self.fused,
        )
        audio = self.depformer(
            hidden, text, self.audio_sampling, self.generator, forced[:, 1:], forced_mask[:, 1:]
        )
        frame, emitted = self.delays.end_step(text, audio)
        return frame, emitted, text_logits

    def replay(self, slot: int, frames: Tensor) -> None:
        """Teacher-force a freshly reset slot through frames: int64 [P, streams] (see
        prompt.py) in one prefill; the slot's next `step` is the first live one.

        The P prefilled steps read the frames with their delays. The last one's outputs are
        half given: its text and semantic tokens are sampled (nothing in the prompt follows),
        its delayed codebooks are the last frame's.
        """
        steps = frames.shape[0]
        if self.delays.max_delay != 1:
            raise ValueError("prompt replay supports delays of 0 and 1 frames only")
        delays = self.delays.delays
        frames = frames.to(delays.device)
        time = torch.arange(steps, device=delays.device)[:, None]  # [P, 1]
        source = (time - delays[None, :]).clamp(min=0)  # frame index per step and stream
        tokens = frames.gather(0, source)
        tokens = torch.where(time <= delays[None, :], self.delays.initial[None, :], tokens)
        hidden = self.out_norm(self.transformer.prefill(self.embed(tokens[None]), slot))
        last = hidden[:, -1:]
        text_logits = self.text_linear(last)[:, 0]
        text = sample(text_logits, self.text_sampling, self.generator, fused=self.fused)
        model_streams = self.delays.model_streams
        delayed = (delays[1:model_streams] > 0)[None, :]
        given = frames[-1:, 1:model_streams]
        audio = self.depformer(last, text, self.audio_sampling, self.generator, given, delayed)
        # the next step reads the sampled text and semantic tokens, and the delayed
        # codebooks (model and user) of the last prompt frame
        read_next = frames[-1].clone()
        read_next[:model_streams] = torch.cat([text, audio[0]])
        self.delays.seed(slot, steps, read_next)
