"""`cadence infer`: run a WAV file through a model offline, with the same batched `step` the
engine runs live (one slot, one 80 ms frame per step).

Reads any integer PCM WAV (8/16/24/32-bit, plain or WAVE_FORMAT_EXTENSIBLE, mono or
interleaved channels, any rate; channels are averaged, the rate converted with soxr), writes
16-bit mono WAV at the model rate, and optionally the emitted tokens of every frame as JSON
lines:

    {"frame": 3, "tokens": [text, audio_1, ..., audio_8], "text": " hello"}

One trailing frame of silence is stepped so the last input frame's answer is emitted; tokens
are -1 where nothing was emitted yet (the first frame). Bad input files, output paths that
cannot be written (checked before the run), bad options and missing or mismatched
checkpoints exit with status 2 and a one-line message.
"""

import argparse
import json
import logging
import os
import sys
import wave
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

logger = logging.getLogger(__name__)

EXIT_USAGE = 2
SAMPLE_WIDTH_SCALE = {1: 128.0, 2: 32768.0, 3: 8388608.0, 4: 2147483648.0}
WAVE_FORMAT_PCM = 0x0001
WAVE_FORMAT_EXTENSIBLE = 0xFFFE


class InputError(ValueError):
    """An input file that cannot be used; reported in one line, exit status 2."""


def add_infer_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", choices=["moshi"], default="moshi", help="model family")
    parser.add_argument("--checkpoint", type=Path, help="checkpoint directory (Kyutai layout)")
    parser.add_argument("--input", type=Path, required=True, help="input WAV file")
    parser.add_argument("--output", type=Path, required=True, help="output WAV file")
    parser.add_argument("--tokens", type=Path, help="write each frame's tokens as JSON lines")
    parser.add_argument("--greedy", action="store_true", help="greedy decoding (no sampling)")
    parser.add_argument(
        "--config", default="7b", help="tiny | 7b | moshiko | personaplex | a .json/.toml file"
    )
    parser.add_argument(
        "--random-weights",
        type=int,
        nargs="?",
        const=0,
        metavar="SEED",
        help="seeded random weights, no checkpoint (seed 0 when none is given)",
    )
    parser.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    parser.add_argument(
        "--dtype", choices=["float32", "bfloat16"], help="LM dtype (default: bf16 on CUDA)"
    )
    parser.add_argument("--seed", type=int, default=0, help="sampling seed")
    parser.add_argument(
        "--cpu-threads", type=int, default=1, help="torch threads on CPU (small models: 1)"
    )
    parser.add_argument("--voice-prompt", type=Path, help="PersonaPlex: WAV of the voice")
    parser.add_argument("--text-prompt", help="PersonaPlex: role text (needs the tokenizer)")


def read_wav(path: Path) -> tuple[NDArray[np.float32], int]:
    """Mono float32 samples in [-1, 1] and the sample rate of an integer PCM WAV (plain PCM or
    WAVE_FORMAT_EXTENSIBLE with a PCM subformat, as sox and ffmpeg write 24-bit and
    multichannel files)."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise InputError(f"cannot read {path}: {error.strerror or error}") from error
    channels, width, rate, raw = _pcm_chunks(data, path)
    if width not in SAMPLE_WIDTH_SCALE:
        raise InputError(f"unsupported WAV sample width in {path}: {width} bytes")
    usable = len(raw) - len(raw) % (width * channels)  # a truncated last frame is dropped
    raw = raw[:usable]
    if not raw:
        raise InputError(f"WAV {path} holds no audio")
    if width == 1:
        samples = np.frombuffer(raw, np.uint8).astype(np.float32) - 128.0
    elif width == 3:
        triples = np.frombuffer(raw, np.uint8).reshape(-1, 3).astype(np.int32)
        signed = triples[:, 0] | (triples[:, 1] << 8) | (triples[:, 2] << 16)
        samples = np.where(signed >= 1 << 23, signed - (1 << 24), signed).astype(np.float32)
    else:
        samples = np.frombuffer(raw, f"<i{width}").astype(np.float32)
    samples = samples / SAMPLE_WIDTH_SCALE[width]
    mono = samples.reshape(-1, channels).mean(axis=1)
    return mono.astype(np.float32), rate


def _pcm_chunks(data: bytes, path: Path) -> tuple[int, int, int, bytes]:
    """(channels, bytes per sample, rate, sample data) from a RIFF/WAVE file's chunks."""
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise InputError(f"{path} is not a WAV file (no RIFF/WAVE header)")
    fmt: bytes | None = None
    offset = 12
    while offset + 8 <= len(data):
        chunk, size = (
            data[offset : offset + 4],
            int.from_bytes(data[offset + 4 : offset + 8], "little"),
        )
        body = data[offset + 8 : offset + 8 + size]
        if chunk == b"fmt ":
            fmt = body
        elif chunk == b"data":
            if fmt is None or len(fmt) < 16:
                raise InputError(f"WAV {path} has no format chunk before its data")
            tag = int.from_bytes(fmt[0:2], "little")
            if tag == WAVE_FORMAT_EXTENSIBLE and len(fmt) >= 26:
                tag = int.from_bytes(fmt[24:26], "little")  # the subformat GUID's first two bytes
            if tag != WAVE_FORMAT_PCM:
                raise InputError(f"WAV {path} is not integer PCM (format {tag:#06x})")
            channels = int.from_bytes(fmt[2:4], "little")
            rate = int.from_bytes(fmt[4:8], "little")
            bits = int.from_bytes(fmt[14:16], "little")
            if channels < 1 or rate < 1 or bits % 8:
                raise InputError(f"WAV {path}: {channels} channels, {rate} Hz, {bits} bits")
            return channels, bits // 8, rate, body
        offset += 8 + size + size % 2  # chunks are padded to an even size
    raise InputError(f"WAV {path} has no data chunk")


