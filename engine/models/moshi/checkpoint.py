"""Load Kyutai / NVIDIA safetensors checkpoints by their own tensor names.

Every Cadence tensor names where it comes from in the checkpoint, with alternatives for the
layouts in circulation: per-step projections split (`in_projs.{s}.weight`, moshi >= 0.2) or
fused (`in_proj_weight`, the released files), Mimi codebooks as `embedding_sum` /
`cluster_usage` (or their older names), convolutions behind Kyutai's wrapper modules
(`conv.conv.weight`). Anything missing, unexpected or of the wrong shape is reported at
once, each problem naming the checkpoint tensor and both shapes, as a `CheckpointError`.

Tensors known to be unused are skipped without complaint: depformer steps past the 8 model
codebooks (PersonaPlex's user-prediction steps) and Mimi codebooks past the 8 used.
"""

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from engine.models.moshi.config import LmConfig, MimiConfig

CODEBOOK_EPS = 1e-5  # Kyutai's EuclideanCodebook epsilon for cluster_usage
MAX_LISTED = 12  # problems listed in one error message


class CheckpointError(ValueError):
    """A checkpoint file is missing, unreadable, or does not fit the configured model."""


Shape = tuple[int, ...]


@dataclass(frozen=True)
class Source:
    """One way to read a Cadence tensor: checkpoint keys, their allowed shapes, a combiner."""

    keys: tuple[str, ...]
    shapes: tuple[frozenset[Shape], ...]
    build: Callable[[list[Tensor]], Tensor]


def _one(key: str, shape: Shape) -> Source:
    return Source((key,), (frozenset({shape}),), lambda ts: ts[0])


def _stacked(keys: list[str], shape: Shape) -> Source:
    return Source(tuple(keys), tuple(frozenset({shape}) for _ in keys), torch.stack)


def _fused(key: str, steps: int, row_counts: Iterable[int], shape: Shape) -> Source:
    """A per-step weight stored as one [stored_steps * rows, cols] tensor; keep `steps`."""
    rows, cols = shape
    allowed = frozenset((count * rows, cols) for count in row_counts)
    return Source((key,), (allowed,), lambda ts: ts[0].view(-1, rows, cols)[:steps])


def _projections(ours: str, theirs: str, shape: Shape) -> dict[str, list[Source]]:
    """Single-step attention projections, split or fused in the checkpoint."""
    return {
        f"{ours}.in_proj.weight": [
            _one(f"{theirs}.in_projs.0.weight", (3 * shape[0], shape[1])),
            _one(f"{theirs}.in_proj_weight", (3 * shape[0], shape[1])),
            _one(f"{theirs}.in_proj.weight", (3 * shape[0], shape[1])),
        ],
        f"{ours}.out_proj.weight": [
            _one(f"{theirs}.out_projs.0.weight", shape),
            _one(f"{theirs}.out_proj.weight", shape),
        ],
    }


def lm_sources(config: LmConfig) -> dict[str, list[Source]]:
    """Where each parameter of `MoshiLm` comes from in an LM checkpoint."""
    dim, dep, steps = config.dim, config.depformer_dim, config.audio_codebooks
    sources: dict[str, list[Source]] = {
        "emb": [_stacked([f"emb.{k}.weight" for k in range(2 * steps)], (config.card + 1, dim))],
        "text_emb": [_one("text_emb.weight", (config.text_card + 1, dim))],
        "text_linear.weight": [_one("text_linear.weight", (config.text_card, dim))],
        "out_norm.alpha": [_one("out_norm.alpha", (1, 1, dim))],
        "depformer.depformer_in": [
            _stacked([f"depformer_in.{s}.weight" for s in range(steps)], (dep, dim))
        ],
        "depformer.depformer_text_emb": [
            _one("depformer_text_emb.weight", (config.text_card + 1, dep))
        ],
        "depformer.depformer_emb": [
            _stacked(
                [f"depformer_emb.{s}.weight" for s in range(steps - 1)], (config.card + 1, dep)
            )
        ],
        "depformer.linears": [
            _stacked([f"linears.{s}.weight" for s in range(steps)], (config.card, dep))
        ],
    }
    for i in range(config.num_layers):
        p = f"transformer.layers.{i}"
        sources[f"{p}.norm1.alpha"] = [_one(f"{p}.norm1.alpha", (1, 1, dim))]
        sources[f"{p}.norm2.alpha"] = [_one(f"{p}.norm2.alpha", (1, 1, dim))]
        sources.update(_projections(f"{p}.self_attn", f"{p}.self_attn", (dim, dim)))
        sources[f"{p}.gating.linear_in.weight"] = [
            _one(f"{p}.gating.linear_in.weight", (2 * config.ffn_hidden, dim))
        ]
        sources[f"{p}.gating.linear_out.weight"] = [
            _one(f"{p}.gating.linear_out.weight", (dim, config.ffn_hidden))
        ]
    stored_steps = (steps, config.dep_q)
    hidden = config.depformer_ffn_hidden
    for i in range(config.depformer_num_layers):
        p = f"depformer.layers.{i}"
        sources[f"{p}.norm1.alpha"] = [_one(f"{p}.norm1.alpha", (1, 1, dep))]
        sources[f"{p}.norm2.alpha"] = [_one(f"{p}.norm2.alpha", (1, 1, dep))]
        per_step = {
            "self_attn.in_proj": ("self_attn.in_projs.{s}.weight", (3 * dep, dep)),
            "self_attn.out_proj": ("self_attn.out_projs.{s}.weight", (dep, dep)),
            "gating.linear_in": ("gating.{s}.linear_in.weight", (2 * hidden, dep)),
            "gating.linear_out": ("gating.{s}.linear_out.weight", (dep, hidden)),
        }
        for ours, (pattern, shape) in per_step.items():
            keys = [f"{p}.{pattern.format(s=s)}" for s in range(steps)]
            sources[f"{p}.{ours}"] = [_stacked(keys, shape)]
        sources[f"{p}.self_attn.in_proj"].append(
            _fused(f"{p}.self_attn.in_proj_weight", steps, stored_steps, (3 * dep, dep))
        )
        sources[f"{p}.self_attn.out_proj"].append(
            _fused(f"{p}.self_attn.out_proj.weight", steps, stored_steps, (dep, dep))
        )
    return sources


