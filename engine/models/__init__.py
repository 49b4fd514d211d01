"""Models the engine can serve, by name, and the options that pick their weights and device."""

import re
from dataclasses import dataclass
from pathlib import Path

from engine.models.base import Model

MODELS = ("echo", "moshi")
KV_DTYPES = ("bf16", "fp8")
DEVICE = re.compile(r"cpu|cuda(:\d+)?")


@dataclass(frozen=True)
class ModelOptions:
    """How to build a neural model; the echo model ignores all of it."""

    checkpoint: Path | None = None  # directory in Kyutai's/NVIDIA's layout
    config: str = "7b"  # tiny | 7b | moshiko | personaplex | a .json/.toml file
    random_weights: int | None = None  # seed for random weights instead of a checkpoint
    device: str = "cpu"
    dtype: str | None = None  # float32 | bfloat16; default bfloat16 on CUDA, float32 on CPU
    greedy: bool = False
    seed: int = 0  # sampling seed
    cpu_threads: int = 1  # torch intra-op threads on CPU; more only pays for large models
    voice_prompt: Path | None = None  # PersonaPlex: a WAV of the voice to speak with
    text_prompt: str | None = None  # PersonaPlex: the role text (needs the tokenizer)
    kv_dtype: str = "bf16"  # temporal KV rings: bf16 (the model's dtype) | fp8 (e4m3 + scales)
    # Triton kernels with programmatic dependent launch on Hopper+ (kernels/dependent_launch.py)
    dependent_launch: bool = True
    # Mimi's glue kernels (MimiCodec.use_glue_kernels); on CUDA only
    mimi_glue_kernels: bool = True
    # the temporal attention's RoPE + ring append in its launch (RingAttention.
    # append_in_attention); on CUDA only, bf16 rings (fp8 ones keep their append launch)
    rope_in_attention: bool = True

    def check(self, model: str) -> None:
        if model == "moshi" and (self.checkpoint is None) == (self.random_weights is None):
            raise ValueError(
                "--model moshi needs exactly one of --checkpoint DIR and --random-weights"
            )
        if self.dtype not in (None, "float32", "bfloat16"):
            raise ValueError(f"unknown dtype {self.dtype!r}; choose float32 or bfloat16")
        if self.kv_dtype not in KV_DTYPES:
            raise ValueError(f"unknown KV dtype {self.kv_dtype!r}; choose bf16 or fp8")
        if model != "moshi" and self.kv_dtype != "bf16":
            raise ValueError(f"--kv-dtype {self.kv_dtype} is for --model moshi (it has KV rings)")
        if model != "moshi" and (moshi_only := self._moshi_only_choices()):
            raise ValueError(
                f"{', '.join(moshi_only)} {'is' if len(moshi_only) == 1 else 'are'} for "
                f"--model moshi; --model {model} takes no "
                "weights, device or prompt (add --model moshi to serve Moshi)"
            )
        if not DEVICE.fullmatch(self.device):
            raise ValueError(f"unknown device {self.device!r}; choose cpu, cuda or cuda:N")
        if self.cpu_threads < 1:
            raise ValueError(f"--cpu-threads must be at least 1, got {self.cpu_threads}")

    def _moshi_only_choices(self) -> list[str]:
        """The options given that only a neural model uses, as their flags."""
        defaults = ModelOptions()
        flags = {
            "--checkpoint": self.checkpoint is not None,
            "--random-weights": self.random_weights is not None,
            "--config": self.config != defaults.config,
            "--device": self.device != defaults.device,
            "--dtype": self.dtype is not None,
            "--voice-prompt": self.voice_prompt is not None,
            "--text-prompt": self.text_prompt is not None,
        }
        return [flag for flag, given in flags.items() if given]


def build_model(name: str, slots: int, options: ModelOptions | None = None) -> Model:
    options = options or ModelOptions()
    options.check(name)
    if name == "echo":
        from engine.models.echo import EchoModel

        return EchoModel(slots)
    if name == "moshi":
        # torch loads only here: an engine serving echo never imports it
        import torch

        from engine.models.moshi.config import load_config
        from engine.models.moshi.model import build_moshi

        device = torch.device(options.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"--device {options.device}: this torch build sees no CUDA GPU")
        if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
            raise ValueError(
                f"--device {options.device}: only {torch.cuda.device_count()} CUDA GPU(s) here"
            )
        if device.type == "cuda":
            # Mimi runs in fp32: its transformer's matmuls and its transposed convolutions (GEMMs,
            # seanet.StreamingConvTranspose1d) in TF32, as cuDNN already runs its convolutions
            # by default (fp32 SIMT GEMMs took 1.15 ms of a 37 ms tick at 128
            # calls: bench/results/tick_kernels_no_tf32.json). The flag is process-wide: a bf16
            # LM (the default on CUDA) is unaffected, an fp32 one (--dtype float32) runs in TF32
            torch.backends.cuda.matmul.allow_tf32 = True
            # process-wide too, read at each launch: set before any graph is captured
            from kernels import dependent_launch

            dependent_launch.ENABLED = options.dependent_launch
        if device.type == "cpu":
            # small steps on shared cores: a thread pool's barriers cost more than they save
            torch.set_num_threads(options.cpu_threads)
        dtype = options.dtype or ("bfloat16" if device.type == "cuda" else "float32")
        model = build_moshi(
            load_config(options.config),
            slots,
            device,
            getattr(torch, dtype),
            checkpoint_dir=options.checkpoint,
            random_weights_seed=options.random_weights,
            greedy=options.greedy,
            sampling_seed=options.seed,
            kv_dtype=torch.float8_e4m3fn if options.kv_dtype == "fp8" else None,
        )
        # set before the executor captures its graph; Triton kernels, so CUDA only
        cuda = device.type == "cuda"
        model.mimi.use_glue_kernels(options.mimi_glue_kernels and cuda)
        model.lm.transformer.append_in_attention(options.rope_in_attention and cuda)
        if options.voice_prompt is not None or options.text_prompt is not None:
            from engine.infer import read_wav, resample

            voice = None
            if options.voice_prompt is not None:
                pcm, rate = read_wav(options.voice_prompt)
                voice = resample(pcm, rate, model.frame.sample_rate)
            model.set_personaplex_prompt(voice, options.text_prompt)
        return model
    raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
