"""The per-layer kernels (RMSNorm + residual, SiLU gate, depformer step attention) against
their torch references, and the layers that use them against their torch paths.

On a machine without CUDA the kernels run in Triton's interpreter (small shapes); on a GPU
they are compiled. Without triton the module is skipped.
"""

import os

import pytest

pytest.importorskip("torch")

import torch

pytest.importorskip("triton", reason="triton is not installed (CPU torch does not bring it)")

from engine.models.moshi.attention import ring_mask
from engine.models.moshi.depformer import FEW_ROWS, Depformer
from engine.models.moshi.model import randomize
from engine.models.moshi.sampling import Sampling
from engine.models.moshi.transformer import FEW_ROWS as TEMPORAL_FEW_ROWS
from engine.models.moshi.transformer import TemporalLayer, TemporalTransformer
from kernels import fused_linear
from kernels.attended_linear import MAX_ROWS as ATTENDED_ROWS
from kernels.attended_linear import attended_linear, attended_linear_reference
from kernels.fused_linear import MAX_ROWS, Tiles
from kernels.gated_silu import gated_silu, gated_silu_reference
from kernels.rms_norm import add_rms_norm, rms_norm, rms_norm_reference
from kernels.step_attention import step_attention, step_attention_reference

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
EPS = 1e-8
# Triton's interpreter (3.9) truncates fp32 -> bf16 instead of rounding to nearest, so there
# about half of the bf16 outputs sit 1 ulp below torch's; compiled, they must nearly all agree
BF16_TRUNCATED = os.environ.get("TRITON_INTERPRET") == "1"


def _randn(*shape: int, dtype: torch.dtype, seed: int, scale: float = 1.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=generator) * scale).to(DEVICE, dtype)


def _assert_ulps(got: torch.Tensor, want: torch.Tensor, ulps: int = 1) -> None:
    """fp32: within a few ulp relative; 16-bit: bit patterns at most `ulps` apart and nearly
    all equal (truncated, interpreted bf16: one ulp more, and any number may differ)."""
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    if got.dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=4e-7, atol=1e-6)
        return
    bits_got = got.contiguous().view(torch.int16).int()
    bits_want = want.contiguous().view(torch.int16).int()
    distance = (bits_got - bits_want).abs()
    apart = int(distance.max())
    if got.dtype == torch.bfloat16 and BF16_TRUNCATED:
        assert apart <= ulps + 1, f"{apart} ulp apart"
        return
    assert apart <= ulps, f"{apart} ulp apart"
    assert float((distance > 0).float().mean()) <= 0.02, "more than 2% of values differ"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 1, 64), (2, 5, 96), (1, 1, 1024)])
def test_rms_norm_matches_reference(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    x = _randn(*shape, dtype=dtype, seed=1, scale=3.0)
    alpha = _randn(1, 1, shape[-1], dtype=dtype, seed=2)
    _assert_ulps(rms_norm(x, alpha, EPS), rms_norm_reference(x, alpha, EPS))


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm_sums_in_the_model_dtype_then_norms(dtype: torch.dtype) -> None:
    x = _randn(4, 1, 160, dtype=dtype, seed=3, scale=2.0)
    residual = _randn(4, 1, 160, dtype=dtype, seed=4)
    alpha = _randn(160, dtype=dtype, seed=5)
    total, normed = add_rms_norm(x, residual, alpha, EPS)
    if dtype == torch.bfloat16 and BF16_TRUNCATED:
        _assert_ulps(total, x + residual)
    else:
        assert torch.equal(total, x + residual)
    _assert_ulps(normed, rms_norm_reference(total, alpha, EPS))


def test_rms_norm_reads_a_column_slice_of_wider_rows() -> None:
    wide = _randn(3, 1, 4 * 64, dtype=torch.float32, seed=6)
    residual = _randn(3, 1, 64, dtype=torch.float32, seed=7)
    alpha = _randn(64, dtype=torch.float32, seed=8)
    x = wide[..., 128:192]  # row stride 256: the depformer's slice of all steps' projections
    total, normed = add_rms_norm(x, residual, alpha, EPS)
    assert torch.equal(total, x + residual)
    _assert_ulps(normed, rms_norm_reference(x + residual, alpha, EPS))
    with pytest.raises(AssertionError, match="unit-stride"):
        rms_norm(wide[..., ::4], alpha, EPS)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 1, 2 * 40), (2, 2 * 1100), (1, 1, 2 * 2816)])
