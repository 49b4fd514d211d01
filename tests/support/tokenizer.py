"""A tiny sentencepiece text tokenizer trained on the spot, shaped like a Moshi checkpoint's
(`tokenizer_spm_32k_3.model`) but with 64 pieces: the text vocabulary of the `tiny` Moshi
config, so every text token a tiny model emits has a piece."""

from pathlib import Path

TINY_TEXT_CARD = 64
SENTENCE = (
    "the model hears and speaks at once every deadline of eighty milliseconds is met hello "
    "there how are you today captions show what it says while speaking full duplex speech "
    "calls engine gateway browser phone listen answer quick brown fox jumps over lazy dog"
)


def train_tiny_tokenizer(root: Path, vocab_size: int = TINY_TEXT_CARD) -> Path:
    import sentencepiece

    corpus = root / "corpus.txt"
    words = SENTENCE.split()
    rotations = [" ".join(words[i:] + words[:i]) for i in range(len(words))]
    corpus.write_text("\n".join(rotations * 5))
    sentencepiece.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(root / "tiny"), vocab_size=vocab_size, minloglevel=2
    )
    return root / "tiny.model"
