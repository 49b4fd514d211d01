"""Shapes of a Moshi-architecture model: the LM (temporal + depth transformers) and Mimi.

One frozen `MoshiConfig` per process, validated when built. Named configs:

- `moshiko` (alias `7b`): Kyutai moshiko/moshika 7B, dep_q 8.
- `personaplex`: NVIDIA PersonaPlex 7B, the same LM with 16 depformer steps (the last 8
  predict the user's codebooks; Cadence skips them, they never change an emitted token).
- `tiny`: small dimensions for tests and CPU runs.

A config file (JSON or TOML) overrides fields of a named base:
`{"base": "tiny", "lm": {"num_layers": 3}, "mimi": {"transformer_layers": 1}}`.
A Kyutai `config.json` (the LM kwargs of a Hugging Face checkpoint repo) is read by
`from_kyutai_lm_kwargs`.
"""

import dataclasses
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MOSHI_DELAYS = (0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1)
DEFAULT_CONTEXT_FRAMES = 1500  # 2 minutes at 12.5 Hz


def _check_sizes(config: object, may_be_zero: tuple[str, ...]) -> None:
    """Every count, width and period of a config positive (zero where named): a zero there
    would fail deep in the model's build, or build a model of nothing."""
    for item in dataclasses.fields(config):  # type: ignore[arg-type]
        value = getattr(config, item.name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if value < 0 or (value == 0 and item.name not in may_be_zero):
            raise ValueError(f"{item.name} must be positive, got {value}")


@dataclass(frozen=True)
class LmConfig:
    """The multistream LM: one text stream, `audio_codebooks` model codebooks, as many user ones."""

    text_card: int = 32000  # text vocabulary; id text_card is the initial token
    card: int = 2048  # audio codebook size; id card is the initial token
    audio_codebooks: int = 8  # per speaker
    dep_q: int = 8  # depformer steps in the checkpoint (8 Moshi, 16 PersonaPlex)
    dim: int = 4096
    num_heads: int = 32
    num_layers: int = 32
    ffn_hidden: int = 11264  # SiLU-gated FFN inner width (linear_in is 2x this)
    max_period: float = 10000.0  # RoPE period
    context: int = DEFAULT_CONTEXT_FRAMES  # KV ring length per slot, frames
    depformer_dim: int = 1024
    depformer_num_heads: int = 16
    depformer_num_layers: int = 6
    depformer_ffn_hidden: int = 2816
    delays: tuple[int, ...] = MOSHI_DELAYS
    text_padding_id: int = 3

    def __post_init__(self) -> None:
        _check_sizes(self, may_be_zero=("text_padding_id",))
        if self.text_padding_id >= self.text_card:
            raise ValueError(f"text_padding_id must be below text_card ({self.text_card})")
        if len(self.delays) != 1 + 2 * self.audio_codebooks:
            raise ValueError(
                f"expected {1 + 2 * self.audio_codebooks} delays, got {len(self.delays)}"
            )
        if self.dep_q not in (self.audio_codebooks, 2 * self.audio_codebooks):
            raise ValueError(f"dep_q must be {self.audio_codebooks} or twice that")
        if self.dim % self.num_heads or self.depformer_dim % self.depformer_num_heads:
            raise ValueError("model widths must divide by their head counts")
        if (self.dim // self.num_heads) % 2:
            raise ValueError("RoPE needs an even head dimension")
        if min(self.delays) < 0:  # the context, a count, is checked positive above
            raise ValueError("delays must be >= 0")

    @property
    def num_streams(self) -> int:
        """Token streams per frame: text + model audio + user audio (17 for Moshi)."""
        return len(self.delays)

    @property
    def max_delay(self) -> int:
        return max(self.delays)


@dataclass(frozen=True)
class MimiConfig:
    """Mimi codec: SEANet conv encoder/decoder, transformers, split RVQ."""

    sample_rate: int = 24000
    frame_samples: int = 1920  # 80 ms at 24 kHz
    seanet_dim: int = 512  # latent channels
    n_filters: int = 64
    ratios: tuple[int, ...] = (8, 6, 5, 4)  # decoder order; the encoder runs them reversed
    kernel_size: int = 7
    last_kernel_size: int = 3
    residual_kernel_size: int = 3
    dilation_base: int = 2
    n_residual_layers: int = 1
    compress: int = 2
    transformer_heads: int = 8
    transformer_layers: int = 8
    transformer_ffn: int = 2048
    transformer_context: int = 250  # encoder frames (25 Hz)
    max_period: float = 10000.0
    quantizer_dim: int = 256
    bins: int = 2048
    total_codebooks: int = 32  # stored in the checkpoint
    codebooks: int = 8  # used

    def __post_init__(self) -> None:
        _check_sizes(self, may_be_zero=("n_residual_layers",))
        if not self.ratios or min(self.ratios) < 1:
            raise ValueError("ratios must be one or more positive strides")
        if self.frame_samples % self.hop_samples:
            raise ValueError("a frame must hold a whole number of encoder hops")
        if self.encoder_steps_per_frame < 1:
            raise ValueError("the encoder hop is longer than a frame")
        if not 1 < self.codebooks <= self.total_codebooks:
            raise ValueError("codebooks must be in 2..total_codebooks")
        if self.seanet_dim % self.transformer_heads:
            raise ValueError("seanet_dim must divide by transformer_heads")

    @property
    def hop_samples(self) -> int:
        """Samples per encoder frame (960 at 25 Hz)."""
        hop = 1
        for ratio in self.ratios:
            hop *= ratio
        return hop

    @property
    def encoder_steps_per_frame(self) -> int:
        """Encoder frames per model frame; also the latent down/upsampling stride (2)."""
        return self.frame_samples // self.hop_samples


@dataclass(frozen=True)
class MoshiConfig:
    name: str
    lm: LmConfig = field(default_factory=LmConfig)
    mimi: MimiConfig = field(default_factory=MimiConfig)

    def __post_init__(self) -> None:
        if self.lm.card != self.mimi.bins:
            raise ValueError(f"LM card {self.lm.card} != Mimi bins {self.mimi.bins}")
        if self.lm.audio_codebooks != self.mimi.codebooks:
            raise ValueError("LM audio codebooks must equal Mimi's used codebooks")


def moshiko() -> MoshiConfig:
    return MoshiConfig(name="moshiko")


def personaplex() -> MoshiConfig:
    return MoshiConfig(name="personaplex", lm=LmConfig(dep_q=16))


def tiny() -> MoshiConfig:
    lm = LmConfig(
        text_card=64,
        card=64,
        dim=64,
        num_heads=4,
        num_layers=2,
        ffn_hidden=176,
        context=64,
        depformer_dim=32,
        depformer_num_heads=2,
        depformer_num_layers=2,
        depformer_ffn_hidden=88,
    )
    mimi = MimiConfig(
        seanet_dim=16,
        n_filters=4,
        transformer_heads=2,
        transformer_layers=2,
        transformer_ffn=32,
        quantizer_dim=8,
        bins=64,
        total_codebooks=10,
    )
    return MoshiConfig(name="tiny", lm=lm, mimi=mimi)


NAMED_CONFIGS = {"moshiko": moshiko, "7b": moshiko, "personaplex": personaplex, "tiny": tiny}


def _replace(obj: Any, overrides: object, where: str) -> Any:
    if not isinstance(overrides, dict):
        raise ValueError(f"config key {where!r} must hold an object, got {overrides!r}")
    known = {f.name for f in dataclasses.fields(obj)}
    unknown = set(overrides) - known
    if unknown:
        raise ValueError(f"unknown {where} config keys: {sorted(unknown)}")
    values = {k: _typed(v, getattr(obj, k), f"{where}.{k}") for k, v in overrides.items()}
    return dataclasses.replace(obj, **values)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # JSON's true is no count


def _typed(value: object, current: object, key: str) -> object:
    """An override as the type of the value it replaces (a JSON list as a tuple of ints)."""
    if isinstance(current, tuple):
        if isinstance(value, list) and all(_is_int(v) for v in value):
            return tuple(value)
        raise ValueError(f"{key} must be a list of integers, got {value!r}")
    if isinstance(current, float) and (_is_int(value) or isinstance(value, float)):
        return float(value)  # type: ignore[arg-type]
    if isinstance(current, int) and _is_int(value):
        return value
    if isinstance(current, str) and isinstance(value, str):
        return value
    raise ValueError(f"{key} must be {type(current).__name__}, got {value!r}")


def config_from_dict(data: dict[str, Any]) -> MoshiConfig:
    """Build a config from `{"base": NAME, "name": ..., "lm": {...}, "mimi": {...}}`."""
    unknown = set(data) - {"base", "name", "lm", "mimi"}
    if unknown:
        raise ValueError(f"unknown config keys: {sorted(unknown)}")
    base_name = data.get("base", "moshiko")
    if not isinstance(base_name, str) or base_name not in NAMED_CONFIGS:
        raise ValueError(f"unknown base config {base_name!r}")
    base = NAMED_CONFIGS[base_name]()
    return MoshiConfig(
        name=str(data.get("name", base.name)),
        lm=_replace(base.lm, data.get("lm", {}), "lm"),
        mimi=_replace(base.mimi, data.get("mimi", {}), "mimi"),
    )


def load_config(spec: str) -> MoshiConfig:
    """A named config (`tiny`, `7b`, `moshiko`, `personaplex`) or a .json/.toml file."""
    if spec in NAMED_CONFIGS:
        return NAMED_CONFIGS[spec]()
    path = Path(spec)
    if not path.is_file():
        raise ValueError(f"config {spec!r} is neither a named config nor a file")
    suffix = path.suffix.lower()
    if suffix not in (".json", ".toml"):
        raise ValueError(f"config file {path}: a .json or .toml file, not {path.suffix or 'none'}")
    text = path.read_text()
    try:
        data = tomllib.loads(text) if suffix == ".toml" else json.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as error:
        raise ValueError(f"config file {path}: {error}") from None
    if not isinstance(data, dict):
        raise ValueError(f"config file {path} must hold an object")
    try:
        return config_from_dict(data)
    except ValueError as error:
        raise ValueError(f"config file {path}: {error}") from None


def gated_hidden(dim: int, dim_feedforward: int) -> int:
    """Kyutai's SiLU-gated FFN width for a given `dim_feedforward` (their `ActivationGating`)."""
    if dim_feedforward == 4 * dim:
        return (21 * dim) // 8
    return (2 * dim_feedforward) // 3


def _context(lm_kwargs: dict[str, Any], base: MoshiConfig, context: int | None) -> int:
    """Explicit, else the shorter of the configured ring and the checkpoint's own context."""
    if context is not None:
        return context
    trained = lm_kwargs.get("context")
    return base.lm.context if trained is None else min(int(trained), base.lm.context)


def from_kyutai_lm_kwargs(
    lm_kwargs: dict[str, Any], base: MoshiConfig, context: int | None = None
) -> MoshiConfig:
    """Read the LM part of a Kyutai config (`moshi.models.loaders._lm_kwargs` layout)."""
    required = {
        "gating": "silu",
        "norm": "rms_norm_f32",
        "positional_embedding": "rope",
        "depformer_pos_emb": "none",
        "depformer_multi_linear": True,
        "depformer_weights_per_step": True,
    }
    for key, value in required.items():
        if lm_kwargs.get(key, value) != value:
            raise ValueError(f"unsupported LM config: {key}={lm_kwargs[key]!r}, need {value!r}")
    if lm_kwargs.get("depformer_weights_per_step_schedule") is not None:
        raise ValueError("unsupported LM config: depformer_weights_per_step_schedule")
    dim = int(lm_kwargs["dim"])
    dep_dim = int(lm_kwargs["depformer_dim"])
    dep_ff = lm_kwargs.get("depformer_dim_feedforward")
    n_q = int(lm_kwargs["n_q"])
    lm = dataclasses.replace(
        base.lm,
        text_card=int(lm_kwargs["text_card"]),
        card=int(lm_kwargs["card"]),
        audio_codebooks=n_q // 2,
        dep_q=int(lm_kwargs["dep_q"]),
        dim=dim,
        num_heads=int(lm_kwargs["num_heads"]),
        num_layers=int(lm_kwargs["num_layers"]),
        ffn_hidden=gated_hidden(dim, int(float(lm_kwargs["hidden_scale"]) * dim)),
        max_period=float(lm_kwargs.get("max_period", 10000)),
        context=_context(lm_kwargs, base, context),
        depformer_dim=dep_dim,
        depformer_num_heads=int(lm_kwargs["depformer_num_heads"]),
        depformer_num_layers=int(lm_kwargs["depformer_num_layers"]),
        depformer_ffn_hidden=gated_hidden(
            dep_dim,
            int(dep_ff) if dep_ff is not None else int(float(lm_kwargs["hidden_scale"]) * dep_dim),
        ),
        delays=tuple(int(d) for d in lm_kwargs["delays"]),
        text_padding_id=int(lm_kwargs.get("existing_text_padding_id", 3)),
    )
    return dataclasses.replace(base, lm=lm)
