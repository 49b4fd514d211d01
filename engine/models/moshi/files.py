"""Where the parts of a Moshi checkpoint directory are, as Kyutai and NVIDIA lay them out.

    DIR/model.safetensors                                LM
    DIR/tokenizer-e351c8d8-checkpoint125.safetensors     Mimi
    DIR/tokenizer_spm_32k_3.model                        text tokenizer (optional)
    DIR/config.json                                      optional: file names, LM shape

A Kyutai `config.json` may rename the files (`moshi_name`, `mimi_name`, `tokenizer_name`)
and carries the LM's shape, which then overrides the named config's LM.
"""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.models.moshi.checkpoint import CheckpointError
from engine.models.moshi.config import MoshiConfig, from_kyutai_lm_kwargs

LM_NAME = "model.safetensors"
MIMI_NAME = "tokenizer-e351c8d8-checkpoint125.safetensors"
TOKENIZER_NAME = "tokenizer_spm_32k_3.model"


@dataclass(frozen=True)
class CheckpointFiles:
    lm: Path
    mimi: Path
    tokenizer: Path | None  # None when the directory has none
    lm_kwargs: dict[str, Any] | None  # the LM shape from config.json, if any


def find_files(directory: Path) -> CheckpointFiles:
    if not directory.is_dir():
        raise CheckpointError(f"checkpoint directory not found: {directory}")
    names = {"moshi_name": LM_NAME, "mimi_name": MIMI_NAME, "tokenizer_name": TOKENIZER_NAME}
    lm_kwargs: dict[str, Any] | None = None
    config_path = directory / "config.json"
    if config_path.is_file():
        try:
            raw = json.loads(config_path.read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise CheckpointError(f"cannot read {config_path}: {error}") from error
        if not isinstance(raw, dict):
            raise CheckpointError(f"{config_path} must hold an object")
        for key in names:
            names[key] = str(raw.get(key, names[key]))
        if "dim" in raw:
            lm_kwargs = raw
    lm = directory / names["moshi_name"]
    mimi = directory / names["mimi_name"]
    for path in (lm, mimi):
        if not path.is_file():
            raise CheckpointError(f"checkpoint file not found: {path}")
    tokenizer = directory / names["tokenizer_name"]
    return CheckpointFiles(lm, mimi, tokenizer if tokenizer.is_file() else None, lm_kwargs)


def config_for(files: CheckpointFiles, base: MoshiConfig) -> MoshiConfig:
    """The named config, with the LM shape of the checkpoint's config.json when it has one."""
    if files.lm_kwargs is None:
        return base
    try:
        return from_kyutai_lm_kwargs(files.lm_kwargs, base)
    except (KeyError, TypeError, ValueError) as error:
        raise CheckpointError(f"unusable LM config in checkpoint config.json: {error}") from error
