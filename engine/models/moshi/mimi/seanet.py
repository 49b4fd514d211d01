"""SEANet causal convolution stacks of Mimi, streaming one frame per step for all slots.

Each convolution keeps, per slot, the input tail its next window needs; each transposed
convolution keeps the overlapping output tail it owes the next frame. Both are preallocated
[slots, channels, length] buffers; a reset zeroes the rows of the slots that start a call:

    StreamingConv1d.previous:          [slots, in_channels, (kernel - 1) * dilation + 1 - stride]
    StreamingConvTranspose1d.partial:  [slots, out_channels, kernel - stride]

Layer order (and so the `model.{i}` indices of Kyutai's checkpoint, activations included):
encoder = conv, per ratio (residual blocks, ELU, strided conv), ELU, conv;
decoder = conv, per ratio (ELU, transposed conv, residual blocks), ELU, conv.

`channels_last` (the codec's default on CUDA) keeps every activation, state buffer and weight
time-major in memory ([slots, T, channels] under the [slots, channels, T] shape), and runs
each convolution as a 2-d one over [slots, channels, 1, T] in channels-last format (transposed
ones are a matrix product, time-major in either layout: StreamingConvTranspose1d): cuDNN's
TF32 kernels on Hopper are channels-last, so the default layout cost two layout conversions
per convolution (at 1 call 33 nchwToNhwc kernels, 0.17 ms of an 8.9 ms tick, the reverse ones
below the profile's top 25; at 128 calls 39 + 14 of both, 0.62 ms:
bench/results/tick_kernels_no_tf32.json). Shapes, checkpoint
names and results are the same either way (tests/engine/models/moshi/test_mimi.py runs both
against Kyutai's Mimi); elementwise ops keep their input's layout, so none is converted.
Measured on one H200 (`python3 bench/mimi_gpu.py --slots 1,128 --no-sweep`, both layouts in one
run, bench/results/mimi_gpu_channels_last_first.json): encode 0.89 -> 0.80 ms at 1 call, 2.57
-> 2.36 ms at 128 calls. Decode barely gained at 1 call (0.87 -> 0.85 ms) and lost at 128
(2.66 -> 2.78 ms) to cuDNN's channels-last transposed convolutions; run time-last, decode at
128 calls went 2.31 -> 2.07 ms between two runs of bench/engine_stages.py
(bench/results/engine_stages_convtr_channels_last.json -> engine_stages_after.json), before
they became matrix products.

A convolution's window (its kept tail, the frame through the ELU in front of it, the tail
it keeps for the next frame) is one launch of kernels/seanet_window.py on CUDA (channels-last,
frames at least the tail long): the ELU, the concatenation and the copy were three. The ELU
modules before a convolution hand it their input (SeanetStack, ResnetBlock), so the ELU runs
there. One H200, alternated in one run (`python3 bench/engine_stages.py --slots 1,128 --ab
window`, bench/results/engine_stages_ab_902ed82.json), ms with the window kernel against
torch's ops: 1 slot encode 0.552 / 0.509 against 0.531 / 0.530 (145 against 162 kernels),
decode 0.427 / 0.426 against 0.444 / 0.443 (137 against 147); 128 slots encode 2.380 / 2.380
against 2.404 / 2.403, decode 2.271 / 2.272 against 2.436 / 2.422.

Tried and reverted (commit 31cb4ed): each convolution as one Triton launch with the ELU in
front, the window over the tail, the bias, the residual add and the tail update fused (an
implicit GEMM over (slot, frame) rows in TF32; the tail double-buffered by a phase flipped
per frame). It was slower than cuDNN and the torch glue it replaced, at every load, in one
run (`python3 bench/mimi_gpu.py --slots 1,128 --no-sweep`, bench/results/
mimi_gpu_conv_kernel.json; ms, the kernel on all but the three largest convolutions against
all on cuDNN): encode 1.08 vs 0.60 at 1 call and 3.46 vs 2.41 at 128, decode 0.70 vs 0.46 and
2.74 vs 2.46, with 136 against 178 encode kernels at 1 call; on every convolution 2.54 ms to
encode at 1 call. Its TF32 also failed the codec's GPU test (tests/kernels/test_mimi_codec.py):
audio error against the eager codec 3.9e-3, where eager TF32 against fp32 is 9.2e-4
(bench/results/gpu_tests_conv_kernel.log). Not profiled; the launches it saves (42 of 178 to
encode at 1 call) would be worth ~0.1 ms at ~2.5 us each (an estimate, not measured).
"""

