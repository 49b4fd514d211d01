"""Kyutai's `moshi` package as the reference: seeded random models, checkpoints, pipelines.

Imported only by tests that have already `pytest.importorskip`-ed torch and moshi. The
reference is built exactly as its loaders build it (`get_moshi_lm`, `get_mimi` with no
file), weights fixed by `torch.manual_seed`, then saved as safetensors checkpoints that
Cadence loads through its own loader — so every comparison also tests the key mapping.
"""

import copy
import json
import os
from pathlib import Path
from typing import Any

os.environ.setdefault("NO_TORCH_COMPILE", "1")

import torch
from moshi.models import loaders
from moshi.models.compression import MimiModel
from moshi.models.lm import LMGen, LMModel
from safetensors.torch import save_file

from engine.models.moshi.config import MimiConfig
from engine.models.moshi.files import LM_NAME, MIMI_NAME

DEVICE = torch.device("cpu")


def lm_kwargs(**overrides: Any) -> dict[str, Any]:
    """A small Kyutai LM config: the 7B's kwargs with small dimensions, then `overrides`."""
    kwargs = dict(loaders._lm_kwargs)
    kwargs.update(
        dim=64,
        num_heads=4,
        num_layers=2,
        depformer_dim=32,
        depformer_num_heads=2,
        depformer_num_layers=2,
        depformer_dim_feedforward=int(4.125 * 32),
        text_card=64,
        card=64,
        context=24,
    )
    kwargs.update(overrides)
    return kwargs


def mimi_kwargs(config: MimiConfig) -> dict[str, Any]:
    """Kyutai's `_mimi_config` with the shapes of one of ours."""
    kwargs: dict[str, Any] = copy.deepcopy(loaders._mimi_config)
    kwargs["seanet"].update(
        n_filters=config.n_filters, dimension=config.seanet_dim, ratios=list(config.ratios)
    )
    kwargs["quantizer"].update(
        dimension=config.quantizer_dim,
        bins=config.bins,
        n_q=config.total_codebooks,
        input_dimension=config.seanet_dim,
        output_dimension=config.seanet_dim,
    )
    kwargs["transformer"].update(
        d_model=config.seanet_dim,
        num_heads=config.transformer_heads,
        num_layers=config.transformer_layers,
        dim_feedforward=config.transformer_ffn,
        context=config.transformer_context,
        input_dimension=config.seanet_dim,
        output_dimensions=[config.seanet_dim],
    )
    return kwargs


def build_lm(kwargs: dict[str, Any], seed: int, dtype: torch.dtype = torch.float32) -> LMModel:
    torch.manual_seed(seed)
    return loaders.get_moshi_lm(None, lm_kwargs=kwargs, device=DEVICE, dtype=dtype)


def build_mimi(config: MimiConfig, seed: int) -> MimiModel:
    """A random Mimi whose codebooks are usable: at random init they are all zeros (every
    code would be 0), so fill them at the scale of the latents."""
    torch.manual_seed(seed)
    mimi = loaders.get_mimi(None, mimi_config=mimi_kwargs(config), device=DEVICE)
    quantizer: Any = mimi.quantizer
    for half in (quantizer.rvq_first, quantizer.rvq_rest):
        for layer in half.vq.layers:
            codebook = layer._codebook
            codebook.embedding_sum.normal_(std=0.02)
            codebook.cluster_usage.fill_(1.0)
            codebook._embedding = None
    return mimi


def save_checkpoint(directory: Path, lm: LMModel, mimi: MimiModel, kwargs: dict[str, Any]) -> None:
    """Write the reference's weights in the layout of a Kyutai checkpoint repository."""
    directory.mkdir(parents=True, exist_ok=True)
    lm_state = {k: v.contiguous() for k, v in lm.state_dict().items()}
    save_file(lm_state, str(directory / LM_NAME))
    mimi_state = {k: v.contiguous() for k, v in mimi.state_dict().items()}
    save_file(mimi_state, str(directory / MIMI_NAME))
    (directory / "config.json").write_text(json.dumps(kwargs))


def run_reference(
    lm: LMModel, mimi: MimiModel, pcm: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One call through Kyutai's streaming pipeline, greedy: pcm float32 [samples] ->
    tokens int64 [frames, 9] (-1 before the first emission), pcm float32 [frames, 1920]."""
    frame = 1920
    gen = LMGen(lm, use_sampling=False, support_out_of_sync=True)
    tokens, audio = [], []
    with torch.no_grad(), gen.streaming(1), mimi.streaming(1):
        for start in range(0, pcm.shape[0], frame):
            codes = mimi.encode(pcm[None, None, start : start + frame])
            out = gen.step(codes)
            assert out is not None
            if bool((out < 0).any()):
                tokens.append(torch.full((out.shape[1],), -1, dtype=torch.long))
                audio.append(torch.zeros(frame))
            else:
                tokens.append(out[0, :, 0])
                audio.append(mimi.decode(out[:, 1:9])[0, 0])
    return torch.stack(tokens), torch.stack(audio)
