"""The text tokenizer of Moshi checkpoints (sentencepiece, `tokenizer_spm_32k_3.model`).

Used for captions (text tokens -> pieces) and for PersonaPlex's role text (text -> tokens).
Padding tokens (0 = end of padding, 3 = padding) carry no text.
"""

from pathlib import Path

from engine.models.moshi.checkpoint import CheckpointError

PADDING_IDS = frozenset({0, 3})


class TextTokenizer:
    def __init__(self, path: Path) -> None:
        import sentencepiece

        if not path.is_file():
            raise CheckpointError(f"tokenizer file not found: {path}")
        try:
            self._sp = sentencepiece.SentencePieceProcessor(model_file=str(path))
        except (OSError, RuntimeError) as error:
            raise CheckpointError(f"cannot read tokenizer {path}: {error}") from error

    @property
    def vocab_size(self) -> int:
        return int(self._sp.get_piece_size())

    def encode(self, text: str) -> list[int]:
        return [int(i) for i in self._sp.encode(text, out_type=int)]

    def piece(self, token: int) -> str:
        """The caption text of one emitted text token ('' for padding), spaces restored."""
        if token in PADDING_IDS or not 0 <= token < self.vocab_size:
            return ""
        return str(self._sp.id_to_piece(token)).replace("\u2581", " ")
