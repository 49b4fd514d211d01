"""Live captions: the served model's text tokens, turned into text for a call's data channel.

A model that speaks also writes: Moshi emits, per 80 ms step, one text token followed by its
audio codes (`FrameSpec.tokens`, text first, -1 where nothing was emitted). The gateway only
needs the text token and a table from token ids to text, which a `Captioner` provides; the
one shipped here reads the sentencepiece model that Moshi checkpoints carry. sentencepiece is
imported only when such a file is configured, and nothing here touches torch.

`CaptionStream` is the per-call, sans-IO part: token vectors in, caption text out, so the
mapping is tested without a peer connection; the WebRTC side only sends what it returns.
"""

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

TEXT_TOKEN_INDEX = 0  # the text token leads each step's tokens
MOSHI_SILENT_IDS = frozenset({0, 3})  # Moshi's text stream: 0 ends padding, 3 is padding
WORD_MARK = "\u2581"  # sentencepiece's word-start marker, a space in the text


class Captioner(Protocol):
    """Maps one text token id to the text it adds ('' when it adds none)."""

    def text(self, token: int) -> str: ...


class SentencePieceCaptioner:
    def __init__(self, path: Path, silent_ids: frozenset[int] = MOSHI_SILENT_IDS) -> None:
        import sentencepiece

        self._sp = sentencepiece.SentencePieceProcessor(model_file=str(path))
        self._size = int(self._sp.get_piece_size())
        self._silent = silent_ids

    def text(self, token: int) -> str:
        if token in self._silent or not 0 <= token < self._size:
            return ""
        if self._sp.is_control(token) or self._sp.is_unknown(token):
            return ""
        return str(self._sp.id_to_piece(token)).replace(WORD_MARK, " ")


def load_captioner(path: Path | None) -> Captioner | None:
    return None if path is None else SentencePieceCaptioner(path)


class CaptionStream:
    """One call's caption text, built from the text token of each downlink frame."""

    def __init__(self, captioner: Captioner) -> None:
        self._captioner = captioner
        self.frames = 0  # token vectors seen
        self.pieces = 0  # of them, those that added text

    def take(self, steps: Iterable[NDArray[np.int32]]) -> str:
        """The text the given steps add, in order ('' when they add none)."""
        text = []
        for tokens in steps:
            self.frames += 1
            if tokens.size <= TEXT_TOKEN_INDEX:
                continue
            token = int(tokens[TEXT_TOKEN_INDEX])
            piece = self._captioner.text(token) if token >= 0 else ""
            if piece:
                self.pieces += 1
                text.append(piece)
        return "".join(text)


def caption_message(text: str, frame: int) -> str:
    """The data channel's message: JSON, so that later fields need no new channel."""
    return json.dumps({"type": "caption", "text": text, "frame": frame})


class TextChannel(Protocol):
    """The part of a data channel captions need (aiortc's RTCDataChannel has it)."""

    @property
    def readyState(self) -> str: ...  # noqa: N802 -- the WebRTC spelling

    def send(self, data: str) -> None: ...


def send_captions(
    stream: CaptionStream, channel: TextChannel | None, steps: Iterable[NDArray[np.int32]]
) -> bool:
    """Turn the steps' tokens into text and send it; True when a message went out.

    The tokens are consumed even while the channel is not open yet, so captions never
    arrive late in a burst: text the caller could not see live is not worth showing later.
    """
    text = stream.take(steps)
    if not text or channel is None or channel.readyState != "open":
        return False
    channel.send(caption_message(text, stream.frames))
    return True
