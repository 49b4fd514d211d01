"""Last-to-arrive merges: the program that finishes a split output's last part merges it.

A kernel that splits each output row over several programs (kernels/ring_attention.py's ring
splits, kernels/mimi_transformer.py's) lets every program store its partial and then count
itself in one int32 per row; the program that arrives last loads the row's partials, writes
the output and sets the count back to zero. The merge so takes no launch of its own, and the
counts are zero between launches: a CUDA graph replays without resetting them.

    program (row, split):  store its partial, barrier, n = atomic_add(counts[row], 1)
      n == splits - 1 (the last):  barrier, counts[row] = 0, load every partial, merge,
                                   store the row's output

The count is released and acquired at GPU scope (acq_rel), after a barrier that orders every
thread's stores of the partial before it, so the last program sees every other's partial; it
loads them with `.cg` (from L2: the L1 is not coherent across multiprocessors). Which program
is last does not change the result: it loads every partial of the row, its own too, and
merges them in the same way whichever it is. kernels/fused_linear.py's swapped kernel counts
its split units so too (`last_to_arrive`), in its own workspace (its sums and counts paired).
"""

import torch
import triton  # type: ignore[import-not-found,import-untyped,unused-ignore]
import triton.language as tl  # type: ignore[import-not-found,import-untyped,unused-ignore]
from torch import Tensor

# per device: the arrival counts, the last the largest (arrival_counts)
_COUNTS: dict[torch.device, list[Tensor]] = {}


def arrival_counts(device: torch.device, rows: int) -> Tensor:
    """int32 [at least `rows`] arrival counts on `device`, zero between launches: one buffer
    for every launch there, as the kernels of a tick run one after another on one stream
    (each leaves the counts at zero). Two streams launching split kernels on one device at
    once would share the counts and corrupt each other's merges: the engine runs one model
    on one stream per device; a second one would need buffers of its own. A launch that
    needs more gets a larger buffer; the smaller ones are kept, since a captured graph may
    still use them. A buffer is never made
    during a graph capture (run each shape once before capturing, as the graph executor's
    warm-up does)."""
    kept = _COUNTS.setdefault(device, [])
    if not kept or kept[-1].numel() < rows:
        # under capture the zeroing would be recorded, not run: warm up first
        capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        assert not capturing, "split rows need their arrival counts before a graph is captured"
        kept.append(torch.zeros(rows, device=device, dtype=torch.int32))
    return kept[-1]


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def last_to_arrive(arrived_ptr, row, splits):  # type: ignore[no-untyped-def,unused-ignore]
    """Counts this program in `arrived_ptr[row]` once its partial is stored; whether it is the
    last of the row's `splits`, which then merges the row. The last sets the count back to
    zero: every other program of the row has counted itself."""
    # every thread's partial is stored before the count (released at GPU scope) says so
    tl.debug_barrier()
    last = tl.atomic_add(arrived_ptr + row, 1, sem="acq_rel") == splits - 1
    if last:
        tl.debug_barrier()  # every thread loads the partials after the acquire
        tl.store(arrived_ptr + row, 0)
    return last
