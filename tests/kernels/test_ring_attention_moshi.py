"""Moshi with the ring kernels gives the torch path's greedy tokens (fp32; fp8 rings too).

The LM test runs anywhere triton imports (Triton's interpreter on CPU); the whole-model test
needs CUDA: it captures the kernel inside the graph executor's CUDA graph and compares it with
the eager torch path while calls join, leave and their rings wrap.
"""

import dataclasses
from collections.abc import Iterator

import numpy as np
import pytest

pytest.importorskip("torch")

import torch

pytest.importorskip("triton", reason="triton is not installed (CPU torch does not bring it)")

from engine.executors.eager import EagerExecutor
from engine.executors.graph import GraphExecutor
from engine.models.moshi.attention import KV_FP8
from engine.models.moshi.config import load_config
from engine.models.moshi.lm import MoshiLm
from engine.models.moshi.model import MoshiModel, build_moshi, randomize
from engine.models.moshi.sampling import Sampling

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
GREEDY = Sampling(greedy=True, temperature=1.0, top_k=1)
SLOTS = 3
# the whole model keeps the tiny config's 64-frame ring: 90 steps wrap it, and slots restart
# mid-run with stale entries in their rings
STEPS = 90
RESETS = {0: [0, 1, 2], 30: [1], 75: [2]}
# the LM alone runs in Triton's interpreter on CPU (~0.1 s a launch): an 8-frame ring
LM_CONTEXT = 8
LM_STEPS = 14
LM_RESETS = {0: [0, 1, 2], 4: [1], 11: [2]}


def _lm(decode_kernel: bool, append_in_attention: bool = False) -> MoshiLm:
    config = dataclasses.replace(load_config("tiny").lm, context=LM_CONTEXT)
    assert config.context < LM_STEPS  # slot 0 wraps its ring
    lm = MoshiLm(config, SLOTS, DEVICE, torch.float32, GREEDY, GREEDY, None)
    randomize(lm, 3)
    lm.transformer.decode_kernel = decode_kernel
    lm.transformer.append_in_attention(append_in_attention)
    return lm


def _frames(lm: MoshiLm, user: torch.Tensor) -> torch.Tensor:
    frames = []
    for t in range(user.shape[0]):
        reset = torch.zeros(SLOTS, dtype=torch.bool, device=DEVICE)
        reset[LM_RESETS.get(t, [])] = True
        frame, _ = lm.step(user[t], reset)
        frames.append(frame)
    return torch.stack(frames)


def test_lm_greedy_tokens_identical_with_kernel() -> None:
    """The kernels (RoPE + append, decode attention) against the torch ops, fp32 rings. (fp8
    rings are not compared so: the kernel's fp16 dots round otherwise than the torch path's
    fp32 SDPA, and a tiny random model's greedy tokens flip on such differences.)"""
    generator = torch.Generator().manual_seed(0)
    user = torch.randint(0, 64, (LM_STEPS, SLOTS, 8), generator=generator).to(DEVICE)
    with torch.no_grad():
        want = _frames(_lm(decode_kernel=False), user)
        got = _frames(_lm(decode_kernel=True), user)
    assert len(torch.unique(want)) > 8  # the tokens carry information
    assert torch.equal(got, want)


