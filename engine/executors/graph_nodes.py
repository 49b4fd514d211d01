"""Count the kernels a captured CUDA graph launches per replay, through the CUDA driver API.

`torch.cuda.CUDAGraph(keep_graph=True).raw_cuda_graph()` is the graph's `cudaGraph_t`, which is
the driver's `CUgraph`: `cuGraphGetNodes` lists its nodes and `cuGraphNodeGetType` tells kernel
nodes (type 0) from memcpy/memset/event nodes. The count is exact for one replay: it is what the
engine reports as kernels per tick.
"""

import ctypes
from functools import cache

CU_GRAPH_NODE_TYPE_KERNEL = 0


@cache
def _driver() -> ctypes.CDLL:
    return ctypes.CDLL("libcuda.so.1")


def _check(result: int, what: str) -> None:
    if result != 0:
        raise RuntimeError(f"{what} failed with CUresult {result}")


def count_kernel_nodes(raw_graph: int) -> int:
    """Kernel nodes in the CUgraph `raw_graph` (a handle as an integer)."""
    driver = _driver()
    graph = ctypes.c_void_p(raw_graph)
    count = ctypes.c_size_t(0)
    _check(driver.cuGraphGetNodes(graph, None, ctypes.byref(count)), "cuGraphGetNodes")
    nodes = (ctypes.c_void_p * count.value)()
    _check(driver.cuGraphGetNodes(graph, nodes, ctypes.byref(count)), "cuGraphGetNodes")
    kernels = 0
    for node in nodes[: count.value]:
        kind = ctypes.c_int(-1)
        _check(
            driver.cuGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(kind)),
            "cuGraphNodeGetType",
        )
        kernels += kind.value == CU_GRAPH_NODE_TYPE_KERNEL
    return kernels