_LM_STEP_KEY = re.compile(
    r"^(?:depformer_in\.(\d+)\.|linears\.(\d+)\.|depformer_emb\.(\d+)\."
    r"|depformer\.layers\.\d+\.(?:self_attn\.(?:in|out)_projs\.(\d+)\.|gating\.(\d+)\.))"
)


def lm_unused(config: LmConfig) -> Callable[[str], bool]:
    """Checkpoint keys of depformer steps Cadence never runs (PersonaPlex's 8..15)."""

    def unused(key: str) -> bool:
        match = _LM_STEP_KEY.match(key)
        if match is None:
            return False
        emb_index = match.group(3)
        if emb_index is not None:
            return int(emb_index) >= config.audio_codebooks - 1
        index = next(g for g in match.groups() if g is not None)
        return int(index) >= config.audio_codebooks

    return unused


def _codebooks(prefix: str, layers: range, shape: Shape) -> list[Source]:
    """Codebook vectors = embedding_sum / cluster_usage, stacked [layers, bins, dim]."""
    sources = []
    for total, usage in (("embedding_sum", "cluster_usage"), ("embed_avg", "cluster_size")):
        keys: list[str] = []
        for i in layers:
            keys += [f"{prefix}.vq.layers.{i}._codebook.{total}"]
            keys += [f"{prefix}.vq.layers.{i}._codebook.{usage}"]
        shapes = tuple(frozenset({shape if j % 2 == 0 else shape[:1]}) for j in range(len(keys)))

        def build(ts: list[Tensor]) -> Tensor:
            pairs = zip(ts[0::2], ts[1::2], strict=True)
            return torch.stack([s / u.clamp(min=CODEBOOK_EPS)[:, None] for s, u in pairs])

        sources.append(Source(tuple(keys), shapes, build))
    return sources


def mimi_sources(mimi: nn.Module, config: MimiConfig) -> dict[str, list[Source]]:
    """Where each parameter of the Mimi codec comes from in a Mimi checkpoint."""
    sources: dict[str, list[Source]] = {}
    codebook_shape = (config.bins, config.quantizer_dim)
    for name, param in mimi.named_parameters():
        shape = tuple(param.shape)
        if name == "quantizer.rvq_first.codebooks":
            sources[name] = _codebooks("quantizer.rvq_first", range(1), codebook_shape)
        elif name == "quantizer.rvq_rest.codebooks":
            rest = range(config.codebooks - 1)
            sources[name] = _codebooks("quantizer.rvq_rest", rest, codebook_shape)
        elif name.endswith(("self_attn.in_proj.weight", "self_attn.out_proj.weight")):
            continue  # added below, per attention
        elif name == "downsample.conv.weight":
            sources[name] = [_one("downsample.conv.conv.conv.weight", shape)]
        elif name == "upsample.convtr.weight":
            sources[name] = [_one("upsample.convtr.convtr.convtr.weight", shape)]
        elif re.match(r"^(encoder|decoder)\.model\.", name):
            theirs = re.sub(r"\.(conv|convtr)\.(weight|bias)$", r".\1.\1.\2", name)
            sources[name] = [_one(theirs, shape)]
        elif re.match(r"^(encoder|decoder)_transformer\.", name):
            theirs = name.replace("_transformer.", "_transformer.transformer.", 1)
            sources[name] = [_one(theirs, shape)]
            if re.search(r"\.norm[12]\.weight$", name):
                # some exports store LayerNorm gains as `alpha` [1, 1, dim]
                alpha = theirs.removesuffix("weight") + "alpha"
                sources[name].append(
                    Source((alpha,), (frozenset({(1, 1, *shape)}),), lambda ts: ts[0].reshape(-1))
                )
        else:
            sources[name] = [_one(name, shape)]
    for side in ("encoder", "decoder"):
        for i in range(config.transformer_layers):
            ours = f"{side}_transformer.layers.{i}.self_attn"
            theirs = f"{side}_transformer.transformer.layers.{i}.self_attn"
            sources.update(_projections(ours, theirs, (config.seanet_dim, config.seanet_dim)))
    return sources