def test_lm_with_the_append_in_the_attention_gives_the_two_launches_frames(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """RingAttention.append_in_attention (kernels/rope_attention.py, one launch a layer)
    against kv_append + ring_attention: the same frames while slots reset and rings wrap,
    every layer's step through the one launch."""
    import kernels.rope_attention

    launches: list[int] = []
    fused = kernels.rope_attention.rope_ring_attention

    def counted(*args: object) -> torch.Tensor:
        launches.append(1)
        return fused(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(kernels.rope_attention, "rope_ring_attention", counted)
    generator = torch.Generator().manual_seed(1)
    user = torch.randint(0, 64, (LM_STEPS, SLOTS, 8), generator=generator).to(DEVICE)
    with torch.no_grad():
        want = _frames(_lm(decode_kernel=True), user)
        assert not launches
        lm = _lm(decode_kernel=True, append_in_attention=True)
        got = _frames(lm, user)
    assert len(launches) == LM_STEPS * lm.config.num_layers
    assert torch.equal(got, want)


def _model(decode_kernel: bool, kv_dtype: torch.dtype | None = None) -> MoshiModel:
    model = build_moshi(
        load_config("tiny"),
        SLOTS,
        DEVICE,
        torch.float32,
        random_weights_seed=5,
        greedy=True,
        kv_dtype=kv_dtype,
    )
    model.lm.transformer.decode_kernel = decode_kernel
    return model


@pytest.fixture
def fp32_gemms() -> Iterator[None]:
    """TF32 off while the test builds, captures and runs its models; then as it was."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = before


def _replays_match_steps(eager: EagerExecutor, graph: GraphExecutor, seed: int) -> None:
    """The graph's replays give the eager steps' greedy tokens and audio while calls join,
    leave and their rings wrap."""
    rng = np.random.default_rng(seed)
    active = np.ones(SLOTS, np.bool_)
    tokens = []
    for step in range(STEPS):
        reset = np.zeros(SLOTS, np.bool_)
        reset[RESETS.get(step, [])] = True
        pcm = (rng.standard_normal((SLOTS, 1920)) * 0.1).astype(np.float32)
        want = eager.run(pcm, reset, active)
        got = graph.run(pcm, reset, active)
        np.testing.assert_array_equal(got.tokens, want.tokens, err_msg=f"step {step}")
        np.testing.assert_allclose(got.pcm, want.pcm, atol=1e-5, err_msg=f"step {step}")
        tokens.append(got.tokens)
    assert len(np.unique(np.stack(tokens))) > 8


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_graph_with_kernel_matches_eager_torch_path(fp32_gemms: None) -> None:
    eager = EagerExecutor(_model(decode_kernel=False))
    graph = GraphExecutor(_model(decode_kernel=True))
    _replays_match_steps(eager, graph, seed=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_graph_matches_eager_with_fp8_rings(fp32_gemms: None) -> None:
    """fp8 rings served: graph and eager both through the kernels."""
    eager = EagerExecutor(_model(decode_kernel=True, kv_dtype=KV_FP8))
    graph = GraphExecutor(_model(decode_kernel=True, kv_dtype=KV_FP8))
    _replays_match_steps(eager, graph, seed=1)


def test_fp8_prefill_matches_stepping() -> None:
    """A prompt's prefill (T frames of one slot through SDPA over the dequantized fp8 ring)
    gives what stepping the same frames one by one gives (torch path both)."""
    config = dataclasses.replace(load_config("tiny").lm, context=LM_CONTEXT)
    generator = torch.Generator().manual_seed(4)
    frames = torch.randn(1, LM_CONTEXT - 2, config.dim, generator=generator).to(DEVICE)
    outputs = []
    for prefill in (True, False):
        lm = MoshiLm(config, SLOTS, DEVICE, torch.float32, GREEDY, GREEDY, None, KV_FP8)
        randomize(lm, 3)
        transformer = lm.transformer
        transformer.decode_kernel = False
        with torch.no_grad():
            if prefill:
                outputs.append(transformer.prefill(frames, slot=1)[0])
                continue
            steps = []
            for t in range(frames.shape[1]):
                batch = torch.zeros(SLOTS, 1, config.dim, device=DEVICE)
                batch[1] = frames[0, t]
                steps.append(transformer.step(batch)[1, 0])
            outputs.append(torch.stack(steps))
    assert transformer.key_scale is not None
    assert (transformer.key_scale[:, 1, :, : frames.shape[1]] != 1).all()  # scales written
    torch.testing.assert_close(outputs[0], outputs[1], rtol=1e-4, atol=1e-4)


def test_fp8_temporal_steps_through_the_kernels_match_the_torch_ops() -> None:
    """fp8 rings served: the temporal transformer's steps through the kernels (RoPE + append
    with quantization, decode attention in fp16 dots with the scales after them) give the
    torch path's outputs (quantize_kv, SDPA over the dequantized ring) to the fp16 dots'
    rounding, and write the same scales (to a bf16 unit), while calls of every age wrap their rings.

    In Triton's interpreter the kernel's scales are truncated to bf16 (one ulp under torch's
    now and then) and an e4m3 rounding that carries into the next binade loses the carry (an
    entry at half its value, see test_kv_append.py): 3.4e-2 relative error seen there, against
    ~1e2 with the value scales left out, so the bound below tells a wrong ring from rounding."""
    config = dataclasses.replace(load_config("tiny").lm, context=LM_CONTEXT)
    outputs, scales = [], []
    for decode_kernel in (False, True):
        lm = MoshiLm(config, SLOTS, DEVICE, torch.float32, GREEDY, GREEDY, None, KV_FP8)
        randomize(lm, 3)
        transformer = lm.transformer
        transformer.decode_kernel = decode_kernel
        # a fresh call, a young one, one long past its first wrap
        transformer.positions.copy_(torch.tensor([0, 3, 5 * LM_CONTEXT + 2], device=DEVICE))
        generator = torch.Generator().manual_seed(6)
        steps = []
        with torch.no_grad():
            for _ in range(LM_STEPS):
                x = torch.randn(SLOTS, 1, config.dim, generator=generator).to(DEVICE)
                steps.append(transformer.step(x))
        assert transformer.key_scale is not None
        assert transformer.value_scale is not None
        outputs.append(torch.stack(steps))
        # the first layer's: its inputs are the same in both paths (later layers' are not)
        scales.append(torch.stack([transformer.key_scale[0], transformer.value_scale[0]]).float())
    torch_ops, kernels = outputs
    error = float((kernels - torch_ops).norm() / torch_ops.norm())
    assert 0 < error <= 6e-2, error  # never 0: the fp16 dots round otherwise than SDPA
    torch.testing.assert_close(scales[1], scales[0], rtol=1e-2, atol=0)