def test_gated_silu_matches_reference(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    h = _randn(*shape, dtype=dtype, seed=9, scale=4.0)
    # fp16 on an H200: 2 ulp apart (Triton's exp and fp32 division are approximations, and
    # silu's output is rounded before the product, as torch does)
    _assert_ulps(gated_silu(h), gated_silu_reference(h), ulps=2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("slots", "heads", "steps", "head_dim"), [(3, 2, 8, 16), (2, 4, 5, 64)])
def test_step_attention_over_a_frame_matches_reference(
    slots: int, heads: int, steps: int, head_dim: int, dtype: torch.dtype
) -> None:
    shape = (slots, heads, steps, head_dim)
    # stale entries from a previous frame: the kernel must not read entries past `step`
    keys = _randn(*shape, dtype=dtype, seed=10, scale=50.0)
    values = _randn(*shape, dtype=dtype, seed=11, scale=50.0)
    want_keys, want_values = keys.clone(), values.clone()
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    for step in range(steps):
        qkv = _randn(slots, 3 * heads * head_dim, dtype=dtype, seed=20 + step, scale=2.0)
        got = step_attention(qkv, keys, values, step)
        want = step_attention_reference(qkv, want_keys, want_values, step)
        assert torch.equal(keys, want_keys), f"step {step}: key scratch"
        assert torch.equal(values, want_values), f"step {step}: value scratch"
        torch.testing.assert_close(got, want, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("rows", "heads", "steps", "head_dim", "n"), [(1, 2, 8, 16, 44), (2, 4, 5, 16, 64)]
)
def test_attended_linear_over_a_frame_matches_reference(
    rows: int, heads: int, steps: int, head_dim: int, n: int, dtype: torch.dtype
) -> None:
    """Attention + out projection + residual in one launch, every step of a frame: the same
    scratch writes as the reference, outputs within the roundings' reach (a rounded attention
    may sit an ulp off, and the product then differs by up to that ulp times the weights)."""
    shape = (rows + 1, heads, steps, head_dim)  # a scratch wider than the batch
    keys = _randn(*shape, dtype=dtype, seed=30, scale=50.0)  # stale: never read past `step`
    values = _randn(*shape, dtype=dtype, seed=31, scale=50.0)
    want_keys, want_values = keys.clone(), values.clone()
    dim = heads * head_dim
    weight = _randn(n, dim, dtype=dtype, seed=32, scale=dim**-0.5)
    tolerance = 1e-5 if dtype == torch.float32 else 3e-2
    for step in range(steps):
        qkv = _randn(rows, 3 * dim, dtype=dtype, seed=40 + step, scale=2.0)
        residual = _randn(rows, n, dtype=dtype, seed=50 + step)
        got = attended_linear(qkv, keys, values, step, weight, residual)
        want = attended_linear_reference(
            qkv, want_keys[:rows], want_values[:rows], step, weight, residual
        )
        assert torch.equal(keys, want_keys), f"step {step}: key scratch"
        assert torch.equal(values, want_values), f"step {step}: value scratch"
        torch.testing.assert_close(got, want, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("dtype", DTYPES)
def test_attended_linear_rounds_the_attention_before_the_product(dtype: torch.dtype) -> None:
    """With out_proj = 3 I and no residual, the output is step_attention's (rounded) result
    times 3, rounded again: a kernel that skipped either rounding would differ."""
    rows, heads, steps, head_dim = 2, 2, 4, 16
    dim = heads * head_dim
    keys = _randn(rows, heads, steps, head_dim, dtype=dtype, seed=60, scale=3.0)
    values = _randn(rows, heads, steps, head_dim, dtype=dtype, seed=61, scale=3.0)
    want_keys, want_values = keys.clone(), values.clone()
    weight = (3 * torch.eye(dim, device=DEVICE)).to(dtype)
    zeros = torch.zeros(rows, dim, device=DEVICE, dtype=dtype)
    for step in range(steps):
        qkv = _randn(rows, 3 * dim, dtype=dtype, seed=62 + step, scale=2.0)
        got = attended_linear(qkv, keys, values, step, weight, zeros)
        want = (step_attention(qkv, want_keys, want_values, step).float() * 3).to(dtype)
        if dtype == torch.float32:
            # no rounding to check; the two kernels' softmax sums differ in order (compiled
            # on an H200: 4.8e-6 apart at ~9, a few fp32 ulp)
            torch.testing.assert_close(got, want, rtol=2e-6, atol=1e-5)
        else:
            _assert_ulps(got, want)


def test_attended_linear_refuses_more_rows_than_it_holds() -> None:
    rows = ATTENDED_ROWS + 1
    scratch = torch.zeros(rows, 2, 4, 16, device=DEVICE)
    with pytest.raises(AssertionError, match="rows"):
        attended_linear(
            torch.zeros(rows, 96, device=DEVICE),
            scratch,
            scratch.clone(),
            0,
            torch.zeros(8, 32, device=DEVICE),
            torch.zeros(rows, 8, device=DEVICE),
        )


def test_temporal_layer_fused_matches_torch_path() -> None:
    slots, dim, heads, context = 3, 64, 4, 16
    layer = TemporalLayer(dim, heads, 176, 1e4, DEVICE, torch.float32)
    randomize(layer, 12)
    with torch.no_grad():
        for norm in (layer.norm1, layer.norm2):
            norm.alpha.copy_(_randn(1, 1, dim, dtype=torch.float32, seed=13))
    keys = torch.zeros(slots, heads, context, dim // heads, device=DEVICE)
    values = torch.zeros_like(keys)
    start = torch.tensor([0, 5, 40], device=DEVICE)
    mask = ring_mask(start, 1, context, context)
    x = _randn(slots, 1, dim, dtype=torch.float32, seed=14)
    outputs = []
    with torch.no_grad():
        for fused in (False, True):
            layer.fused = fused
            outputs.append(layer(x, start, keys.clone(), values.clone(), mask))
    torch.testing.assert_close(outputs[1], outputs[0], rtol=1e-5, atol=1e-5)


def _one_slot_transformer(
    dim: int, layers: int, few_rows: int, decode: bool, fused: bool
) -> TemporalTransformer:
    """A small fp32 temporal transformer for one slot, random weights (seed 17)."""
    transformer = TemporalTransformer(
        dim=dim,
        num_heads=4,
        num_layers=layers,
        ffn_hidden=176,
        max_period=1e4,
        context=8,
        slots=1,
        device=DEVICE,
        dtype=torch.float32,
        decode_kernel=decode,
    )
    randomize(transformer, 17)
    transformer.few_rows = few_rows
    for module in transformer.modules():
        if isinstance(module, TemporalLayer):
            module.fused = fused
    return transformer


@pytest.mark.parametrize(
    "tiles",
    [None, Tiles(block_n=16, block_k=32, dot=True, programs_per_sm=2, swap=True, splits=2)],
    ids=["default_tiles", "swapped_split"],
)
def test_temporal_few_rows_path_matches_the_torch_path(
    tiles: Tiles | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if tiles is not None:  # the tiles the 7B shapes take, at a size the interpreter runs
        monkeypatch.setattr(fused_linear, "default_tiles", lambda *_: tiles)
    slots, dim, frames = 1, 64, 3
    outputs = []
    for few_rows, decode in ((0, False), (slots, True)):
        # the few-rows path is made of the fused kernels
        transformer = _one_slot_transformer(dim, 2, few_rows, decode, fused=decode)
        with torch.no_grad():
            for module in transformer.modules():
                if isinstance(module, TemporalLayer):
                    for norm in (module.norm1, module.norm2):
                        norm.alpha.copy_(_randn(1, 1, dim, dtype=torch.float32, seed=18))
            steps = [_randn(slots, 1, dim, dtype=torch.float32, seed=19 + f) for f in range(frames)]
            outputs.append(torch.stack([transformer.step(x) for x in steps]))
    torch.testing.assert_close(outputs[1], outputs[0], rtol=1e-5, atol=1e-5)


def test_temporal_few_rows_path_only_with_the_fused_kernels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`fused` False keeps torch's ops everywhere (benches compare against it)."""

    def refused(*_: object) -> torch.Tensor:
        raise AssertionError("the few-rows path ran with fused False")

    monkeypatch.setattr(TemporalLayer, "_few_rows", refused)
    transformer = _one_slot_transformer(64, 1, 1, decode=True, fused=False)
    with torch.no_grad():
        assert transformer.step(_randn(1, 1, 64, dtype=torch.float32, seed=21)).shape == (1, 1, 64)


def test_few_rows_default_fits_one_fused_linear_program() -> None:
    # both FEW_ROWS must stay within the kernel's rows, or its launcher refuses the batch
    assert 1 <= FEW_ROWS <= MAX_ROWS, (FEW_ROWS, MAX_ROWS)
    assert 1 <= TEMPORAL_FEW_ROWS <= MAX_ROWS, (TEMPORAL_FEW_ROWS, MAX_ROWS)


@pytest.mark.parametrize(
    ("slots", "few_rows"),
    [(4, 0), (ATTENDED_ROWS, FEW_ROWS), (ATTENDED_ROWS + 2, FEW_ROWS)],
    ids=["per_op_kernels", "few_rows_attended", "few_rows_attention_apart"],
)
def test_depformer_fused_gives_the_torch_path_tokens(slots: int, few_rows: int) -> None:
    """The few-rows kernels with the attention inside the out projection (attended_linear's
    rows) and a launch apart (more rows)."""
    steps = 4
    # the few-rows case must take that path: all slots within the threshold
    assert few_rows == 0 or slots <= few_rows, (slots, few_rows)
    depformer = Depformer(
        steps=steps,
        dim=64,
        dep_dim=32,
        num_heads=2,
        num_layers=2,
        hidden=88,
        text_card=64,
        card=64,
        slots=slots,
        device=DEVICE,
        dtype=torch.float32,
    )
    randomize(depformer, 15)
    depformer.few_rows = few_rows
    greedy = Sampling(greedy=True, temperature=1.0, top_k=1)
    tokens = []
    with torch.no_grad():
        for fused in (False, True):
            depformer.fused = fused
            for frame in range(2):  # the second frame overwrites the first one's scratch
                hidden = _randn(slots, 1, 64, dtype=torch.float32, seed=16 + frame)
                text = torch.arange(slots, device=DEVICE) * (frame + 1)
                tokens.append(depformer(hidden, text, greedy, None))
    assert torch.equal(torch.stack(tokens[2:]), torch.stack(tokens[:2]))
