"""SEANet causal convolution stacks of Mimi, streaming one frame per step for all slots.

Each convolution keeps, per slot, the input tail its next window needs; each transposed
convolution keeps the overlapping output tail it owes the next frame. Both are preallocated
[slots, channels, length] buffers; a reset zeroes the rows of the slots that start a call:

    StreamingConv1d.previous:          [slots, in_channels, (kernel - 1) * dilation + 1 - stride]
    StreamingConvTranspose1d.partial:  [slots, out_channels, kernel - stride]

Layer order (and so the `model.{i}` indices of Kyutai's checkpoint, activations included):
encoder = conv, per ratio (residual blocks, ELU, strided conv), ELU, conv;
decoder = conv, per ratio (ELU, transposed conv, residual blocks), ELU, conv.
"""

import torch
from torch import Tensor, nn


class Streaming(nn.Module):
    """A module with per-slot state that `reset` clears for the masked slots."""

    def reset(self, mask: Tensor) -> None:
        raise NotImplementedError


def streaming_parts(*modules: nn.Module) -> tuple[Streaming, ...]:
    """Every streaming submodule of `modules`, in order: found once, then reset per step."""
    return tuple(
        child for module in modules for child in module.modules() if isinstance(child, Streaming)
    )


class StreamingConv1d(Streaming):
    """Causal Conv1d; `replicate` pads the very first frame with its first sample (else 0)."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel: int,
        slots: int,
        device: torch.device,
        *,
        stride: int = 1,
        dilation: int = 1,
        groups: int = 1,
        bias: bool = True,
        replicate: bool = False,
    ) -> None:
        super().__init__()
        self.conv = nn.Conv1d(
            in_channels,
            out_channels,
            kernel,
            stride,
            dilation=dilation,
            groups=groups,
            bias=bias,
            device=device,
        )
        self.replicate = replicate
        history = (kernel - 1) * dilation + 1 - stride
        self.previous: Tensor
        self.first: Tensor
        self.register_buffer(
            "previous", torch.zeros(slots, in_channels, history, device=device), False
        )
        self.register_buffer(
            "first", torch.ones(slots, 1, 1, device=device, dtype=torch.bool), False
        )

    def reset(self, mask: Tensor) -> None:
        self.previous.masked_fill_(mask[:, None, None], 0.0)
        self.first.masked_fill_(mask[:, None, None], True)

    def forward(self, x: Tensor) -> Tensor:
        """x: [slots, in_channels, T], T a multiple of the stride -> [slots, out, T / stride]."""
        history = self.previous.shape[2]
        if history == 0:
            direct: Tensor = self.conv(x)
            return direct
        if self.replicate:
            start = x[..., :1].expand_as(self.previous)
            self.previous.copy_(torch.where(self.first, start, self.previous))
            self.first.fill_(False)
        window = torch.cat([self.previous, x], dim=-1)
        self.previous.copy_(window[..., -history:])
        out: Tensor = self.conv(window)
        return out


class StreamingConvTranspose1d(Streaming):
    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel: int,
        stride: int,
        slots: int,
        device: torch.device,
        *,
        groups: int = 1,
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.convtr = nn.ConvTranspose1d(
            in_channels, out_channels, kernel, stride, groups=groups, bias=bias, device=device
        )
        self.partial: Tensor
        self.register_buffer(
            "partial", torch.zeros(slots, out_channels, kernel - stride, device=device), False
        )

    def reset(self, mask: Tensor) -> None:
        self.partial.masked_fill_(mask[:, None, None], 0.0)

    def forward(self, x: Tensor) -> Tensor:
        """x: [slots, in_channels, T] -> [slots, out_channels, T * stride]."""
        y: Tensor = self.convtr(x)
        owed = self.partial.shape[2]
        y[..., :owed] += self.partial
        tail = y[..., -owed:]
        if self.convtr.bias is not None:
            # the bias is added once, by the frame the samples are emitted in
            tail = tail - self.convtr.bias[:, None]
        self.partial.copy_(tail)
        return y[..., :-owed]


class ResnetBlock(nn.Module):
    """x + conv1x1(ELU(conv_k(ELU(x)))), the inner width halved (`compress`)."""

    def __init__(
        self,
        dim: int,
        kernel: int,
        dilation: int,
        compress: int,
        slots: int,
        device: torch.device,
    ) -> None:
        super().__init__()
        hidden = dim // compress
        self.block = nn.Sequential(
            nn.ELU(),
            StreamingConv1d(dim, hidden, kernel, slots, device, dilation=dilation),
            nn.ELU(),
            StreamingConv1d(hidden, dim, 1, slots, device),
        )

    def forward(self, x: Tensor) -> Tensor:
        update: Tensor = self.block(x)
        return x + update


class SeanetStack(nn.Module):
    """A SEANet encoder or decoder: its layers in order, as `model.{i}`."""

    def __init__(self, layers: list[nn.Module]) -> None:
        super().__init__()
        self.model = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.model(x)  # type: ignore[no-any-return]


def seanet_encoder(
    *,
    n_filters: int,
    dimension: int,
    ratios: tuple[int, ...],
    kernel_size: int,
    last_kernel_size: int,
    residual_kernel_size: int,
    dilation_base: int,
    n_residual_layers: int,
    compress: int,
    slots: int,
    device: torch.device,
) -> SeanetStack:
    """Waveform [slots, 1, samples] -> latent [slots, dimension, samples / prod(ratios)]."""
    layers: list[nn.Module] = [StreamingConv1d(1, n_filters, kernel_size, slots, device)]
    mult = 1
    for ratio in reversed(ratios):
        width = mult * n_filters
        for j in range(n_residual_layers):
            layers.append(
                ResnetBlock(width, residual_kernel_size, dilation_base**j, compress, slots, device)
            )
        layers.append(nn.ELU())
        layers.append(StreamingConv1d(width, 2 * width, 2 * ratio, slots, device, stride=ratio))
        mult *= 2
    layers.append(nn.ELU())
    layers.append(StreamingConv1d(mult * n_filters, dimension, last_kernel_size, slots, device))
    return SeanetStack(layers)


def seanet_decoder(
    *,
    n_filters: int,
    dimension: int,
    ratios: tuple[int, ...],
    kernel_size: int,
    last_kernel_size: int,
    residual_kernel_size: int,
    dilation_base: int,
    n_residual_layers: int,
    compress: int,
    slots: int,
    device: torch.device,
) -> SeanetStack:
    """Latent [slots, dimension, frames] -> waveform [slots, 1, frames * prod(ratios)]."""
    mult = 2 ** len(ratios)
    layers: list[nn.Module] = [
        StreamingConv1d(dimension, mult * n_filters, kernel_size, slots, device)
    ]
    for ratio in ratios:
        width = mult * n_filters
        layers.append(nn.ELU())
        layers.append(StreamingConvTranspose1d(width, width // 2, 2 * ratio, ratio, slots, device))
        for j in range(n_residual_layers):
            layers.append(
                ResnetBlock(
                    width // 2, residual_kernel_size, dilation_base**j, compress, slots, device
                )
            )
        mult //= 2
    layers.append(nn.ELU())
    layers.append(StreamingConv1d(n_filters, 1, last_kernel_size, slots, device))
    return SeanetStack(layers)
