"""Token delay bookkeeping: which token of which stream the LM reads and emits at each step.

Stream k (0 text, 1..8 model audio, 9..16 user audio) runs `delays[k]` frames late
(Moshi: [0, 0,1,1,1,1,1,1,1, 0,1,1,1,1,1,1,1]). Per slot a small ring of positions holds
tokens by the step that reads them, as in Kyutai's `LMGen`:

    cache:    int64 [slots, streams, ring]   ring = max_delay + 2 positions
    provided: bool  [slots, streams, ring]   token given from outside (prompt replay), not sampled
    offsets:  int64 [slots]                  steps since reset

At step t: the user's codes for this frame are written at t + delay; the LM reads position t
(initial tokens while t <= delay); what it samples is written at t + 1 (unless provided); the
emitted frame is position t + 1 - max_delay + delay of each model stream, so nothing is
emitted at steps t < max_delay (the first output appears at step 1).

A step's work is `begin_step` (resets, the user's codes, what the LM reads, the provided
tokens of the position it writes) and `end_step` (the sampled tokens committed): ~33 small
torch launches, or two with `fused` (kernels/token_delays.py, on CUDA by default: the 1-call
step 5.93 against 5.98 ms, 800 kernels a tick against 832).
"""

import torch
from torch import Tensor, nn
from torch.nn import functional

from engine.models.moshi.attention import fused_on


