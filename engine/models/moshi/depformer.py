"""The depth transformer: predicts a frame's audio codebooks one after the other.

Inside one frame it runs `steps` (8) dependent steps; step s has its own weights (input
projection from the temporal output, token embedding, attention, FFN, output head), reads the
token sampled at step s-1 (the text token for s = 0), and attends causally to steps 0..s of
this frame only. Weights are stacked per step:

    depformer_in:         [steps, dep_dim, dim]
    depformer_emb:        [steps - 1, card + 1, dep_dim]   (input token of steps 1..)
    layers.i.self_attn.in_proj:   [steps, 3 * dep_dim, dep_dim]
    layers.i.self_attn.out_proj:  [steps, dep_dim, dep_dim]
    layers.i.gating.linear_in:    [steps, 2 * hidden, dep_dim]
    layers.i.gating.linear_out:   [steps, dep_dim, hidden]
    linears:              [steps, card, dep_dim]

PersonaPlex checkpoints hold 16 steps; steps 8..15 predict the user's codebooks, which are
replaced by the user's real codes, so only the first 8 are loaded and run (causal attention
means the skipped steps cannot change the first 8).
"""

import torch
from torch import Tensor, nn
from torch.nn import functional

from engine.models.moshi.attention import RmsNorm, add_rms_norm, fused_on, rms_norm
from engine.models.moshi.config import LmConfig
from engine.models.moshi.sampling import Sampling, draw_noise, sample
from engine.models.moshi.transformer import RMS_EPS, gated_ffn

# the largest batch for which the few-rows kernels beat the per-op ones (measured: see
# kernels/fused_linear.py's docstring); at most that module's MAX_ROWS (its attention inside
# the out projection up to kernels/attended_linear.py's MAX_ROWS, 2)
FEW_ROWS = 4
# the largest batch for which the fused path runs the whole frame as one resident launch
# (kernels/depformer_program.py; at most its MAX_ROWS). 0: it measured slower than the
# few-rows kernels at every batch (that module's docstring), so it is not served
PROGRAM_ROWS = 0


