"""Sampling, configs and prompt frames: the parts with no reference counterpart to run."""

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("torch")

import torch

from engine.models.moshi.config import load_config
from engine.models.moshi.prompt import (
    SILENCE_CODES,
    SINE_CODES,
    personaplex_frames,
    system_tagged,
)
from engine.models.moshi.sampling import Sampling, sample


def test_top_k_sampling_stays_in_the_top_k_and_follows_the_distribution() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(20000, 1)
    generator = torch.Generator().manual_seed(0)
    tokens = sample(logits, Sampling(greedy=False, temperature=1.0, top_k=3), generator)
    counts = torch.bincount(tokens, minlength=4).float() / tokens.shape[0]
    assert counts[3] == 0
    expected = torch.tensor([0.5, 0.3, 0.15]) / 0.95
    assert torch.allclose(counts[:3], expected, atol=0.015)


def test_top_1_and_greedy_agree_and_seeds_reproduce() -> None:
    logits = torch.randn(64, 100, generator=torch.Generator().manual_seed(1))
    greedy = sample(logits, Sampling(greedy=True, temperature=1.0, top_k=1), None)
    top_1 = sample(logits, Sampling(greedy=False, temperature=0.7, top_k=1), None)
    assert torch.equal(greedy, logits.argmax(dim=-1))
    assert torch.equal(top_1, greedy)
    how = Sampling(greedy=False, temperature=0.8, top_k=50)
    first = sample(logits, how, torch.Generator().manual_seed(7))
    again = sample(logits, how, torch.Generator().manual_seed(7))
    assert torch.equal(first, again)
    assert not torch.equal(first, greedy)


def test_named_and_file_configs(tmp_path: Path) -> None:
    assert load_config("7b").lm.dim == 4096
    assert load_config("7b").lm.context == 1500
    assert load_config("personaplex").lm.dep_q == 16
    toml = tmp_path / "c.toml"
    toml.write_text(
        'base = "tiny"\n[lm]\nnum_layers = 3\ndelays = [0, 0, 1, 1, 1, 1, 1, 1, 1, '
        "0, 1, 1, 1, 1, 1, 1, 1]\n"
    )
    assert load_config(str(toml)).lm.num_layers == 3
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"base": "tiny", "lm": {"layers": 3}}))
    with pytest.raises(ValueError, match=r"unknown lm config keys: \['layers'\]"):
        load_config(str(bad))
    with pytest.raises(ValueError, match="dep_q must be"):
        load_config(str(_write(tmp_path / "d.json", {"base": "tiny", "lm": {"dep_q": 5}})))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"base": "tiny", "lm": {"num_layers": "3"}}, "lm.num_layers must be int, got '3'"),
        ({"base": "tiny", "lm": {"num_layers": 2.5}}, "lm.num_layers must be int"),
        ({"base": "tiny", "lm": {"dim": None}}, "lm.dim must be int, got None"),
        ({"base": "tiny", "lm": 5}, "config key 'lm' must hold an object"),
        ({"base": "tiny", "lm": {"delays": 5}}, "lm.delays must be a list of integers"),
        ({"base": ["tiny"]}, "unknown base config"),
        ({"base": "tiny", "lm": {"num_heads": 0}}, "num_heads must be positive"),
        ({"base": "tiny", "lm": {"num_layers": 0}}, "num_layers must be positive"),
        ({"base": "tiny", "lm": {"max_period": -1}}, "max_period must be positive"),
        ({"base": "tiny", "lm": {"text_padding_id": 999}}, "text_padding_id must be below"),
        ({"base": "tiny", "mimi": {"ratios": []}}, "ratios must be one or more"),
    ],
)
def test_a_bad_config_file_is_one_line_naming_the_file_and_key(
    tmp_path: Path, data: object, message: str
) -> None:
    """They raised TypeError, ZeroDivisionError or IndexError deep in the build (a traceback),
    or built a model of nothing (zero layers) that ran."""
    path = _write(tmp_path / "c.json", data)
    with pytest.raises(ValueError, match=re.escape(message)) as refused:
        load_config(str(path))
    assert str(refused.value).startswith(f"config file {path}: ")