class TokenDelays(nn.Module):
    def __init__(
        self,
        delays: tuple[int, ...],
        model_streams: int,
        initial: tuple[int, ...],
        slots: int,
        device: torch.device,
    ) -> None:
        super().__init__()
        self.model_streams = model_streams  # text + model audio codebooks
        self.max_delay = max(delays)
        ring = self.max_delay + 2
        streams = len(delays)
        self.delays: Tensor
        self.initial: Tensor
        self.cache: Tensor
        self.provided: Tensor
        self.offsets: Tensor
        self.user_streams: Tensor
        long = torch.long
        self.register_buffer("delays", torch.tensor(delays, device=device, dtype=long), False)
        self.register_buffer("initial", torch.tensor(initial, device=device, dtype=long), False)
        self.register_buffer(
            "cache", torch.zeros(slots, streams, ring, device=device, dtype=long), False
        )
        self.register_buffer(
            "provided", torch.zeros(slots, streams, ring, device=device, dtype=torch.bool), False
        )
        self.register_buffer("offsets", torch.zeros(slots, device=device, dtype=long), False)
        # bool [streams]: the user's audio codebooks, given every step rather than sampled
        user_streams = torch.arange(streams, device=device) >= model_streams
        self.register_buffer("user_streams", user_streams, False)
        # begin_step and end_step in one launch each (kernels/token_delays.py): True, None
        # (on CUDA only: the default) or False, the torch ops. Read at every step: set it
        # before a graph is captured
        self.fused: bool | None = None

    @property
    def ring(self) -> int:
        return self.cache.shape[2]

    def begin_step(self, reset: Tensor, user_codes: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Before a step: the `reset` rows (bool [slots]) start over, the user's codes for
        this frame (int64 [slots, user streams]) are given; returns what the LM reads
        (inputs) and the provided model-stream tokens of the position it writes (targets)."""
        if fused_on(reset, self.fused):
            # imported here: triton is absent from CPU-only installs, which never take this path
            from kernels.token_delays import begin_step

            return begin_step(
                self.cache, self.provided, self.offsets, self.delays, self.initial,
                self.model_streams, reset, user_codes,
            )  # fmt: skip
        self.reset(reset)
        given = functional.pad(user_codes, (self.model_streams, 0))  # [slots, streams]
        self.provide(given, self.user_streams.expand(user_codes.shape[0], -1))
        return self.inputs(), *self.targets()

    def end_step(self, text: Tensor, audio: Tensor) -> tuple[Tensor, Tensor]:
        """After a step: `commit` of the sampled text (int64 [slots]) and audio (int64
        [slots, model streams - 1]) tokens."""
        if fused_on(text, self.fused):
            from kernels.token_delays import end_step

            return end_step(
                self.cache, self.provided, self.offsets, self.delays, self.model_streams,
                self.max_delay, text, audio,
            )  # fmt: skip
        return self.commit(torch.cat([text[:, None], audio], dim=1))

    def reset(self, mask: Tensor) -> None:
        """mask: bool [slots]."""
        self.offsets.masked_fill_(mask, 0)
        self.provided.masked_fill_(mask[:, None, None], False)

    def provide(self, tokens: Tensor, streams: Tensor) -> None:
        """Give tokens: int64 [slots, streams] for this step's frame where streams: bool
        [slots, streams] is set; each lands at its own delay."""
        position = torch.remainder(self.offsets[:, None] + self.delays[None, :], self.ring)
        index = position[:, :, None]  # [slots, streams, 1]
        old = self.cache.gather(2, index)[:, :, 0]
        self.cache.scatter_(2, index, torch.where(streams, tokens, old)[:, :, None])
        old_flag = self.provided.gather(2, index)[:, :, 0]
        self.provided.scatter_(2, index, (streams | old_flag)[:, :, None])

    def inputs(self) -> Tensor:
        """int64 [slots, streams]: what the LM reads this step."""
        position = torch.remainder(self.offsets, self.ring).view(-1, 1, 1)
        read = self.cache.gather(2, position.expand(-1, self.cache.shape[1], 1))[:, :, 0]
        is_initial = self.offsets[:, None] <= self.delays[None, :]
        return torch.where(is_initial, self.initial[None, :], read)

    def targets(self) -> tuple[Tensor, Tensor]:
        """Provided model-stream tokens for the position this step writes:
        (tokens int64 [slots, model_streams], provided bool [slots, model_streams])."""
        return self.targets_at(self.offsets + 1)

    def commit(self, generated: Tensor) -> tuple[Tensor, Tensor]:
        """Store the sampled model-stream tokens: int64 [slots, model_streams], advance.

        Returns the emitted frame (int64 [slots, model_streams]) and whether it exists
        (bool [slots]; before step max_delay there is nothing to emit).
        """
        read_position = torch.remainder(self.offsets, self.ring).view(-1, 1, 1)
        self.provided.scatter_(2, read_position.expand(-1, self.cache.shape[1], 1), False)
        self.offsets.add_(1)
        tokens, flags = self.targets_at(self.offsets)
        kept = torch.where(flags, tokens, generated)
        write = torch.remainder(self.offsets, self.ring).view(-1, 1, 1)
        self.cache[:, : self.model_streams].scatter_(
            2, write.expand(-1, self.model_streams, 1), kept[:, :, None]
        )
        delays = self.delays[: self.model_streams]
        emit = torch.remainder(self.offsets[:, None] - self.max_delay + delays[None, :], self.ring)
        frame = self.cache[:, : self.model_streams].gather(2, emit[:, :, None])[:, :, 0]
        return frame, self.offsets > self.max_delay

    def targets_at(self, offsets: Tensor) -> tuple[Tensor, Tensor]:
        """Model-stream tokens and provided flags at ring position `offsets` [slots]."""
        position = torch.remainder(offsets, self.ring).view(-1, 1, 1)
        index = position.expand(-1, self.model_streams, 1)
        tokens = self.cache[:, : self.model_streams].gather(2, index)[:, :, 0]
        flags = self.provided[:, : self.model_streams].gather(2, index)[:, :, 0]
        return tokens, flags

    def seed(self, slot: int, offset: int, tokens: Tensor) -> None:
        """Put one slot at step `offset` with tokens: int64 [streams] as what that step reads
        (nothing provided); used after a prompt replay."""
        self.offsets[slot] = offset
        self.provided[slot] = False
        self.cache[slot, :, offset % self.ring] = tokens
