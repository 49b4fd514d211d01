"""Mimi's split residual vector quantizer: 1 semantic codebook + 7 acoustic ones (of 31).

Both halves project the same latent (1x1 convolutions, no bias) into the codebook space; the
acoustic half quantizes residually. Codebook vectors are stored ready to use,
[codebooks, bins, dim] (the checkpoint's `embedding_sum / cluster_usage`).

    encode: latent float32 [slots, latent_dim, frames] -> codes int64 [slots, 8, frames]
    decode: codes int64 [slots, 8, frames] -> latent float32 [slots, latent_dim, frames]

The eager path uses cdist, Kyutai's metric, so that near ties break the same way (CPU codes
match Kyutai's bit for bit). The fused path (`fused=True`: kernels/mimi_rvq.py, CUDA or the
interpreter) takes 2 launches per codebook to encode (a GEMM with the codeword norms in its
epilogue, then argmin + residual update) and one per quantizer to sum the codewords, against
~12 and ~2 per codebook eager; the codeword norms are computed once, not per step. It keeps
the eager 1x1 convolutions for the projections (on CUDA in TF32, cuDNN's default), so
decoding is bit-identical to eager and encoding differs from cdist in rounding only. An
fp32 GEMM in their place had moved 2 of 2016 codes in tests/kernels/test_mimi_codec.py's GPU
run; that test's audio error in TF32 (8.2e-4 then, 5.9e-4 with these projections) is
TF32's own noise, which the SEANet convolutions make of any rounding difference upstream
(eager TF32 against eager fp32: 8.5e-4); with fp32 convolutions the fused codec is within
1.4e-6 of eager, every code equal (H200, the test's docstring).
"""

import torch
from torch import Tensor, nn
from torch.nn import functional


class ResidualQuantizer(nn.Module):
    def __init__(
        self, codebooks: int, bins: int, dim: int, latent_dim: int, device: torch.device
    ) -> None:
        super().__init__()
        self.input_proj = nn.Conv1d(latent_dim, dim, 1, bias=False, device=device)
        self.output_proj = nn.Conv1d(dim, latent_dim, 1, bias=False, device=device)
        self.codebooks = nn.Parameter(torch.zeros(codebooks, bins, dim, device=device))
        # the fused encode's codeword norms |c|^2 [K, bins], kept while the codebooks are
        # unchanged: the key is their storage and version counter (a checkpoint load copies
        # into them, which moves the counter)
        self._norms: tuple[tuple[int, int], Tensor] | None = None

    def encode(self, latent: Tensor) -> Tensor:
        residual = self.input_proj(latent).transpose(1, 2)  # [B, frames, dim]
        batch, frames, dim = residual.shape
        codes = []
        for codebook in self.codebooks:
            flat = residual.reshape(-1, dim)
            # the reference's metric, so that near ties break the same way
            index = torch.cdist(flat[None], codebook[None], p=2)[0].argmin(dim=-1)
            index = index.view(batch, frames)
            residual = residual - functional.embedding(index, codebook)
            codes.append(index)
        return torch.stack(codes, dim=1)

    def decode(self, codes: Tensor) -> Tensor:
        total = functional.embedding(codes[:, 0], self.codebooks[0])  # [B, frames, dim]
        for k in range(1, codes.shape[1]):
            total = total + functional.embedding(codes[:, k], self.codebooks[k])
        latent: Tensor = self.output_proj(total.transpose(1, 2))
        return latent

    def encode_fused(self, latent: Tensor, codes: Tensor, first: int) -> None:
        """latent: fp32 [B, latent_dim, frames] -> codes[:, first:first + K] (int64
        [B * frames, 8]); the projection is the eager one (the same convolution)."""
        from kernels.mimi_rvq import assign_nearest

        projected = self.input_proj(latent)  # [B, dim, frames]
        residual = projected.transpose(1, 2).reshape(codes.shape[0], -1).contiguous()
        norms = self._codeword_norms()
        for k, codebook in enumerate(self.codebooks):
            # |c|^2 - 2 r.c: |r - c|^2 less the row's own |r|^2
            scores = torch.addmm(norms[k], residual, codebook.T, alpha=-2.0)
            assign_nearest(scores, codebook, residual, codes, first + k)

    def _codeword_norms(self) -> Tensor:
        """|c|^2 of every codeword, [K, bins]: computed again only after the codebooks
        changed, so a step (and a captured graph) launches no kernel for it (two a
        quantizer, four a tick, before)."""
        codebooks = self.codebooks
        key = (codebooks.data_ptr(), codebooks._version)
        if self._norms is None or self._norms[0] != key:
            with torch.no_grad():
                self._norms = (key, codebooks.square().sum(dim=-1))
        return self._norms[1]

    def decode_fused(self, codes: Tensor, first: int, batch: int) -> Tensor:
        """codes: int64 [B * frames, 8], this quantizer's from column `first` ->
        [B, latent_dim, frames], bit-identical to `decode`."""
        from kernels.mimi_rvq import codebook_sum

        total = codebook_sum(codes, first, self.codebooks)  # [B * frames, dim]
        latent: Tensor = self.output_proj(total.view(batch, -1, total.shape[1]).transpose(1, 2))
        return latent


class SplitQuantizer(nn.Module):
    def __init__(
        self,
        codebooks: int,
        bins: int,
        dim: int,
        latent_dim: int,
        device: torch.device,
        fused: bool = False,
    ) -> None:
        super().__init__()
        self.fused = fused
        self.rvq_first = ResidualQuantizer(1, bins, dim, latent_dim, device)
        self.rvq_rest = ResidualQuantizer(codebooks - 1, bins, dim, latent_dim, device)

    def encode(self, latent: Tensor) -> Tensor:
        if not self.fused:
            return torch.cat([self.rvq_first.encode(latent), self.rvq_rest.encode(latent)], dim=1)
        batch, _, frames = latent.shape
        codebooks = self.rvq_first.codebooks.shape[0] + self.rvq_rest.codebooks.shape[0]
        codes = torch.empty(batch * frames, codebooks, device=latent.device, dtype=torch.long)
        self.rvq_first.encode_fused(latent, codes, 0)
        self.rvq_rest.encode_fused(latent, codes, self.rvq_first.codebooks.shape[0])
        return codes.view(batch, frames, codebooks).transpose(1, 2)

    def decode(self, codes: Tensor) -> Tensor:
        if not self.fused:
            return self.rvq_first.decode(codes[:, :1]) + self.rvq_rest.decode(codes[:, 1:])
        batch, codebooks, frames = codes.shape
        rows = codes.transpose(1, 2).reshape(batch * frames, codebooks).contiguous()
        first = self.rvq_first.codebooks.shape[0]
        return self.rvq_first.decode_fused(rows, 0, batch) + self.rvq_rest.decode_fused(
            rows, first, batch
        )
