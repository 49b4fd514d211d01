"""`age_contexts` (benchmarks only) moves the aged rows' transformer positions one context on."""

import time

import numpy as np
import pytest
import torch

from engine.engine import Engine
from engine.executors import build_executor
from engine.metrics import EngineMetrics
from engine.models.base import AgeableModel, Mask
from engine.models.moshi.config import load_config
from engine.models.moshi.model import MoshiModel, build_moshi
from engine.ring import RingSpec, SharedRing
from engine.slots import SlotTable


def test_aged_rows_count_a_full_context_and_others_do_not_move() -> None:
    model = build_moshi(load_config("tiny"), 3, "cpu", torch.float32, random_weights_seed=1)
    assert isinstance(model, AgeableModel)
    every = np.ones(3, np.bool_)
    silence = np.zeros((3, model.frame.samples), np.float32)
    model.step(silence, every, every)
    model.step(silence, ~every, every)
    lm, mimi = model.lm.transformer, model.mimi
    positions = (
        lm.positions,
        mimi.encoder_transformer.positions,
        mimi.decoder_transformer.positions,
    )
    contexts = (lm.context, mimi.encoder_transformer.context, mimi.decoder_transformer.context)
    before = [p.clone() for p in positions]
    model.age_contexts(np.array([True, False, True]))
    for now, old, context in zip(positions, before, contexts, strict=True):
        assert (now - old).tolist() == [context, 0, context]
    model.step(silence, ~every, every)  # an aged step still runs (every ring entry valid)


def test_the_engine_runs_the_age_hook_once_ageing_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Built, the engine runs age_contexts on no row, so that the hook's kernels are loaded
    before any step is armed behind a doorbell (kernels/doorbell.py); positions stay."""
    model = build_moshi(load_config("tiny"), 2, "cpu", torch.float32, random_weights_seed=1)
    assert isinstance(model, MoshiModel)
    aged: list[list[bool]] = []
    age_contexts = MoshiModel.age_contexts

    def recorded(self: MoshiModel, rows: Mask) -> None:
        aged.append(rows.tolist())
        age_contexts(self, rows)

    monkeypatch.setattr(MoshiModel, "age_contexts", recorded)
    before = model.lm.transformer.positions.clone()
    spec = RingSpec(2, model.frame.samples, model.frame.sample_rate, 0, 4, 80_000_000)
    ring = SharedRing.create(f"cadence-test-age-{time.monotonic_ns()}", spec)
    try:
        Engine(build_executor("eager", model), ring, SlotTable(2), EngineMetrics(), 80_000_000)
    finally:
        ring.close()
    assert aged == [[False, False]]
    assert torch.equal(model.lm.transformer.positions, before)
