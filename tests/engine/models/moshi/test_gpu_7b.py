"""The full 7B shapes on a GPU (random weights), through bench/moshi_conformance_7b.py."""

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("torch")
pytest.importorskip("moshi")

import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

FRAMES = 20
SEED = 1234


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    path = Path(__file__).resolve().parents[4] / "bench" / "moshi_conformance_7b.py"
    spec = importlib.util.spec_from_file_location("moshi_conformance_7b", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # pure fp32 on both sides, as the bench's own main runs it: with TF32 convolutions (cuDNN's
    # default) any rounding difference upstream (Cadence's fused Mimi transformer) comes out of
    # the SEANet decoder as TF32-sized noise, ~1e-3 relative (tests/kernels/test_mimi_codec.py)
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    yield module
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def test_7b_greedy_fp32_tokens_are_identical(bench: ModuleType) -> None:
    result = bench.check_tokens(FRAMES, SEED, torch.device("cuda"))
    assert result["equal"], result


def test_7b_bf16_teacher_forced_logits_within_tolerance(bench: ModuleType) -> None:
    result = bench.check_logits(FRAMES, SEED, torch.device("cuda"))
    # bf16 logits: 4 units in the last place at the largest logit, 1/2 unit on average
    assert result["max_abs_error_rel"] <= 3e-2, result
    assert result["mean_abs_error_rel"] <= 4e-3, result


def test_7b_mimi_codes_identical_and_audio_close(bench: ModuleType) -> None:
    result = bench.check_mimi(FRAMES, SEED, torch.device("cuda"))
    assert result["codes_equal"], result
    assert result["distinct_frames"] >= FRAMES // 2, result
    assert result["audio_rel_error"] <= 1e-4, result
