"""The Mimi codec for all slots, one 80 ms frame per step, kept in fp32 (as Kyutai does).

    encode: pcm float32 [slots, 1920] -> codes int64 [slots, 8]
        SEANet encoder (25 Hz) -> transformer -> strided conv to 12.5 Hz -> split RVQ
    decode: codes int64 [slots, 8] -> pcm float32 [slots, 1920]
        RVQ lookup -> transposed conv to 25 Hz -> transformer -> SEANet decoder

Encoder and decoder state reset separately: a call's decoder starts with its first emitted
frame, one step after its encoder (the LM emits nothing at step 0).

`fused` (default: on CUDA) runs the transformers and the RVQ through the Triton kernels of
kernels/mimi_transformer.py and kernels/mimi_rvq.py, and each SEANet convolution's window
(kept tail, ELU, new tail) through kernels/seanet_window.py; the convolutions stay cuDNN's.
Measured on one H200, each stage its own CUDA graph, every transformer at a full 250-frame
ring (python3 bench/mimi_gpu.py --slots 1,128,300; bench/results/mimi_gpu.json), eager ->
fused, median ms (kernels):

    slots   encode                       decode
    1       1.86 (714) -> 0.89 (197)     1.80 (606) -> 0.86 (180)
    128     4.56 (746) -> 2.93 (229)     4.56 (642) -> 3.00 (216)
    300     8.22 (739) -> 5.87 (222)     8.49 (635) -> 6.17 (209)

(The first fused form, before ring_attention_step's rewrite, whose cost did not depend on
the ring's age: 0.99, 3.58 and 7.52 ms to encode, 0.96, 3.72 and 7.86 to decode.)

The options weighed: hand-written kernels where the launches are (the transformers: ~450 of
the 714 encode kernels; the RVQ: ~100), chosen because they can be checked on CPU in
Triton's interpreter and need no compile step at start-up (the first fused call, Triton's
JIT, took 1.7 s in the first fused form's run; 0.55 s in the committed one, whose attention
sweep had compiled that kernel already). torch.compile (inductor) of encode / decode was
predicted to fuse as many launches and the SEANet glue as well, at a cold compile of tens of
seconds per slot count at start-up; it was not measured (the device time for this work,
180 s, did not allow it).
Left, by the profile at 300 slots: the attention kernel (1.7 ms of 5.9, see its module), the
SEANet state copies, cuDNN layout conversions and ELUs (~1.5 ms), and the fp32 SIMT GEMMs.
"""

import torch
from torch import Tensor, nn

from engine.models.moshi.config import MimiConfig
from engine.models.moshi.mimi.quantizer import SplitQuantizer
from engine.models.moshi.mimi.seanet import (
    ResnetBlock,
    StatePool,
    StreamingConv1d,
    StreamingConvTranspose1d,
    seanet_decoder,
    seanet_encoder,
    streaming_parts,
)
from engine.models.moshi.mimi.transformer import MimiTransformer


class MimiCodec(nn.Module):
    def __init__(
        self,
        config: MimiConfig,
        slots: int,
        device: torch.device,
        fused: bool | None = None,
        channels_last: bool | None = None,
    ) -> None:
        """`fused` and `channels_last` (the SEANet layout, see seanet.py): None is on CUDA."""
        super().__init__()
        fused = device.type == "cuda" if fused is None else fused
        channels_last = device.type == "cuda" if channels_last is None else channels_last
        self.config = config
        self.encoder = seanet_encoder(config, slots, device, channels_last)
        self.decoder = seanet_decoder(config, slots, device, channels_last)

        def transformer() -> MimiTransformer:
            return MimiTransformer(
                dim=config.seanet_dim,
                num_heads=config.transformer_heads,
                num_layers=config.transformer_layers,
                ffn=config.transformer_ffn,
                context=config.transformer_context,
                max_period=config.max_period,
                slots=slots,
                device=device,
                fused=fused,
            )

        self.encoder_transformer = transformer()
        self.decoder_transformer = transformer()
        stride = config.encoder_steps_per_frame
        dim = config.seanet_dim
        self.downsample = StreamingConv1d(
            dim,
            dim,
            2 * stride,
            slots,
            device,
            stride=stride,
            bias=False,
            replicate=True,
            channels_last=channels_last,
        )
        # channel-wise (groups = dim), as the released Mimi was trained
        self.upsample = StreamingConvTranspose1d(
            dim,
            dim,
            2 * stride,
            stride,
            slots,
            device,
            groups=dim,
            bias=False,
            channels_last=channels_last,
        )
        self.quantizer = SplitQuantizer(
            config.codebooks, config.bins, config.quantizer_dim, dim, device, fused
        )
        for module in self.modules():
            if isinstance(module, StreamingConv1d) and not fused:
                module.window_kernel = False  # the eager codec: torch's ops throughout
        # the modules with per-slot state, walked once here rather than on every step
        self._encoder_state = StatePool(
            streaming_parts(self.encoder, self.encoder_transformer, self.downsample),
            slots,
            device,
        )
        self._decoder_state = StatePool(
            streaming_parts(self.upsample, self.decoder_transformer, self.decoder), slots, device
        )

    def use_glue_kernels(self, on: bool) -> None:
        """The launches around the convolutions and transformers that torch's ops take
        several for, each as one Triton launch, or not: a transposed convolution's
        overlap-add (kernels/seanet_overlap.py), a residual block's ELU + 1x1 convolution +
        skip (kernels/seanet_residual.py) and a transformer step's RoPE tables with its
        positions moved on (kernels/mimi_rope.py); channels-last codecs only. Off in a
        codec built alone; the engine turns them on on CUDA (ModelOptions.mimi_glue_kernels,
        off with --no-mimi-glue-kernels). Set it before a graph is captured."""
        for module in self.modules():
            if isinstance(module, StreamingConvTranspose1d):
                module.overlap_kernel = on
            elif isinstance(module, ResnetBlock):
                module.residual_kernel = on
            elif isinstance(module, MimiTransformer):
                module.rope_kernel = on

    def reset_encoder(self, mask: Tensor) -> None:
        """mask: bool [slots]; those slots' encoder state starts over."""
        self._encoder_state.reset(mask)

    def reset_decoder(self, mask: Tensor) -> None:
        """mask: bool [slots]; those slots' decoder state starts over."""
        self._decoder_state.reset(mask)

    def encode(self, pcm: Tensor) -> Tensor:
        latent = self.encoder_transformer(self.encoder(pcm[:, None, :]))
        return self.quantizer.encode(self.downsample(latent))[:, :, 0]

    def decode(self, codes: Tensor) -> Tensor:
        latent = self.upsample(self.quantizer.decode(codes[:, :, None]))
        pcm: Tensor = self.decoder(self.decoder_transformer(latent))
        return pcm[:, 0, :]