import torch
from torch import Tensor, nn
from torch.nn import functional

from engine.models.moshi.config import MimiConfig


class Streaming(nn.Module):
    """A module with per-slot state that `reset` clears for the masked slots."""

    def reset(self, mask: Tensor) -> None:
        raise NotImplementedError


def time_major(tensor: Tensor) -> Tensor:
    """The same [n, channels, length] values stored [n, length, channels] in memory."""
    return tensor.permute(0, 2, 1).contiguous().permute(0, 2, 1)


def time_major_4d(x: Tensor) -> Tensor:
    """[n, channels, 1, length] in channels-last format -> [n, channels, length] time-major
    (no copy when it already is)."""
    return x.contiguous(memory_format=torch.channels_last)[:, :, 0]


class StatePool:
    """The states of a codec direction's convolutions as views of one fp32 [slots, size]
    buffer, so that resetting them is one masked fill, not one launch per convolution (15 per
    direction in Moshi's Mimi, the encoder's replicating downsample among them); the replicating
    convolution's first-frame flag and the other streaming parts (transformers) reset
    themselves. Built once the modules are on their device: moving a module afterwards would
    give its state a buffer of its own again."""

    def __init__(self, parts: tuple[Streaming, ...], slots: int, device: torch.device) -> None:
        convolutions = [
            part for part in parts if isinstance(part, StreamingConv1d | StreamingConvTranspose1d)
        ]
        sizes = [
            (part.previous if isinstance(part, StreamingConv1d) else part.partial)[0].numel()
            for part in convolutions
        ]
        self.buffer = torch.zeros(slots, sum(sizes), device=device)
        offset = 0
        for part, size in zip(convolutions, sizes, strict=True):
            part.adopt_state(self.buffer[:, offset : offset + size])
            offset += size
        self.others = tuple(part for part in parts if part not in convolutions)
        self.flagged = tuple(
            part for part in convolutions if isinstance(part, StreamingConv1d) and part.replicate
        )

    def reset(self, mask: Tensor) -> None:
        """mask: bool [slots]; those slots' states start over."""
        self.buffer.masked_fill_(mask[:, None], 0.0)
        for flagged in self.flagged:
            flagged.reset_first(mask)
        for part in self.others:
            part.reset(mask)


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
        channels_last: bool = False,
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
        self.channels_last = channels_last
        # the window (kept tail + frame, ELU in front, new tail) in one launch
        # (kernels/seanet_window.py): channels-last frames at least the tail long; None: on
        # CUDA only. Read at every call: set it before a graph is captured
        self.window_kernel: bool | None = None
        history = (kernel - 1) * dilation + 1 - stride
        previous = torch.zeros(slots, in_channels, history, device=device)
        if channels_last:
            # loading a checkpoint copies into these tensors and keeps their layout
            self.conv.weight.data = time_major(self.conv.weight.data)
            previous = time_major(previous)
        self.previous: Tensor
        self.register_buffer("previous", previous, False)
        if replicate:
            self.first: Tensor
            self.register_buffer(
                "first", torch.ones(slots, 1, 1, device=device, dtype=torch.bool), False
            )

    def reset(self, mask: Tensor) -> None:
        self.previous.masked_fill_(mask[:, None, None], 0.0)
        if self.replicate:
            self.reset_first(mask)

    def reset_first(self, mask: Tensor) -> None:
        """The replicating convolution's first-frame flag set again for the masked slots
        (the rest of `reset`, for a convolution whose tail a StatePool keeps)."""
        self.first.masked_fill_(mask[:, None, None], True)

    def adopt_state(self, pooled: Tensor) -> None:
        """Keep `previous` in pooled ([slots, its size], see StatePool), same layout."""
        slots, channels, history = self.previous.shape
        if self.channels_last:
            self.previous = pooled.view(slots, history, channels).transpose(1, 2)
        else:
            self.previous = pooled.view(slots, channels, history)

    def forward(self, x: Tensor, activate: bool = False) -> Tensor:
        """x: [slots, in_channels, T], T a multiple of the stride -> [slots, out, T / stride].
        `activate`: the ELU in front of the convolution applied here (SEANet's ELU modules
        before a convolution hand it their input, see SeanetStack), so that the window's
        launch also runs the ELU."""
        history = self.previous.shape[2]
        if history == 0:
            return self._convolve(functional.elu(x) if activate else x)
        if self.replicate:
            start = x[..., :1].expand_as(self.previous)
            torch.where(self.first, start, self.previous, out=self.previous)  # one launch
            self.first.fill_(False)
        kernel = x.is_cuda if self.window_kernel is None else self.window_kernel
        if kernel and self.channels_last and history <= x.shape[2]:
            # imported here: triton is absent from CPU-only installs, which never take this path
            from kernels.seanet_window import conv_window

            return self._convolve(conv_window(x, self.previous, activate))
        if activate:
            x = functional.elu(x)
        # 4-d so that the concatenation keeps a channels-last layout (3-d tensors have none)
        window = torch.cat([self.previous[:, :, None], x[:, :, None]], dim=-1)[:, :, 0]
        self.previous.copy_(window[..., -history:])
        return self._convolve(window)

    def _convolve(self, x: Tensor) -> Tensor:
        if not self.channels_last:
            out: Tensor = self.conv(x)
            return out
        conv = self.conv
        out = functional.conv2d(
            x[:, :, None],
            conv.weight[:, :, None],
            conv.bias,
            (1, conv.stride[0]),
            0,
            (1, conv.dilation[0]),
            conv.groups,
        )
        # a 1-channel input and weight (the encoder's first convolution) fit either layout
        # and may come out time-last: converted here, once (a no-op when channels-last)
        return time_major_4d(out)


