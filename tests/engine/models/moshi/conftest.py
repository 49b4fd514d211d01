"""Shared setup of the Moshi tests."""

import os
from collections.abc import Iterator

import pytest

# the reference compiles its kernels lazily unless told not to; compiling takes longer than
# these tiny models run
os.environ.setdefault("NO_TORCH_COMPILE", "1")


@pytest.fixture(autouse=True, scope="module")
def _one_cpu_thread() -> Iterator[None]:
    """Tiny models gain nothing from intra-op threads, and on a small shared CI machine
    (2 cores) spinning worker threads make every step an order of magnitude slower."""
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
