"""A tiny sentencepiece text tokenizer trained on the spot, shaped like a Moshi checkpoint's
(`tokenizer_spm_32k_3.model`) but with a 40-piece vocabulary, for caption tests."""

from pathlib import Path

CORPUS = [
    "the model hears and speaks at once",
    "every deadline of eighty milliseconds is met",
    "hello there how are you today",
    "captions show what the model says while it speaks",
] * 20


def train_tiny_tokenizer(root: Path) -> Path:
    import sentencepiece

    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(CORPUS))
    sentencepiece.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(root / "tiny"), vocab_size=40, minloglevel=2
    )
    return root / "tiny.model"
