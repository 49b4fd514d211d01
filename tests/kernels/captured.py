"""A kernel launch captured in a CUDA graph against the same launch run eagerly (GPU only)."""

from collections.abc import Callable

import torch

from engine.executors.graph_nodes import count_kernel_nodes
from kernels.arrivals import _COUNTS


def assert_replays_one_kernel(call: Callable[[], torch.Tensor]) -> None:
    """`call` captured in a CUDA graph is one kernel, and its replays (the arrival counts
    never reset between them) give the eager call's bits, leaving every count at zero."""
    want = call()  # and the warm-up: the arrival counts exist before the capture
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(graph):
        out = call()
    assert count_kernel_nodes(graph.raw_cuda_graph()) == 1
    for _ in range(3):
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, want)
    for counts in _COUNTS[want.device]:
        assert int(counts.abs().sum()) == 0, counts