class StreamingConvTranspose1d(Streaming):
    """Causal ConvTranspose1d of kernel 2 * stride (Mimi's every one), as a matrix product and
    an overlap-add rather than cuDNN's transposed convolution:

        taps[s, t, j, o] = sum_c x[s, c, t] * weight[c, o, j]   one GEMM [slots * T, in] @
                           [in, kernel * out] (channel-wise, groups = in = out: a product)
        y[s, o, t * stride + r] = taps[s, t, r, o] + taps[s, t - 1, stride + r, o] + bias[o]

    where taps[s, -1] is `partial`, the second half the last frame owed to this one. The
    weight is stored [in, kernel, out] in memory (the [in, out, kernel] shape kept: loading a
    checkpoint copies into it and keeps the layout), so the GEMM reads it as it is; the state
    and the output are time-major, the output converted to time-last when not `channels_last`.
    The GEMM runs in TF32 where torch.backends.cuda.matmul.allow_tf32 is set (the engine sets
    it on CUDA, as cuDNN's convolutions default to TF32); the channel-wise product in fp32.

    cuDNN's transposed convolutions were slow on the decode path at one call: the channel-wise
    upsample's dgrad kernel took 58.8 us and the four SEANet upsamplers ~50 us more (one H200,
    `python3 bench/mimi_gpu.py --slots 1 --no-sweep`, bench/results/mimi_gpu_1_c4f227d.json);
    in channels-last form slower still at 128 calls (568 us for the upsample,
    mimi_gpu_channels_last_first.json).
    """

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
        channels_last: bool = False,
    ) -> None:
        super().__init__()
        if kernel != 2 * stride:
            raise ValueError(f"transposed convolution kernel {kernel} must be twice the stride")
        if groups not in (1, in_channels) or (groups > 1 and out_channels != in_channels):
            raise ValueError(
                f"groups {groups}: 1, or channel-wise ({in_channels} in and out channels)"
            )
        self.convtr = nn.ConvTranspose1d(
            in_channels, out_channels, kernel, stride, groups=groups, bias=bias, device=device
        )
        weight = self.convtr.weight.data  # [in, out / groups, kernel]
        self.convtr.weight.data = weight.permute(0, 2, 1).contiguous().permute(0, 2, 1)
        self.channels_last = channels_last
        # the overlap-add (owed share, taps, bias, new partial; channel-wise also the
        # product) in one launch of kernels/seanet_overlap.py, channels-last only; switched
        # by MimiCodec.use_glue_kernels. Read at every call: set it before a graph is captured
        self.overlap_kernel = False
        self.partial: Tensor  # [slots, out, stride], stored time-major
        partial = torch.zeros(slots, stride, out_channels, device=device).transpose(1, 2)
        self.register_buffer("partial", partial, False)

    def reset(self, mask: Tensor) -> None:
        self.partial.masked_fill_(mask[:, None, None], 0.0)

    def adopt_state(self, pooled: Tensor) -> None:
        """Keep `partial` in pooled ([slots, its size], see StatePool), same layout."""
        slots, channels, owed = self.partial.shape
        self.partial = pooled.view(slots, owed, channels).transpose(1, 2)

    def forward(self, x: Tensor) -> Tensor:
        """x: [slots, in_channels, T] -> [slots, out_channels, T * stride]."""
        (stride,) = self.convtr.stride
        taps = self.convtr.weight.permute(0, 2, 1)  # [in, kernel, out / groups], contiguous
        inputs = x.transpose(1, 2)  # [slots, T, in]
        partial = self.partial.transpose(1, 2)  # [slots, stride, out], rows of channels
        bias = self.convtr.bias
        if self.overlap_kernel and self.channels_last:
            # imported here: triton is absent from CPU-only installs, which never take this path
            from kernels import seanet_overlap

            if self.convtr.groups == 1:
                out = seanet_overlap.overlap_add(_taps(inputs, taps, stride), partial, bias)
            else:  # channel-wise: the product in the same launch
                out = seanet_overlap.channelwise_overlap_add(inputs, taps[:, :, 0], partial, bias)
        elif self.convtr.groups == 1:
            out = overlap_add(_taps(inputs, taps, stride), partial, bias)
        else:  # channel-wise
            out = overlap_add(inputs[:, :, None, :] * taps[:, :, 0].t(), partial, bias)
        out = out.transpose(1, 2)  # time-major
        return out if self.channels_last else out.contiguous()