_MIMI_LAYER_KEY = re.compile(r"^quantizer\.rvq_rest\.vq\.layers\.(\d+)\.")


def mimi_unused(config: MimiConfig) -> Callable[[str], bool]:
    """Codebooks past the used ones, and the training-only `_initialized` flags."""

    def unused(key: str) -> bool:
        if key.endswith(("._initialized", ".inited")):
            return True
        match = _MIMI_LAYER_KEY.match(key)
        return match is not None and int(match.group(1)) >= config.codebooks - 1

    return unused


def _shape(shape: Iterable[int]) -> str:
    return "[" + ", ".join(str(n) for n in shape) + "]"


def load_into(
    module: nn.Module,
    state: Mapping[str, Tensor],
    sources: Mapping[str, list[Source]],
    unused: Callable[[str], bool],
    what: str,
) -> None:
    """Copy `state` into the parameters of `module` (casting to their dtype) or raise
    `CheckpointError` listing every problem."""
    problems: list[str] = []
    consumed: set[str] = set()
    values: dict[str, Tensor] = {}
    for name, param in module.named_parameters():
        alternatives = sources[name]
        present = [s for s in alternatives if all(k in state for k in s.keys)]
        if not present:
            first = alternatives[0]
            absent = next(k for k in first.keys if k not in state)
            problems.append(
                f"missing tensor {absent} (expected shape {_shape(next(iter(first.shapes[0])))})"
            )
            continue
        source = present[0]
        consumed.update(source.keys)
        bad = False
        for key, allowed in zip(source.keys, source.shapes, strict=True):
            got = tuple(state[key].shape)
            if got not in allowed:
                wanted = " or ".join(_shape(s) for s in sorted(allowed))
                problems.append(f"tensor {key} has shape {_shape(got)}, expected {wanted}")
                bad = True
        stored = [state[k] for k in source.keys] if not bad else []
        if any(not t.is_floating_point() for t in stored) and param.is_floating_point():
            kinds = ", ".join(f"{k} ({state[k].dtype})" for k in source.keys)
            problems.append(f"tensors {kinds} are not floating point, the weights they load are")
            bad = True
        if not bad:
            values[name] = source.build(stored)
            if values[name].shape != param.shape:
                problems.append(
                    f"tensors {', '.join(source.keys)} give shape {_shape(values[name].shape)}, "
                    f"expected {_shape(param.shape)}"
                )
    # a key of an alternative layout that lost to another present one is still known
    known = {k for alternatives in sources.values() for s in alternatives for k in s.keys}
    for key in sorted(state):
        if key not in consumed and key not in known and not unused(key):
            problems.append(f"unexpected tensor {key} (shape {_shape(state[key].shape)})")
    _raise_any(problems, what)
    with torch.no_grad():
        for name, param in module.named_parameters():
            param.copy_(values[name].to(dtype=param.dtype, device=param.device))


def check_shapes(path: Path, sources: Mapping[str, list[Source]]) -> None:
    """Before the model is built: every tensor of the file that a source would read has a
    shape the configuration allows, from the file's header alone. A checkpoint of another
    size fails here in one line, not after the configured model has been allocated."""
    from safetensors import SafetensorError, safe_open

    if not path.is_file():
        raise CheckpointError(f"checkpoint file not found: {path}")
    try:
        with safe_open(str(path), framework="pt") as file:
            shapes = {key: tuple(file.get_slice(key).get_shape()) for key in list(file.keys())}
    except (SafetensorError, OSError, ValueError) as error:
        raise CheckpointError(f"cannot read {path}: {error}") from error
    problems: list[str] = []
    for alternatives in sources.values():
        source = next((s for s in alternatives if all(k in shapes for k in s.keys)), None)
        for key, allowed in zip(source.keys, source.shapes, strict=True) if source else ():
            if shapes[key] not in allowed:
                wanted = " or ".join(_shape(s) for s in sorted(allowed))
                problems.append(f"tensor {key} has shape {_shape(shapes[key])}, expected {wanted}")
    sizes = "another model size? --config or the checkpoint's config.json sets it"
    _raise_any(problems, f"{path}: {len(problems)} tensors do not fit the configured LM ({sizes})")


def _raise_any(problems: list[str], what: str) -> None:
    if problems:
        listed = problems[:MAX_LISTED]
        more = f" (and {len(problems) - MAX_LISTED} more)" if len(problems) > MAX_LISTED else ""
        raise CheckpointError(f"{what}: " + "; ".join(listed) + more)


def read_safetensors(path: Path) -> dict[str, Tensor]:
    """All tensors of a safetensors file on the CPU; CheckpointError if absent or unreadable."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not path.is_file():
        raise CheckpointError(f"checkpoint file not found: {path}")
    try:
        return load_file(str(path), device="cpu")
    except (SafetensorError, OSError, ValueError) as error:
        raise CheckpointError(f"cannot read {path}: {error}") from error
