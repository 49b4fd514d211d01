"""torch's TF32 switches for a block: cuDNN's convolutions and cuBLAS's fp32 matmuls."""

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def tf32(allowed: bool) -> Iterator[None]:
    """cuDNN's convolutions and torch's fp32 matmuls in TF32 (as the server runs them: cuDNN
    by default, matmuls since build_model turns them on process-wide) or in full fp32, for
    the block; both set back after it."""
    before = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = allowed
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = before
