"""Loading checkpoints written by the reference, through `run_infer`, and every bad case."""

import argparse
import json
import wave
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("moshi")

import numpy as np
import torch
from moshi.models.compression import MimiModel
from moshi.models.lm import LMModel
from safetensors.torch import load_file, save_file

from engine.infer import add_infer_arguments, read_wav, run_infer, write_wav
from engine.models.moshi import model as model_module
from engine.models.moshi.checkpoint import CheckpointError
from engine.models.moshi.config import moshiko, tiny
from engine.models.moshi.files import LM_NAME, MIMI_NAME
from engine.models.moshi.model import build_moshi
from tests.engine.models.moshi import kyutai

SEED = 31


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, LMModel, MimiModel]:
    directory = tmp_path_factory.mktemp("checkpoint")
    kwargs = kyutai.lm_kwargs()
    lm = kyutai.build_lm(kwargs, SEED)
    mimi = kyutai.build_mimi(tiny().mimi, SEED + 1)
    kyutai.save_checkpoint(directory, lm, mimi, kwargs)
    return directory, lm, mimi


def infer(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    add_infer_arguments(parser)
    return run_infer(parser.parse_args(argv))


def test_run_infer_loads_reference_checkpoint_and_matches_it(
    reference: tuple[Path, LMModel, MimiModel], tmp_path: Path
) -> None:
    directory, lm, mimi = reference
    frames = 12
    pcm = (0.2 * torch.randn(frames * 1920, generator=torch.Generator().manual_seed(4))).numpy()
    # 48 kHz stereo in: exercises channel averaging and soxr
    import soxr

    stereo = np.stack([soxr.resample(pcm, 24000, 48000)] * 2, axis=1)
    source = tmp_path / "in.wav"
    with wave.open(str(source), "wb") as wav:
        wav.setnchannels(2)
        wav.setsampwidth(2)
        wav.setframerate(48000)
        wav.writeframes((np.clip(stereo, -1, 1) * 32767).round().astype("<i2").tobytes())
    argv = ["--checkpoint", str(directory), "--config", "tiny", "--greedy"]
    argv += ["--input", str(source), "--output", str(tmp_path / "out.wav")]
    argv += ["--tokens", str(tmp_path / "tokens.jsonl")]
    assert infer(argv) == 0
    lines = [json.loads(line) for line in (tmp_path / "tokens.jsonl").read_text().splitlines()]
    assert [line["frame"] for line in lines] == list(range(frames + 1))
    got = np.array([line["tokens"] for line in lines])
    heard, rate = read_wav(source)
    resampled = soxr.resample(heard, rate, 24000).astype(np.float32)
    padded = np.zeros((frames + 1) * 1920, np.float32)
    padded[: resampled.shape[0]] = resampled
    want, want_pcm = kyutai.run_reference(lm, mimi, torch.from_numpy(padded))
    np.testing.assert_array_equal(got, want.numpy())
    out, out_rate = read_wav(tmp_path / "out.wav")
    assert out_rate == 24000
    assert out.shape[0] == (frames + 1) * 1920
    np.testing.assert_allclose(out, want_pcm.numpy().reshape(-1).clip(-1, 1), atol=2 / 32767)


def write_variant(source: Path, target: Path, edit_lm: object) -> Path:
    target.mkdir()
    state = load_file(str(source / LM_NAME))
    edit_lm(state)  # type: ignore[operator]
    save_file(state, str(target / LM_NAME))
    (target / MIMI_NAME).write_bytes((source / MIMI_NAME).read_bytes())
    (target / "config.json").write_text((source / "config.json").read_text())
    return target


def load(directory: Path) -> None:
    build_moshi(tiny(), 1, "cpu", torch.float32, checkpoint_dir=directory)


def test_missing_tensor_is_named(
    reference: tuple[Path, LMModel, MimiModel], tmp_path: Path
) -> None:
    def drop(state: dict[str, torch.Tensor]) -> None:
        del state["transformer.layers.1.gating.linear_out.weight"]

    with pytest.raises(
        CheckpointError,
        match=r"missing tensor transformer\.layers\.1\.gating"
        r"\.linear_out\.weight \(expected shape \[64, 176\]\)",
    ):
        load(write_variant(reference[0], tmp_path / "ckpt", drop))


def test_unexpected_tensor_is_named(
    reference: tuple[Path, LMModel, MimiModel], tmp_path: Path
) -> None:
    def add(state: dict[str, torch.Tensor]) -> None:
        state["transformer.layers.0.extra.weight"] = torch.zeros(3, 2)

    with pytest.raises(
        CheckpointError,
        match=r"unexpected tensor transformer\.layers\.0\.extra"
        r"\.weight \(shape \[3, 2\]\)",
    ):
        load(write_variant(reference[0], tmp_path / "ckpt", add))


def test_mismatched_shape_names_both_shapes(
    reference: tuple[Path, LMModel, MimiModel], tmp_path: Path
) -> None:
    def shrink(state: dict[str, torch.Tensor]) -> None:
        state["text_linear.weight"] = state["text_linear.weight"][:10].contiguous()

    with pytest.raises(
        CheckpointError,
        match=r"tensor text_linear\.weight has shape \[10, 64\], "
        r"expected \[64, 64\]",
    ):
        load(write_variant(reference[0], tmp_path / "ckpt", shrink))


def test_integer_tensors_for_float_weights_are_named(
    reference: tuple[Path, LMModel, MimiModel], tmp_path: Path
) -> None:
    """They were cast and loaded: a model with other weights, and no word of it."""

    def as_integers(state: dict[str, torch.Tensor]) -> None:
        state["text_linear.weight"] = state["text_linear.weight"].to(torch.int32)

    with pytest.raises(
        CheckpointError,
        match=r"tensors text_linear\.weight \(torch\.int32\) are not floating point",
    ):
        load(write_variant(reference[0], tmp_path / "ckpt", as_integers))


def test_tokens_written_over_the_output_is_refused_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, out = tmp_path / "in.wav", tmp_path / "out.wav"
    write_wav(source, np.zeros(1920, np.float32), 24000)
    run = ["--random-weights", "--config", "tiny", "--input", str(source), "--output", str(out)]
    assert infer([*run, "--tokens", str(tmp_path / "." / "out.wav")]) == 2
    assert "--tokens and --output are the same file" in capsys.readouterr().err
    assert not out.exists()


def test_a_checkpoint_of_another_size_fails_before_the_model_is_built(
    reference: tuple[Path, LMModel, MimiModel], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tiny_checkpoint = write_variant(reference[0], tmp_path / "ckpt", lambda state: None)
    (tiny_checkpoint / "config.json").unlink()  # nothing says it is tiny: 7B is assumed

    def allocate(*args: object, **kwargs: object) -> None:
        raise AssertionError("the 7B LM was allocated before its checkpoint was checked")

    monkeypatch.setattr(model_module, "MoshiLm", allocate)
    with pytest.raises(
        CheckpointError,
        match=r"another model size.*emb\.0\.weight has shape \[65, 64\], expected \[2049, 4096\]",
    ):
        build_moshi(moshiko(), 1, "cpu", torch.float32, checkpoint_dir=tiny_checkpoint)


def test_fused_projections_load_like_split_ones(
    reference: tuple[Path, LMModel, MimiModel], tmp_path: Path
) -> None:
    """The released files store attention projections fused (`in_proj_weight`)."""

    directory = reference[0]
    split = build_moshi(tiny(), 1, "cpu", torch.float32, checkpoint_dir=directory)
    fused_dir = write_variant(directory, tmp_path / "fused", fuse_projections)
    fused = build_moshi(tiny(), 1, "cpu", torch.float32, checkpoint_dir=fused_dir)
    for (name, a), (_, b) in zip(
        split.lm.named_parameters(), fused.lm.named_parameters(), strict=True
    ):
        assert torch.equal(a, b), name


def test_missing_files_and_unreadable_input_exit_2(
    reference: tuple[Path, LMModel, MimiModel], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good_wav = tmp_path / "in.wav"
    write_wav(good_wav, np.zeros(1920, np.float32), 24000)
    out = ["--output", str(tmp_path / "out.wav"), "--config", "tiny"]
    assert infer(["--checkpoint", str(tmp_path / "nowhere"), "--input", str(good_wav), *out]) == 2
    assert "checkpoint directory not found" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert infer(["--checkpoint", str(empty), "--input", str(good_wav), *out]) == 2
    assert f"checkpoint file not found: {empty / LM_NAME}" in capsys.readouterr().err
    bad_wav = tmp_path / "bad.wav"
    bad_wav.write_bytes(b"RIFF but not really a wave file")
    assert infer(["--checkpoint", str(reference[0]), "--input", str(bad_wav), *out]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"cadence infer: {bad_wav} is not a WAV file")
    assert err.count("\n") == 1
    assert infer(["--input", str(good_wav), *out]) == 2
    assert "exactly one of --checkpoint" in capsys.readouterr().err
    corrupt = write_variant(reference[0], tmp_path / "corrupt", lambda state: None)
    (corrupt / LM_NAME).write_bytes(b"\x00" * 64)
    assert infer(["--checkpoint", str(corrupt), "--input", str(good_wav), *out]) == 2
    assert f"cannot read {corrupt / LM_NAME}" in capsys.readouterr().err


def _wav_bytes(fmt: bytes, data: bytes) -> bytes:
    chunks = b"fmt " + len(fmt).to_bytes(4, "little") + fmt
    chunks += b"data" + len(data).to_bytes(4, "little") + data
    return b"RIFF" + (4 + len(chunks)).to_bytes(4, "little") + b"WAVE" + chunks


def test_an_extensible_24_bit_stereo_wav_is_read_as_sox_writes_it(tmp_path: Path) -> None:
    left = np.array([0, 1 << 22, -(1 << 22), (1 << 23) - 1], np.int64)
    right = np.array([0, 0, 1 << 21, -(1 << 23)], np.int64)
    interleaved = np.stack([left, right], axis=1).reshape(-1) & 0xFFFFFF
    data = b"".join(int(v).to_bytes(3, "little") for v in interleaved)
    pcm_guid = (1).to_bytes(2, "little") + bytes.fromhex("000000001000800000aa00389b71")
    fmt = (
        (0xFFFE).to_bytes(2, "little")  # WAVE_FORMAT_EXTENSIBLE
        + (2).to_bytes(2, "little")
        + (44100).to_bytes(4, "little")
        + (44100 * 6).to_bytes(4, "little")
        + (6).to_bytes(2, "little")
        + (24).to_bytes(2, "little")
        + (22).to_bytes(2, "little")  # extension size
        + (24).to_bytes(2, "little")  # valid bits
        + (3).to_bytes(4, "little")  # channel mask: front left and right
        + pcm_guid
    )
    path = tmp_path / "ext24.wav"
    path.write_bytes(_wav_bytes(fmt, data + b"\x01\x02"))  # and a truncated last frame
    mono, rate = read_wav(path)
    assert rate == 44100
    expected = (left + right) / 2 / float(1 << 23)
    np.testing.assert_allclose(mono, expected.astype(np.float32), rtol=0, atol=1e-7)


@pytest.mark.parametrize(
    ("argument", "message"),
    [
        (("--device", "nosuch"), "unknown device 'nosuch'"),
        (("--cpu-threads", "0"), "--cpu-threads must be at least 1"),
        (("--output", "/nonexistent/dir/out.wav"), "directory /nonexistent/dir does not exist"),
        (("--tokens", "/"), "output / is a directory"),
    ],
)
def test_bad_options_exit_2_in_one_line_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argument: tuple[str, str], message: str
) -> None:
    source = tmp_path / "in.wav"
    write_wav(source, np.zeros(1920, np.float32), 24000)
    run = ["--random-weights", "--config", "tiny", "--input", str(source)]
    args = [*run, "--output", str(tmp_path / "out.wav"), *argument]
    assert infer(args) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1
    assert not (tmp_path / "out.wav").exists(), "refused before the run"


@pytest.mark.skipif(torch.cuda.is_available(), reason="asks for CUDA where there is none")
def test_cuda_on_a_machine_without_it_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "in.wav"
    write_wav(source, np.zeros(1920, np.float32), 24000)
    args = ["--random-weights", "--config", "tiny", "--input", str(source), "--device", "cuda"]
    assert infer([*args, "--output", str(tmp_path / "out.wav")]) == 2
    assert "sees no CUDA GPU" in capsys.readouterr().err


def test_random_weights_run_on_the_tiny_config(tmp_path: Path) -> None:
    source = tmp_path / "in.wav"
    write_wav(source, (0.1 * np.sin(np.arange(3 * 1920) / 9)).astype(np.float32), 16000)
    argv = ["--random-weights", "5", "--config", "tiny", "--input", str(source)]
    argv += ["--output", str(tmp_path / "out.wav"), "--tokens", str(tmp_path / "t.jsonl")]
    assert infer(argv) == 0
    lines = (tmp_path / "t.jsonl").read_text().splitlines()
    assert len(lines) == -(-3 * 1920 * 24000 // 16000 // 1920) + 1
    assert json.loads(lines[0])["tokens"] == [-1] * 9
    assert min(json.loads(lines[1])["tokens"]) >= 0


def train_tokenizer(path: Path, vocab: int) -> None:
    """A real sentencepiece model of the given vocabulary, trained on made-up words."""
    import random

    import sentencepiece

    rng = random.Random(0)
    letters = "abcdefghijklmnop"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 7))) for _ in range(300)]
    corpus = path.with_suffix(".txt")
    corpus.write_text("\n".join(" ".join(rng.choice(words) for _ in range(12)) for _ in range(200)))
    sentencepiece.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(path.with_suffix("")),
        vocab_size=vocab,
        user_defined_symbols=["<system>"],  # one piece: tagged roles fit the 24-frame context
        minloglevel=2,
    )


