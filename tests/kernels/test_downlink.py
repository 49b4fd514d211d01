"""The GPU's downlink publication (kernels/downlink.py) writes the ring as the host's scatter
does (engine/frames.py): in Triton's interpreter here, on CPU tensors over the ring; the
registered ring on a GPU is tests/engine/test_graph_executor.py's."""

import time
from collections.abc import Iterator

import numpy as np
import pytest
from numpy.typing import NDArray

pytest.importorskip("torch")

import torch

pytest.importorskip("triton", reason="triton is not installed (CPU torch does not bring it)")

from engine.frames import DownlinkScatter
from engine.ring import RingSpec, SharedRing
from kernels.downlink import publish_frames

pytestmark = [
    pytest.mark.interpreter,
    pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU's twin: test_graph_executor"),
]

SPEC = RingSpec(
    slots=4, frame_samples=1920, sample_rate=24000, tokens=9, depth=4, tick_period_ns=80_000_000
)


@pytest.fixture
def rings(request: pytest.FixtureRequest) -> Iterator[tuple[SharedRing, SharedRing]]:
    stem = f"cadence-test-{request.node.name[:16]}-{time.monotonic_ns()}"
    host, device = SharedRing.create(stem + "-h", SPEC), SharedRing.create(stem + "-d", SPEC)
    yield host, device
    host.close()
    device.close()


Staging = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def _staging(
    rows: NDArray[np.intp], cols: NDArray[np.intp], stamps: NDArray[np.uint64], value: int
) -> Staging:
    """The pinned staging's words and columns, as DeviceDownlink fills them."""

    def column(values: NDArray[np.int64]) -> torch.Tensor:
        full = torch.zeros(SPEC.slots, dtype=torch.int64)
        full[: values.size] = torch.from_numpy(values)
        return full

    staged = torch.tensor([value], dtype=torch.int64)
    count = torch.tensor([rows.size], dtype=torch.int64)
    return (
        staged,
        count,
        column(rows.astype(np.int64)),
        column(cols.astype(np.int64)),
        column(stamps.view(np.int64)),
    )


def test_the_published_frames_are_the_host_scatters_byte_for_byte(
    rings: tuple[SharedRing, SharedRing],
) -> None:
    """Two ticks of three live slots (one skipped), audio past both clipping edges, the
    second tick over entries the first left: the same ring bytes either way."""
    host_ring, device_ring = rings
    generator = np.random.default_rng(3)
    host, device = (
        DownlinkScatter(SPEC.slots, SPEC.frame_samples),
        DownlinkScatter(SPEC.slots, SPEC.frame_samples),
    )
    rows = np.array([0, 2, 3], np.intp)
    generations = np.array([5, 0, 7, 9], np.uint64)
    for tick in (1, 2):
        pcm = (generator.standard_normal((SPEC.slots, SPEC.frame_samples)) * 0.7).astype(np.float32)
        pcm[0, :4] = [1.0, -1.0, 2.5, -3.0]  # at and past both edges
        pcm[2, 5] = 32767.0 / 32768.0
        tokens = generator.integers(-1, 2048, (SPEC.slots, SPEC.tokens), dtype=np.int32)
        device_pcm = torch.from_numpy(pcm.copy())  # the host's publish clips pcm in place
        host.stage(host_ring, rows, generations)
        host.publish(host_ring, pcm, tokens)
        device.stage(device_ring, rows, generations)
        device_ring.down_stamps[device._rows, device._cols] = 0  # the staging's first move
        ring = (
            torch.from_numpy(device_ring.down_pcm),
            torch.from_numpy(device_ring.down_tokens),
            torch.from_numpy(device_ring.down_stamps.view(np.int64)),
        )
        staging = _staging(device._rows, device._cols, device._stamps, tick)
        publish_frames(staging, tick, device_pcm, torch.from_numpy(tokens), ring)
        np.testing.assert_array_equal(device_ring.down_pcm, host_ring.down_pcm)
        np.testing.assert_array_equal(device_ring.down_tokens, host_ring.down_tokens)
        np.testing.assert_array_equal(device_ring.down_stamps, host_ring.down_stamps)
    assert int(host_ring.down_stamps[1].max()) == 0  # the idle slot got nothing
    assert int(host_ring.down_stamps[0, 2] & np.uint64(0xFFFFFFFF)) == 2  # frame 2 at entry 2


def test_nothing_is_published_when_nothing_is_staged(rings: tuple[SharedRing, SharedRing]) -> None:
    _, ring = rings
    empty = np.zeros(0, np.intp)
    staging = _staging(empty, empty, np.zeros(0, np.uint64), 1)
    pcm = torch.ones(SPEC.slots, SPEC.frame_samples)
    tokens = torch.ones(SPEC.slots, SPEC.tokens, dtype=torch.int32)
    views = (
        torch.from_numpy(ring.down_pcm),
        torch.from_numpy(ring.down_tokens),
        torch.from_numpy(ring.down_stamps.view(np.int64)),
    )
    publish_frames(staging, 1, pcm, tokens, views)
    assert not ring.down_pcm.any()
    assert not ring.down_tokens.any()
    assert not ring.down_stamps.any()