def _taps(inputs: Tensor, taps: Tensor, stride: int) -> Tensor:
    """The transposed convolution's GEMM: inputs [slots, T, in] @ taps [in, kernel, out] ->
    [slots, T, 2 * stride, out]."""
    slots, frames, channels = inputs.shape
    return (inputs @ taps.reshape(channels, -1)).view(slots, frames, 2 * stride, -1)


def overlap_add(taps: Tensor, partial: Tensor, bias: Tensor | None) -> Tensor:
    """A transposed convolution's overlap-add in torch ops: taps [slots, T, 2 * stride, C],
    partial [slots, stride, C] (what the last frame owed this one; replaced by what this
    frame owes the next) -> out [slots, T * stride, C], out[s, t * stride + r] = (owed +
    taps[s, t, r]) + bias, owed = taps[s, t - 1, stride + r] or partial[s, r] at t = 0
    (kernels/seanet_overlap.py does it in one launch, to these ops' bits)."""
    slots, frames, kernel, channels = taps.shape
    stride = kernel // 2
    owed = taps[:, :, stride:]  # [slots, T, stride, C]: the next frame's share
    carried = torch.cat([partial[:, None], owed[:, :-1]], dim=1)
    out = carried.add_(taps[:, :, :stride])
    if bias is not None:
        out.add_(bias)
    partial.copy_(owed[:, -1])
    return out.view(slots, frames * stride, channels)


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
        channels_last: bool,
    ) -> None:
        super().__init__()
        hidden = dim // compress
        self.block = nn.Sequential(
            nn.ELU(),
            StreamingConv1d(
                dim, hidden, kernel, slots, device, dilation=dilation, channels_last=channels_last
            ),
            nn.ELU(),
            StreamingConv1d(hidden, dim, 1, slots, device, channels_last=channels_last),
        )
        # the second ELU, the 1x1 convolution and the skip connection in one launch of
        # kernels/seanet_residual.py, channels-last only; switched by
        # MimiCodec.use_glue_kernels. Read at every call: set it before a graph is captured
        self.residual_kernel = False

    @property
    def _pointwise(self) -> StreamingConv1d:
        pointwise = self.block[3]
        assert isinstance(pointwise, StreamingConv1d)
        return pointwise

    @property
    def fused_end(self) -> bool:
        """Whether the block ends in kernels/seanet_residual.py's one launch, which can also
        run an ELU after the skip (`forward`'s activate_output)."""
        return self.residual_kernel and self._pointwise.channels_last

    def forward(self, x: Tensor, activate_output: bool = False) -> Tensor:
        """`activate_output` (a fused end only): the ELU after the block applied in its last
        launch (SeanetStack hands the block an ELU that follows it)."""
        # block[0], the first ELU, runs inside the first convolution's window
        inner: Tensor = self.block[1](x, activate=True)
        if not self.fused_end:
            assert not activate_output, "the ELU after a block runs inside a fused end only"
            update: Tensor = self._pointwise(self.block[2](inner))
            return x + update
        # imported here: triton is absent from CPU-only installs, which never take this path
        from kernels.seanet_residual import residual_conv

        conv = self._pointwise.conv
        assert conv.bias is not None
        out = residual_conv(
            x.transpose(1, 2), inner.transpose(1, 2), conv.weight[:, :, 0], conv.bias,
            activate_output,
        )  # fmt: skip
        return out.transpose(1, 2)


