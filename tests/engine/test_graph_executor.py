"""The graph executor gives the eager executor's tokens and audio (CUDA only)."""

import functools
import threading
from collections.abc import Iterator

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from engine.executors.eager import EagerExecutor  # noqa: E402
from engine.executors.graph import GraphExecutor  # noqa: E402
from engine.models.base import Mask, PcmBatch  # noqa: E402
from engine.models.moshi.config import load_config  # noqa: E402
from engine.models.moshi.model import MoshiModel, build_moshi  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

SLOTS = 4
STEPS = 40


def _model(greedy: bool) -> MoshiModel:
    model = build_moshi(
        load_config("tiny"), SLOTS, "cuda", torch.float32, random_weights_seed=5, greedy=greedy
    )
    assert model.generator is not None
    return model


@pytest.mark.parametrize(
    ("greedy", "split_tiles", "armed", "prompt"),
    [
        (True, False, False, False),
        (False, False, False, False),
        (True, True, False, False),
        (True, False, True, False),  # each step queued ahead behind the doorbell
        (False, False, True, False),  # the same, sampling
        (False, False, True, True),  # a prompt to replay: never armed, submitted at the tick
    ],
)
def test_graph_replays_match_eager_steps_with_calls_joining_and_leaving(
    greedy: bool, split_tiles: bool, armed: bool, prompt: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if split_tiles:  # every few-rows linear on the swapped, split tiles (the 7B's temporal)
        from kernels import fused_linear

        monkeypatch.setattr(fused_linear, "SWAP_K", 1)
    eager_model, graph_model = _model(greedy), _model(greedy)
    if prompt:
        lm = eager_model.config.lm
        frames = torch.randint(0, min(lm.card, lm.text_card), (6, lm.num_streams))
        for model in (eager_model, graph_model):
            model.set_prompt(frames)
    eager = EagerExecutor(eager_model)
    graph = GraphExecutor(graph_model)
    # the graph executor's warm-up advanced its generator; start both from the same state
    for model in (eager_model, graph_model):
        assert model.generator is not None
        model.generator.manual_seed(11)
    steps = list(_calls_joining_and_leaving())
    # every eager step first: an armed step holds the stream until its ring, and the eager
    # step's copy back to the host would wait behind it (only the engine runs between rings)
    wanted = [eager.run(pcm, reset, active) for pcm, reset, active in steps]
    meanwhiles: list[int] = []
    # armed, as the engine runs it: with `ahead_of_outputs`, so that once a step is due the
    # host spins on the done word, and the outputs read after it must be the step's; and the
    # audio written into the executor's pinned staging in place (input_pcm), as the engine's
    # gather does, so that `run` copies none of it
    ahead = (lambda: None) if armed else None
    for step, ((pcm, reset, active), want) in enumerate(zip(steps, wanted, strict=True)):
        if armed:
            staging = graph.input_pcm()
            staging[:] = pcm
            pcm = staging
        got = graph.run(pcm, reset, active, functools.partial(meanwhiles.append, step), ahead)
        np.testing.assert_array_equal(got.tokens, want.tokens, err_msg=f"step {step}")
        np.testing.assert_allclose(got.pcm, want.pcm, atol=1e-5, err_msg=f"step {step}")
        if armed:
            graph.arm()
    graph.close()
    assert meanwhiles == list(range(len(steps))), "meanwhile runs once a step"
    assert _synchronizes(), "a step was left waiting on the device"


def _calls_joining_and_leaving() -> Iterator[tuple[PcmBatch, Mask, Mask]]:
    """STEPS steps of inputs: slot 1 leaves at 20 and a new call rejoins it at 23."""
    rng = np.random.default_rng(0)
    active = np.zeros(SLOTS, np.bool_)
    joins = {0: [0, 1], 7: [2], 15: [3], 23: [1]}
    leaves = {20: [1], 31: [0]}
    for step in range(STEPS):
        reset = np.zeros(SLOTS, np.bool_)
        for slot in joins.get(step, []):
            reset[slot] = active[slot] = True
        for slot in leaves.get(step, []):
            active[slot] = False
        yield (rng.standard_normal((SLOTS, 1920)) * 0.1).astype(np.float32), reset, active.copy()


def _synchronizes(timeout_s: float = 10.0) -> bool:
    """Whether a device-wide synchronize returns (an armed step never rung never does)."""
    done = threading.Event()

    def synchronize() -> None:
        torch.cuda.synchronize()
        done.set()

    threading.Thread(target=synchronize, daemon=True).start()
    return done.wait(timeout_s)


def test_an_armed_step_waits_for_its_ring_and_close_runs_it_out() -> None:
    model = _model(greedy=True)
    graph = GraphExecutor(model)
    silence = np.zeros((SLOTS, 1920), np.float32)
    every = np.ones(SLOTS, np.bool_)
    graph.run(silence, every, every)
    graph.arm()
    graph.arm()  # once per step: a second call queues nothing more
    assert not _synchronizes(0.3), "the armed step ran before its ring"
    first = graph.run(silence, ~every, every).tokens.copy()
    assert _synchronizes()
    graph.arm()
    graph.close()
    assert _synchronizes()
    graph.close()  # nothing armed: nothing to do
    lm = model.config.lm
    model.set_prompt(torch.randint(0, min(lm.card, lm.text_card), (3, lm.num_streams)))
    graph.arm()  # a prompt to replay at a join: the step is submitted at its tick instead
    assert _synchronizes(), "a model with a prompt was armed"
    assert first.shape == (SLOTS, model.frame.tokens)


def test_kernels_per_tick_counts_the_kernels_one_step_launches() -> None:
    model = _model(greedy=True)
    graph = GraphExecutor(model)
    pcm = torch.zeros(SLOTS, 1920, device="cuda")
    flags = torch.ones(SLOTS, dtype=torch.bool, device="cuda")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        model.device_step(pcm, ~flags, flags)
        torch.cuda.synchronize()
    launched = [
        e
        for e in prof.events()
        if e.device_type.name == "CUDA" and not e.name.startswith(("Memcpy", "Memset"))
    ]
    assert graph.kernels_per_tick is not None
    # the graph holds exactly the step's kernels; allow the profiler a few it names otherwise
    assert abs(graph.kernels_per_tick - len(launched)) <= 0.02 * len(launched)
