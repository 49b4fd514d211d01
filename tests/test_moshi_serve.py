"""A tiny random-weight Moshi served live on CPU through the whole gateway path.

Audio and text are noise (random weights); what is tested is that the real path carries them:
admission, uplink frames into the Moshi step, its audio and tokens back out to the caller.
Deadlines are not asserted here: a CPU's speed decides them, and the counters are reported.
"""

import asyncio
import logging
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from gateway.ice import restrict_host_candidates
from tests.support.caller import band_limited_noise, place_call
from tests.support.server import start_serve, stop_serve

log = logging.getLogger(__name__)


def test_tiny_moshi_answers_a_call(tmp_path: Path) -> None:
    restrict_host_candidates(["127.0.0.1"])
    served = start_serve(
        tmp_path / "serve.log",
        "--slots=1",
        "--model=moshi",
        "--config=tiny",
        "--random-weights=3",
        timeout_s=180,
    )
    try:
        status, _ = served.get("/healthz")
        assert status == 200
        result = asyncio.run(place_call(served.url, band_limited_noise(4.0), 3.5))
        record = result.record
        engine = record["engine"]
        assert isinstance(engine, dict)
        assert engine["ticks"] > 20, record
        uplink = record["uplink"]
        assert isinstance(uplink, dict)
        assert uplink["frames"] > 20, "the caller's audio reached the model"
        downlink = record["downlink"]
        assert isinstance(downlink, dict)
        assert downlink["frames"] > 10, record
        heard, _ = result.received.decode()
        assert heard.size > 48000
        assert float(np.sqrt(np.mean(heard**2))) > 1e-4, "the model's audio reached the caller"
        log.info("tiny moshi on CPU: %s", engine)
    finally:
        assert stop_serve(served) == 0
    assert "warmed up" in served.log()
