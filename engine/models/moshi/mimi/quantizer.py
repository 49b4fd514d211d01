"""Mimi's split residual vector quantizer: 1 semantic codebook + 7 acoustic ones (of 31).

Both halves project the same latent (1x1 convolutions, no bias) into the codebook space; the
acoustic half quantizes residually. Codebook vectors are stored ready to use,
[codebooks, bins, dim] (the checkpoint's `embedding_sum / cluster_usage`).

    encode: latent float32 [slots, latent_dim, frames] -> codes int64 [slots, 8, frames]
    decode: codes int64 [slots, 8, frames] -> latent float32 [slots, latent_dim, frames]
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


class SplitQuantizer(nn.Module):
    def __init__(
        self, codebooks: int, bins: int, dim: int, latent_dim: int, device: torch.device
    ) -> None:
        super().__init__()
        self.rvq_first = ResidualQuantizer(1, bins, dim, latent_dim, device)
        self.rvq_rest = ResidualQuantizer(codebooks - 1, bins, dim, latent_dim, device)

    def encode(self, latent: Tensor) -> Tensor:
        return torch.cat([self.rvq_first.encode(latent), self.rvq_rest.encode(latent)], dim=1)

    def decode(self, codes: Tensor) -> Tensor:
        return self.rvq_first.decode(codes[:, :1]) + self.rvq_rest.decode(codes[:, 1:])