class StepAttention(nn.Module):
    def __init__(
        self, steps: int, dim: int, num_heads: int, device: torch.device, dtype: torch.dtype
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.in_proj = nn.Parameter(torch.zeros(steps, 3 * dim, dim, device=device, dtype=dtype))
        self.out_proj = nn.Parameter(torch.zeros(steps, dim, dim, device=device, dtype=dtype))

    def forward(self, x: Tensor, step: int, keys: Tensor, values: Tensor, fused: bool) -> Tensor:
        """x: [B, 1, dim]; keys/values: [B, H, steps, head_dim], filled for steps < `step`.
        `fused`: the scratch write and the attention in one launch (kernels/step_attention.py)."""
        batch, _, dim = x.shape
        qkv = functional.linear(x, self.in_proj[step])
        if fused:
            # imported here: triton is absent from CPU-only installs, which never take this path
            from kernels.step_attention import step_attention

            out = step_attention(qkv.view(batch, 3 * dim), keys, values, step)
        else:
            q, k, v = (
                qkv.view(batch, 3, self.num_heads, dim // self.num_heads).unsqueeze(3).unbind(1)
            )  # each [B, H, 1, head_dim]
            keys[:, :, step : step + 1] = k
            values[:, :, step : step + 1] = v
            out = functional.scaled_dot_product_attention(
                q, keys[:, :, : step + 1], values[:, :, : step + 1]
            )  # all earlier steps are visible: no mask
        return functional.linear(out.reshape(batch, 1, dim), self.out_proj[step])


class StepFfn(nn.Module):
    def __init__(
        self, steps: int, dim: int, hidden: int, device: torch.device, dtype: torch.dtype
    ) -> None:
        super().__init__()
        self.linear_in = nn.Parameter(
            torch.zeros(steps, 2 * hidden, dim, device=device, dtype=dtype)
        )
        self.linear_out = nn.Parameter(torch.zeros(steps, dim, hidden, device=device, dtype=dtype))

    def forward(self, x: Tensor, step: int, residual: Tensor, fused: bool) -> Tensor:
        """residual + FFN(x) with step's weights (see gated_ffn for `fused`)."""
        return gated_ffn(x, self.linear_in[step], self.linear_out[step], residual, fused)


class DepformerLayer(nn.Module):
    def __init__(
        self,
        steps: int,
        dim: int,
        num_heads: int,
        hidden: int,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        self.norm1 = RmsNorm(dim, RMS_EPS, device, dtype)
        self.self_attn = StepAttention(steps, dim, num_heads, device, dtype)
        self.norm2 = RmsNorm(dim, RMS_EPS, device, dtype)
        self.gating = StepFfn(steps, dim, hidden, device, dtype)

    def forward(
        self,
        x: Tensor,
        pending: Tensor | None,
        step: int,
        keys: Tensor,
        values: Tensor,
        fused: bool,
        few_rows: bool,
    ) -> Tensor:
        """The layer's input is x + pending (pending: the first layer's token embedding, added
        in the norm's launch when fused). `fused`: the kernels of kernels/ (see gated_ffn);
        `few_rows` (fused, at most Depformer.few_rows slots): four launches, see _few_rows."""
        if few_rows:
            return self._few_rows(x, pending, step, keys, values)
        if pending is None:
            normed = rms_norm(x, self.norm1.alpha, self.norm1.eps, fused)
        else:
            x, normed = add_rms_norm(x, pending, self.norm1.alpha, self.norm1.eps, fused)
        attended = self.self_attn(normed, step, keys, values, fused)
        x, normed = add_rms_norm(x, attended, self.norm2.alpha, self.norm2.eps, fused)
        out: Tensor = self.gating(normed, step, x, fused)
        return out

    def _few_rows(
        self, x: Tensor, pending: Tensor | None, step: int, keys: Tensor, values: Tensor
    ) -> Tensor:
        """The fused layer step for a few slots in four launches (kernels/fused_linear.py,
        kernels/attended_linear.py): [norm (+ pending) + qkv], [attention + out + residual],
        [norm + gate/up + SiLU], [down + residual]. The norm after attention is the gate/up
        GEMM's prologue. Above attended_linear's MAX_ROWS (a bench may raise few_rows to
        fused_linear's) the attention is a launch of its own (kernels/step_attention.py)."""
        # imported here: triton is absent from CPU-only installs, which never take this path
        from kernels.attended_linear import MAX_ROWS as ATTENDED_ROWS
        from kernels.attended_linear import attended_linear
        from kernels.fused_linear import add_fused_linear, fused_linear
        from kernels.step_attention import step_attention

        batch, _, dim = x.shape
        in_proj = self.self_attn.in_proj[step]
        if pending is None:
            qkv = fused_linear(x, in_proj, alpha=self.norm1.alpha, eps=self.norm1.eps)
        else:
            x, qkv = add_fused_linear(
                x, pending, in_proj, alpha=self.norm1.alpha, eps=self.norm1.eps
            )
        out_proj = self.self_attn.out_proj[step]
        qkv = qkv.view(batch, 3 * dim)
        if batch <= ATTENDED_ROWS:
            x = attended_linear(qkv, keys, values, step, out_proj, x[:, 0])[:, None]
        else:
            attended = step_attention(qkv, keys, values, step)
            x = fused_linear(attended.view(x.shape), out_proj, residual=x)
        linear_in, linear_out = self.gating.linear_in[step], self.gating.linear_out[step]
        gated = fused_linear(x, linear_in, alpha=self.norm2.alpha, eps=self.norm2.eps, gated=True)
        return fused_linear(gated, linear_out, residual=x)


class Depformer(nn.Module):
    def __init__(
        self,
        *,
        steps: int,
        dim: int,
        dep_dim: int,
        num_heads: int,
        num_layers: int,
        hidden: int,
        text_card: int,
        card: int,
        slots: int,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        self.steps = steps

        def zeros(*shape: int) -> nn.Parameter:
            return nn.Parameter(torch.zeros(shape, device=device, dtype=dtype))

        self.depformer_in = zeros(steps, dep_dim, dim)
        self.depformer_text_emb = zeros(text_card + 1, dep_dim)
        self.depformer_emb = zeros(steps - 1, card + 1, dep_dim)
        self.layers = nn.ModuleList(
            DepformerLayer(steps, dep_dim, num_heads, hidden, device, dtype)
            for _ in range(num_layers)
        )
        self.linears = zeros(steps, card, dep_dim)
        # per-frame scratch: keys/values of steps 0..s, rewritten every frame
        scratch = (num_layers, slots, num_heads, steps, dep_dim // num_heads)
        self.keys: Tensor
        self.values: Tensor
        self.register_buffer("keys", torch.zeros(scratch, device=device, dtype=dtype), False)
        self.register_buffer("values", torch.zeros(scratch, device=device, dtype=dtype), False)
        # None: the fused kernels on CUDA only (see fused_on). Read at every call: set it
        # before a graph is captured
        self.fused: bool | None = None
        # the fused path's largest batch that takes the few-rows kernels (DepformerLayer's
        # _few_rows; 0: never). Read at every call, like `fused`
        self.few_rows = FEW_ROWS
        # the fused path's largest batch that runs the frame as one resident launch
        # (kernels/depformer_program.py; 0: never). Read at every call, like `fused`
        self.program_rows = PROGRAM_ROWS

    @classmethod
    def for_lm(
        cls, config: LmConfig, slots: int, device: torch.device, dtype: torch.dtype
    ) -> "Depformer":
        """The depth transformer of an LM of `config`: one step per model audio codebook."""
        return cls(
            steps=config.audio_codebooks,
            dim=config.dim,
            dep_dim=config.depformer_dim,
            num_heads=config.depformer_num_heads,
            num_layers=config.depformer_num_layers,
            hidden=config.depformer_ffn_hidden,
            text_card=config.text_card,
            card=config.card,
            slots=slots,
            device=device,
            dtype=dtype,
        )

    def forward(
        self,
        hidden: Tensor,
        text: Tensor,
        how: Sampling,
        generator: torch.Generator | None,
        forced: Tensor | None = None,
        forced_mask: Tensor | None = None,
    ) -> Tensor:
        """hidden: [B, 1, dim] (normed temporal output); text: int64 [B] -> int64 [B, steps].

        Where forced_mask: bool [B, steps] is set, that codebook is forced: forced: int64
        [B, steps] is returned and fed to the next step instead of the sampled token.
        """
        fused = fused_on(hidden, self.fused)
        few_rows = fused and hidden.shape[0] <= self.few_rows
        dep_dim = self.depformer_in.shape[1]
        projected = None
        if fused:
            # the input projections of all steps in one GEMM: they do not depend on the tokens
            projected = functional.linear(hidden, self.depformer_in.view(-1, hidden.shape[-1]))
        # the race's draws for every step at once: one launch, not one per step
        shape = (hidden.shape[0], self.steps, self.linears.shape[1])
        noise = draw_noise(shape, hidden.device, how, generator)
        if forced is None or forced_mask is None:
            forced = forced_mask = None
        if projected is not None and hidden.shape[0] <= self.program_rows:
            from kernels.depformer_program import depformer_program

            return depformer_program(
                self, projected.view(hidden.shape[0], -1), text, how.greedy, how.temperature,
                how.top_k, noise, forced, forced_mask,
            )  # fmt: skip
        tokens: list[Tensor] = []
        previous = text
        for step in range(self.steps):
            table = self.depformer_text_emb if step == 0 else self.depformer_emb[step - 1]
            embedded = functional.embedding(previous, table)[:, None]  # [B, 1, dep_dim]
            if projected is not None:
                x = projected[..., step * dep_dim : (step + 1) * dep_dim]
            else:
                x = functional.linear(hidden, self.depformer_in[step])
            pending: Tensor | None = embedded
            for index, layer in enumerate(self.layers):
                batch = x.shape[0]  # all slots, or 1 for a prompt replay
                keys, values = self.keys[index, :batch], self.values[index, :batch]
                x = layer(x, pending, step, keys, values, fused, few_rows)
                pending = None
            logits = self._head(x[:, 0], step, few_rows)  # [B, card]
            token = sample(
                logits,
                how,
                generator,
                None if forced is None else forced[:, step],
                None if forced_mask is None else forced_mask[:, step],
                None if noise is None else noise[:, step],
                fused,
            )
            tokens.append(token)
            previous = token
        return torch.stack(tokens, dim=1)

    def _head(self, x: Tensor, step: int, few_rows: bool) -> Tensor:
        """x: [B, dep_dim] -> step's logits [B, card]."""
        if few_rows:
            from kernels.fused_linear import fused_linear

            return fused_linear(x, self.linears[step])
        return functional.linear(x, self.linears[step])
