"""Sample format conversions shared by every media path."""

import numpy as np
from numpy.typing import NDArray


def to_float32(pcm: NDArray[np.int16]) -> NDArray[np.float32]:
    return pcm.astype(np.float32) * np.float32(1.0 / 32768.0)


def to_int16(pcm: NDArray[np.float32]) -> NDArray[np.int16]:
    return np.clip(np.round(pcm * 32768.0), -32768, 32767).astype(np.int16)
