"""What the kernel launchers size their grids by: the device's multiprocessor count."""

import functools

import torch


@functools.lru_cache(maxsize=8)
def multiprocessors(device: torch.device, off_cuda: int) -> int:
    """The CUDA device's multiprocessors; `off_cuda` for any other device (Triton's
    interpreter on the CPU, where each launcher picks the count its tests need)."""
    if device.type != "cuda":
        return off_cuda
    return int(torch.cuda.get_device_properties(device).multi_processor_count)