class SeanetStack(nn.Module):
    """A SEANet encoder or decoder: its layers in order, as `model.{i}`."""

    def __init__(self, layers: list[nn.Module]) -> None:
        super().__init__()
        self.model = nn.Sequential(*layers)
        # (layer, whether it runs the ELU before it): an ELU followed by a convolution is
        # dropped here and the convolution applies it (StreamingConv1d's `activate`)
        self._steps: list[tuple[nn.Module, bool]] = []
        for index, layer in enumerate(layers):
            after_elu = index > 0 and isinstance(layers[index - 1], nn.ELU)
            if isinstance(layer, StreamingConv1d) and after_elu:
                self._steps[-1] = (layer, True)
            else:
                self._steps.append((layer, False))
        # steps that are a residual block with a bare ELU step after it (the decoder's, before
        # each transposed convolution): with the block's fused end the ELU runs in its launch
        self._elu_after = {
            index
            for index, (layer, _) in enumerate(self._steps[:-1])
            if isinstance(layer, ResnetBlock) and isinstance(self._steps[index + 1][0], nn.ELU)
        }

    def forward(self, x: Tensor) -> Tensor:
        """The layers in order; an ELU right before a convolution runs inside it, one right
        after a residual block with a fused end inside that."""
        index = 0
        while index < len(self._steps):
            layer, activate = self._steps[index]
            if index in self._elu_after and isinstance(layer, ResnetBlock) and layer.fused_end:
                x = layer(x, activate_output=True)
                index += 2  # the ELU step ran inside the block
                continue
            x = layer(x, activate=True) if activate else layer(x)
            index += 1
        return x


def seanet_encoder(
    config: MimiConfig, slots: int, device: torch.device, channels_last: bool = False
) -> SeanetStack:
    """Waveform [slots, 1, samples] -> latent [slots, seanet_dim, samples / prod(ratios)]."""
    filters = config.n_filters
    layers: list[nn.Module] = [
        StreamingConv1d(1, filters, config.kernel_size, slots, device, channels_last=channels_last)
    ]
    mult = 1
    for ratio in reversed(config.ratios):
        width = mult * filters
        for j in range(config.n_residual_layers):
            layers.append(
                ResnetBlock(
                    width,
                    config.residual_kernel_size,
                    config.dilation_base**j,
                    config.compress,
                    slots,
                    device,
                    channels_last=channels_last,
                )
            )
        layers.append(nn.ELU())
        layers.append(
            StreamingConv1d(
                width,
                2 * width,
                2 * ratio,
                slots,
                device,
                stride=ratio,
                channels_last=channels_last,
            )
        )
        mult *= 2
    layers.append(nn.ELU())
    layers.append(
        StreamingConv1d(
            mult * filters,
            config.seanet_dim,
            config.last_kernel_size,
            slots,
            device,
            channels_last=channels_last,
        )
    )
    return SeanetStack(layers)


def seanet_decoder(
    config: MimiConfig, slots: int, device: torch.device, channels_last: bool = False
) -> SeanetStack:
    """Latent [slots, seanet_dim, frames] -> waveform [slots, 1, frames * prod(ratios)]."""
    filters = config.n_filters
    mult = 2 ** len(config.ratios)
    layers: list[nn.Module] = [
        StreamingConv1d(
            config.seanet_dim,
            mult * filters,
            config.kernel_size,
            slots,
            device,
            channels_last=channels_last,
        )
    ]
    for ratio in config.ratios:
        width = mult * filters
        layers.append(nn.ELU())
        layers.append(
            StreamingConvTranspose1d(
                width, width // 2, 2 * ratio, ratio, slots, device, channels_last=channels_last
            )
        )
        for j in range(config.n_residual_layers):
            layers.append(
                ResnetBlock(
                    width // 2,
                    config.residual_kernel_size,
                    config.dilation_base**j,
                    config.compress,
                    slots,
                    device,
                    channels_last=channels_last,
                )
            )
        mult //= 2
    layers.append(nn.ELU())
    layers.append(
        StreamingConv1d(
            filters, 1, config.last_kernel_size, slots, device, channels_last=channels_last
        )
    )
    return SeanetStack(layers)