def test_a_config_file_of_another_format_is_named_as_such(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("base: tiny\n")
    with pytest.raises(ValueError, match=r"c\.yaml: a \.json or \.toml file, not \.yaml"):
        load_config(str(path))
    broken = tmp_path / "c.JSON"
    broken.write_text("{")
    with pytest.raises(ValueError, match=r"c\.JSON: Expecting"):
        load_config(str(broken))


def _write(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data))
    return path


def test_personaplex_prompt_frames_layout() -> None:
    voice = torch.arange(16).view(2, 8)
    frames = personaplex_frames(voice, [101, 102, 103], text_padding_id=3, silence_frames=2)
    assert frames.shape == (2 + 2 + 3 + 2, 17)
    assert frames[:, 0].tolist() == [3, 3, 3, 3, 101, 102, 103, 3, 3]
    assert torch.equal(frames[:2, 1:9], voice)
    assert all(row[1:9].tolist() == list(SILENCE_CODES) for row in frames[2:])
    assert all(row[9:].tolist() == list(SINE_CODES) for row in frames)


def test_the_role_text_goes_in_between_system_tags_as_in_training() -> None:
    assert system_tagged("  You are Jane. ") == "<system> You are Jane. <system>"
    assert system_tagged("<system> You are Jane. <system>") == "<system> You are Jane. <system>"
    assert system_tagged("<system>") == "<system> <system> <system>", "one tag is no pair"


def test_the_model_encodes_the_tagged_role_text() -> None:
    from engine.models import ModelOptions, build_model
    from engine.models.moshi.model import MoshiModel

    class Recording:
        def __init__(self) -> None:
            self.texts: list[str] = []

        def encode(self, text: str) -> list[int]:
            self.texts.append(text)
            return [5, 6]

    model = build_model("moshi", 1, ModelOptions(random_weights=0, config="tiny"))
    assert isinstance(model, MoshiModel)
    tokenizer = Recording()
    model.tokenizer = tokenizer  # type: ignore[assignment]
    model.set_personaplex_prompt(None, "You are Jane.")
    assert tokenizer.texts == ["<system> You are Jane. <system>"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("on", [False, True])
def test_the_engine_options_switch_the_fused_kernels(on: bool) -> None:
    """--no-mimi-glue-kernels reaches the codec, --no-rope-in-attention the temporal
    attention (ModelOptions -> build_model)."""
    from engine.models import ModelOptions, build_model
    from engine.models.moshi.attention import RingAttention
    from engine.models.moshi.mimi.transformer import MimiTransformer
    from engine.models.moshi.model import MoshiModel

    options = ModelOptions(
        config="tiny",
        random_weights=0,
        device="cuda",
        mimi_glue_kernels=on,
        rope_in_attention=on,
    )
    model = build_model("moshi", 1, options)
    assert isinstance(model, MoshiModel)
    transformers = [m for m in model.mimi.modules() if isinstance(m, MimiTransformer)]
    assert transformers
    assert all(t.rope_kernel is on for t in transformers)
    attentions = [m for m in model.lm.transformer.modules() if isinstance(m, RingAttention)]
    assert attentions
    assert all(a.append_in_attention is on for a in attentions)


def test_the_fused_kernels_stay_off_on_a_cpu() -> None:
    """The Triton kernels on by default (ModelOptions) are left off where there is no CUDA:
    a CPU install has no triton."""
    from engine.models import ModelOptions, build_model
    from engine.models.moshi.attention import RingAttention
    from engine.models.moshi.mimi.seanet import ResnetBlock, StreamingConvTranspose1d
    from engine.models.moshi.mimi.transformer import MimiTransformer
    from engine.models.moshi.model import MoshiModel

    options = ModelOptions(config="tiny", random_weights=0)
    assert options.mimi_glue_kernels
    assert options.rope_in_attention
    model = build_model("moshi", 1, options)
    assert isinstance(model, MoshiModel)
    switches = [
        *(m.rope_kernel for m in model.mimi.modules() if isinstance(m, MimiTransformer)),
        *(
            m.overlap_kernel
            for m in model.mimi.modules()
            if isinstance(m, StreamingConvTranspose1d)
        ),
        *(m.residual_kernel for m in model.mimi.modules() if isinstance(m, ResnetBlock)),
        *(m.append_in_attention for m in model.lm.modules() if isinstance(m, RingAttention)),
    ]
    assert switches
    assert not any(switches)
