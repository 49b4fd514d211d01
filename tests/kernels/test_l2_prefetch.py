"""The L2 prefetch (kernels/l2_prefetch.py) changes no value: the temporal few-rows step with
it equals the step without it, eagerly and replayed from a CUDA graph (the side stream joins
before the capture ends). CUDA only: the prefetch is inline PTX, which the interpreter lacks."""

import pytest

pytest.importorskip("torch")

import torch

pytest.importorskip("triton", reason="triton is not installed (CPU torch does not bring it)")

from engine.models.moshi.model import randomize
from engine.models.moshi.transformer import TemporalTransformer

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _transformer(prefetch_bytes: int) -> TemporalTransformer:
    device = torch.device("cuda")
    transformer = TemporalTransformer(
        dim=256,
        num_heads=4,
        num_layers=2,
        ffn_hidden=704,
        max_period=1e4,
        context=16,
        slots=1,
        device=device,
        dtype=torch.bfloat16,
    )
    randomize(transformer, 23)
    transformer.prefetch_bytes = prefetch_bytes
    return transformer


@gpu
@needs_cuda
def test_prefetch_changes_no_output_eager_or_replayed() -> None:
    frames = [torch.randn(1, 1, 256, generator=torch.Generator().manual_seed(f)) for f in range(3)]
    frames = [frame.to("cuda", torch.bfloat16) for frame in frames]
    outputs = []
    with torch.no_grad():
        for prefetch_bytes in (0, 1 << 20):
            transformer = _transformer(prefetch_bytes)
            outputs.append(torch.stack([transformer.step(x) for x in frames]))
        # replayed: the same steps from a graph captured after a warm-up step on a side stream
        transformer = _transformer(1 << 20)
        source = torch.zeros_like(frames[0])
        warm_up = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        warm_up.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(warm_up):
            transformer.step(source)
        torch.cuda.current_stream().wait_stream(warm_up)
        transformer.positions.zero_()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = transformer.step(source)
        transformer.positions.zero_()
        transformer.keys.zero_()
        transformer.values.zero_()
        replayed = []
        for x in frames:
            source.copy_(x)
            graph.replay()
            replayed.append(out.clone())
        outputs.append(torch.stack(replayed))
    assert torch.equal(outputs[1], outputs[0])
    assert torch.equal(outputs[2], outputs[0])
