"""The one-launch depth transformer (kernels/depformer_program.py) against Depformer.forward.

On a machine without CUDA the program runs in Triton's interpreter, which runs a grid's
programs one after another: a barrier with more than one program would wait forever, so
there the launcher runs a grid of ONE program, for which every barrier opens at once. These
CPU tests check the whole program's numerics (fp32, a small shape with widths that are not
powers of two where the kernel masks) against the torch ops, but not the barrier between
programs, nor bf16. The `gpu` tests run the real grid (one program per multiprocessor) at
Moshi 7B depformer shapes in bf16 against the served few-rows kernels: sums over k run in
another order, so a token may differ only where two logits nearly tie, which they check by
feeding the program's tokens back to the reference (teacher forcing).

Run on the H200 (Triton 3.6): at this kernel, with strict token equality, the greedy tests
at 1 and 2 rows passed and at 4 one token differed where the served kernels' own logits tie
(gap 0.0000), hence the tie gap; with it every test here passed in the compiled kernel
tests at baa6a49 (335 passed, bench/results/gpu_tests_kernels_baa6a49.log).
"""

from collections.abc import Callable

import pytest

pytest.importorskip("torch")

import torch

pytest.importorskip("triton", reason="triton is not installed (CPU torch does not bring it)")

from torch import Tensor

from engine.models.moshi.config import moshiko
from engine.models.moshi.depformer import Depformer, DepformerLayer
from engine.models.moshi.sampling import Sampling, choose, draw_noise
from kernels.depformer_program import MAX_ROWS, depformer_program, prepare_program

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
GREEDY = Sampling(greedy=True, temperature=1.0, top_k=1)
SPREAD = Sampling(greedy=False, temperature=0.8, top_k=250)  # the audio default
# the largest logit gap, in row stds, at which bf16 summation orders may swap an argmax
TIE_GAP = 0.05
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(DEVICE.type != "cuda", reason="needs a CUDA device")
interpreted = pytest.mark.skipif(DEVICE.type == "cuda", reason="the GPU tests run the real grid")


def _depformer(
    *, dim: int, dep_dim: int, heads: int, layers: int, hidden: int, text_card: int,
    card: int, steps: int, slots: int, dtype: torch.dtype, seed: int,
) -> Depformer:  # fmt: skip
    """Weights ~ N(0, 1/fan_in) (the norms' alphas around 1), drawn on the module's device."""
    depformer = Depformer(
        steps=steps, dim=dim, dep_dim=dep_dim, num_heads=heads, num_layers=layers,
        hidden=hidden, text_card=text_card, card=card, slots=slots, device=DEVICE, dtype=dtype,
    )  # fmt: skip
    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    with torch.no_grad():
        for name, param in depformer.named_parameters():
            noise = torch.randn(param.shape, generator=generator, device=DEVICE)
            if name.endswith("alpha"):
                param.copy_(1.0 + 0.1 * noise)
            else:
                param.copy_(noise * param.shape[-1] ** -0.5)
    depformer.program_rows = 0  # its references run without the program; tests call it
    return depformer.requires_grad_(False)


def _small() -> Depformer:
    """fp32; hidden (96) and steps (3) not powers of two, as the kernel's masks allow."""
    return _depformer(
        dim=64, dep_dim=128, heads=4, layers=2, hidden=96, text_card=50, card=64, steps=3,
        slots=5, dtype=torch.float32, seed=1,
    )  # fmt: skip


def _seven_b(slots: int) -> Depformer:
    lm = moshiko().lm
    return _depformer(
        dim=lm.dim, dep_dim=lm.depformer_dim, heads=lm.depformer_num_heads,
        layers=lm.depformer_num_layers, hidden=lm.depformer_ffn_hidden,
        text_card=lm.text_card, card=lm.card, steps=lm.audio_codebooks, slots=slots,
        dtype=torch.bfloat16, seed=2,
    )  # fmt: skip


