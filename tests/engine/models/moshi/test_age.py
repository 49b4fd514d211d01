"""`age_contexts` (benchmarks only) moves the aged rows' transformer positions one context on."""

import numpy as np
import torch

from engine.models.base import AgeableModel
from engine.models.moshi.config import load_config
from engine.models.moshi.model import build_moshi


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