def test_personaplex_prompt_and_captions_through_run_infer(
    reference: tuple[Path, LMModel, MimiModel], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = write_variant(reference[0], tmp_path / "ckpt", lambda state: None)
    train_tokenizer(directory / "tokenizer_spm_32k_3.model", vocab=64)
    source = tmp_path / "in.wav"
    write_wav(source, np.zeros(2 * 1920, np.float32), 24000)
    voice = tmp_path / "voice.wav"
    write_wav(voice, (0.3 * np.sin(np.arange(5000) / 7)).astype(np.float32), 24000)
    argv = ["--checkpoint", str(directory), "--config", "tiny", "--greedy"]
    argv += ["--input", str(source), "--output", str(tmp_path / "out.wav")]
    argv += ["--tokens", str(tmp_path / "t.jsonl"), "--voice-prompt", str(voice)]
    assert infer([*argv, "--text-prompt", "ab"]) == 0  # sent between tags: the context is 24
    lines = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    # after the replayed prompt the call's very first step already emits a frame
    assert min(lines[0]["tokens"]) >= 0
    assert all(isinstance(line["text"], str) for line in lines)
    train_tokenizer(directory / "tokenizer_spm_32k_3.model", vocab=70)
    assert infer([*argv, "--text-prompt", "abc"]) == 2
    assert "has 70 tokens, the LM 64" in capsys.readouterr().err


def fuse_projections(state: dict[str, torch.Tensor]) -> None:
    """Rewrite split per-step attention projections the way the released files store them:
    one `in_proj_weight` / `out_proj.weight` per attention, steps stacked along rows."""
    for key in [k for k in state if k.endswith("self_attn.in_projs.0.weight")]:
        prefix = key.removesuffix("in_projs.0.weight")
        for split, fused in (("in_projs", "in_proj_weight"), ("out_projs", "out_proj.weight")):
            steps = sorted(
                (k for k in state if k.startswith(f"{prefix}{split}.")),
                key=lambda k: int(k.split(".")[-2]),
            )
            state[prefix + fused] = torch.cat([state.pop(k) for k in steps])


def test_personaplex_layout_loads_its_first_8_depformer_steps() -> None:
    """dep_q 16, projections fused over 16 steps (nvidia/personaplex-7b-v1's layout)."""
    from engine.models.moshi.checkpoint import lm_sources, lm_unused, load_into
    from engine.models.moshi.config import from_kyutai_lm_kwargs
    from engine.models.moshi.lm import MoshiLm
    from engine.models.moshi.sampling import Sampling

    kwargs = kyutai.lm_kwargs(dep_q=16)
    ref = kyutai.build_lm(kwargs, seed=51)
    config = from_kyutai_lm_kwargs(kwargs, tiny()).lm
    greedy = Sampling(greedy=True, temperature=1.0, top_k=1)
    split = MoshiLm(config, 1, torch.device("cpu"), torch.float32, greedy, greedy, None)
    fused = MoshiLm(config, 1, torch.device("cpu"), torch.float32, greedy, greedy, None)
    state = dict(ref.state_dict())
    load_into(split, state, lm_sources(config), lm_unused(config), "split")
    fuse_projections(state)
    assert state["depformer.layers.0.self_attn.in_proj_weight"].shape == (16 * 96, 32)
    load_into(fused, state, lm_sources(config), lm_unused(config), "fused")
    for (name, a), (_, b) in zip(split.named_parameters(), fused.named_parameters(), strict=True):
        assert torch.equal(a, b), name
    step_7 = ref.state_dict()["depformer.layers.1.self_attn.in_projs.7.weight"]
    ours = dict(split.named_parameters())["depformer.layers.1.self_attn.in_proj"]
    assert torch.equal(ours[7], step_7)