def _inputs(depformer: Depformer, batch: int, seed: int) -> tuple[Tensor, Tensor]:
    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    dim = depformer.depformer_in.shape[2]
    text_rows = depformer.depformer_text_emb.shape[0]
    hidden = torch.randn(batch, 1, dim, generator=generator, device=DEVICE)
    text = torch.randint(0, text_rows, (batch,), generator=generator, device=DEVICE)
    return hidden.to(depformer.depformer_in.dtype), text


def _forced(batch: int, steps: int, card: int) -> tuple[Tensor, Tensor]:
    """Every third (slot, codebook) forced to a token that depends on both."""
    index = torch.arange(batch * steps, device=DEVICE).view(batch, steps)
    return (index * 7) % card, index % 3 == 0


def _program(
    depformer: Depformer,
    hidden: Tensor,
    text: Tensor,
    how: Sampling,
    noise: Tensor | None = None,
    forced: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """The program's tokens, its input projection as Depformer.forward's fused path runs it."""
    projected = torch.nn.functional.linear(
        hidden[:, 0], depformer.depformer_in.view(-1, hidden.shape[-1])
    )
    given, mask = forced if forced is not None else (None, None)
    return depformer_program(
        depformer, projected, text, how.greedy, how.temperature, how.top_k, noise, given, mask
    )


def _noise(depformer: Depformer, batch: int, how: Sampling, seed: int) -> Tensor | None:
    """Depformer.forward's draws for a generator seeded with `seed`."""
    shape = (batch, depformer.steps, depformer.linears.shape[1])
    return draw_noise(shape, DEVICE, how, torch.Generator(DEVICE).manual_seed(seed))


def _teacher_logits(depformer: Depformer, hidden: Tensor, text: Tensor, tokens: Tensor) -> Tensor:
    """fp32 [B, steps, card]: the reference's logits when fed `tokens` at every step."""
    seen: list[Tensor] = []
    head: Callable[[Tensor, int, bool], Tensor] = depformer._head

    def record(x: Tensor, step: int, few_rows: bool) -> Tensor:
        logits = head(x, step, few_rows)
        seen.append(logits.float())
        return logits

    depformer._head = record  # type: ignore[method-assign]
    try:
        depformer(hidden, text, GREEDY, None, tokens, torch.ones_like(tokens, dtype=torch.bool))
    finally:
        del depformer._head
    return torch.stack(seen, dim=1)


def _tie_gap(
    depformer: Depformer, hidden: Tensor, text: Tensor, got: Tensor, forced: Tensor | None = None
) -> float:
    """The largest gap, in row stds, between the best teacher-forced logit and the logit of
    the program's token (0 where it chose the reference's argmax), the forced tokens (bool
    [B, steps], chosen by the caller, not by the logits) left out."""
    logits = _teacher_logits(depformer, hidden, text, got)
    chosen = logits.gather(-1, got[..., None])[..., 0]
    gap = (logits.max(dim=-1).values - chosen) / logits.std(dim=-1)
    if forced is not None:
        gap = torch.where(forced, torch.zeros_like(gap), gap)
    return float(gap.max())


@pytest.mark.interpreter
@interpreted
def test_interpreted_program_greedy_and_forced() -> None:
    depformer = _small()
    depformer.fused = False  # the reference: torch's ops
    hidden, text = _inputs(depformer, 3, seed=6)
    want = depformer(hidden, text, GREEDY, None)
    assert torch.equal(_program(depformer, hidden, text, GREEDY), want)
    forced = _forced(3, depformer.steps, 64)
    want = depformer(hidden, text, GREEDY, None, *forced)
    got = _program(depformer, hidden, text, GREEDY, forced=forced)
    assert torch.equal(got, want), (got, want)
    assert torch.equal(got[forced[1]], forced[0][forced[1]])


@pytest.mark.interpreter
@interpreted
def test_interpreted_program_samples_as_forward() -> None:
    depformer = _small()
    depformer.fused = False
    hidden, text = _inputs(depformer, 4, seed=7)
    how = Sampling(greedy=False, temperature=1.2, top_k=5)
    want = depformer(hidden, text, how, torch.Generator(DEVICE).manual_seed(8))
    got = _program(depformer, hidden, text, how, _noise(depformer, 4, how, seed=8))
    assert torch.equal(got, want), (got, want)


def test_prepare_keeps_the_weights_in_place() -> None:
    """Stacking moves the layers' parameters into the stacked tensors, values unchanged."""
    depformer = _small()
    before = {name: param.clone() for name, param in depformer.named_parameters()}
    stacked = prepare_program(depformer)
    for name, param in depformer.named_parameters():
        assert torch.equal(param, before[name]), name
    second = depformer.layers[1]
    assert isinstance(second, DepformerLayer)
    assert second.self_attn.in_proj.data_ptr() == stacked[0][1].data_ptr()
    assert prepare_program(depformer) is stacked  # once: the second call finds them in place


def test_launcher_refuses_too_many_rows() -> None:
    depformer = _depformer(
        dim=64, dep_dim=128, heads=4, layers=1, hidden=96, text_card=50, card=64, steps=2,
        slots=MAX_ROWS + 1, dtype=torch.float32, seed=3,
    )  # fmt: skip
    hidden, text = _inputs(depformer, MAX_ROWS + 1, seed=4)
    with pytest.raises(AssertionError, match="rows"):
        _program(depformer, hidden, text, GREEDY)


@gpu
@needs_cuda
@pytest.mark.parametrize("batch", [1, 2, 4])
def test_seven_b_greedy_tokens(batch: int) -> None:
    depformer = _seven_b(slots=4)
    hidden, text = _inputs(depformer, batch, seed=9)
    got = _program(depformer, hidden, text, GREEDY)
    want = depformer(hidden, text, GREEDY, None)  # the served few-rows kernels
    gap = _tie_gap(depformer, hidden, text, got)
    print(f"batch {batch}: rows equal {bool(torch.equal(got, want))}, largest tie gap {gap:.4f}")
    # seen on the H200 (seeds as here): equal at 1 and 2 rows; at 4 one token apart where
    # the served kernels' own teacher-forced logits tie (gap 0.0000)
    assert gap <= TIE_GAP, gap  # a different token only where the logits nearly tie
    forced = _forced(batch, depformer.steps, 2048)
    got = _program(depformer, hidden, text, GREEDY, forced=forced)
    assert torch.equal(got[forced[1]], forced[0][forced[1]])
    assert _tie_gap(depformer, hidden, text, got, forced[1]) <= TIE_GAP


@gpu
@needs_cuda
def test_seven_b_sampling_against_the_same_noise() -> None:
    depformer = _seven_b(slots=4)
    hidden, text = _inputs(depformer, 4, seed=11)
    agree = []
    for seed in range(8):
        noise = _noise(depformer, 4, SPREAD, seed)
        assert noise is not None
        got = _program(depformer, hidden, text, SPREAD, noise)
        logits = _teacher_logits(depformer, hidden, text, got)
        want = torch.stack(
            [choose(logits[:, s], SPREAD, noise[:, s]) for s in range(depformer.steps)], dim=1
        )
        agree.append(float((got == want).float().mean()))
    print(f"sampled tokens equal to the reference's with the same noise: {agree}")
    assert min(agree) >= 0.9, agree
    assert sum(agree) / len(agree) >= 0.97, agree


@gpu
@needs_cuda
def test_graph_replays_without_a_barrier_reset() -> None:
    depformer = _seven_b(slots=2)
    hidden, text = _inputs(depformer, 2, seed=13)
    eager = _program(depformer, hidden, text, GREEDY)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = _program(depformer, hidden, text, GREEDY)
    for _ in range(3):
        out.fill_(-1)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager)
    hidden.copy_(_inputs(depformer, 2, seed=14)[0])
    graph.replay()
    assert torch.equal(out, _program(depformer, hidden, text, GREEDY))