def write_wav(path: Path, pcm: NDArray[np.float32], rate: int) -> None:
    pcm_i16 = (np.clip(pcm, -1.0, 1.0) * 32767.0).round().astype("<i2")
    with path.open("wb") as file, wave.open(file, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(pcm_i16.tobytes())


def check_writable(path: Path) -> None:
    """Fail before a long run, not after it, on an output path that cannot be written."""
    if path.is_dir():
        raise InputError(f"output {path} is a directory")
    parent = path.parent
    if not parent.is_dir():
        raise InputError(f"output {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise InputError(f"output {path} is not writable")


def resample(pcm: NDArray[np.float32], rate: int, target: int) -> NDArray[np.float32]:
    if rate == target:
        return pcm
    import soxr

    return np.asarray(soxr.resample(pcm, rate, target), dtype=np.float32)


def run_infer(args: argparse.Namespace) -> int:
    # torch and the model load lazily: the CLI imports this module for its arguments
    from engine.models import ModelOptions, build_model
    from engine.models.moshi.checkpoint import CheckpointError
    from engine.models.moshi.model import MoshiModel

    try:
        for output in (args.output, args.tokens):
            if output is not None:
                check_writable(output)
        if args.tokens is not None and args.tokens.resolve() == args.output.resolve():
            raise ValueError(f"--tokens and --output are the same file: {args.output}")
        pcm, rate = read_wav(args.input)
        options = ModelOptions(
            checkpoint=args.checkpoint,
            config=args.config,
            random_weights=args.random_weights,
            device=args.device,
            dtype=args.dtype,
            greedy=args.greedy,
            seed=args.seed,
            cpu_threads=args.cpu_threads,
            voice_prompt=args.voice_prompt,
            text_prompt=args.text_prompt,
        )
        model = build_model("moshi", 1, options)
        assert isinstance(model, MoshiModel)
        frame = model.frame
    except (InputError, CheckpointError, ValueError) as error:
        sys.stderr.write(f"cadence infer: {error}\n")
        return EXIT_USAGE

    model_pcm = resample(pcm, rate, frame.sample_rate)
    steps = -(-model_pcm.shape[0] // frame.samples) + 1  # + 1: flush the one-frame delay
    padded = np.zeros(steps * frame.samples, np.float32)
    padded[: model_pcm.shape[0]] = model_pcm
    outputs = []
    token_lines = []
    active = np.ones(1, np.bool_)
    for index in range(steps):
        pcm_in = padded[None, index * frame.samples : (index + 1) * frame.samples]
        out = model.step(pcm_in, np.array([index == 0]), active)
        outputs.append(out.pcm[0])
        tokens = [int(t) for t in out.tokens[0]]
        line: dict[str, object] = {"frame": index, "tokens": tokens}
        if model.tokenizer is not None:
            line["text"] = model.tokenizer.piece(tokens[0])
        token_lines.append(json.dumps(line))
    try:
        write_wav(args.output, np.concatenate(outputs), frame.sample_rate)
        if args.tokens is not None:
            args.tokens.write_text("".join(f"{line}\n" for line in token_lines))
    except OSError as error:
        sys.stderr.write(f"cadence infer: cannot write output: {error}\n")
        return EXIT_USAGE
    logger.info("wrote %d frames to %s", steps, args.output)
    return 0
