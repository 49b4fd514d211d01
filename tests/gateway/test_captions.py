"""Captions: token ids -> text (a real sentencepiece model trained here), and the text over a
real WebRTC data channel between two aiortc peers in one process, the gateway's `answer` on
one side and a browser-like offerer on the other."""

import asyncio
import json
import time
from pathlib import Path

import numpy as np
import pytest
from aiortc import RTCDataChannel, RTCPeerConnection, RTCSessionDescription
from numpy.typing import NDArray

from engine.ring import DownlinkFrame
from gateway.captions import (
    CaptionStream,
    SentencePieceCaptioner,
    caption_message,
    load_captioner,
    send_captions,
)
from gateway.ice import restrict_host_candidates
from gateway.media.clock import PumpGrid
from gateway.media.downlink import TOKEN_BACKLOG_FRAMES, Downlink
from gateway.media.jitter import JitterConfig
from gateway.media.opus import OpusDecoder
from gateway.media.uplink import Uplink
from gateway.webrtc import CAPTIONS_LABEL, answer
from tests.support.tokenizer import train_tiny_tokenizer


class TableCaptioner:
    """A captioner from a plain table: the stream logic needs no tokenizer to be tested."""

    def __init__(self, table: dict[int, str]) -> None:
        self.table = table

    def text(self, token: int) -> str:
        return self.table.get(token, "")


def steps(*text_tokens: int, codes: int = 8) -> list[NDArray[np.int32]]:
    """Moshi-shaped step outputs: the text token, then `codes` audio codes."""
    return [np.array([t, *range(codes)], np.int32) for t in text_tokens]


@pytest.fixture(scope="module")
def spm_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_tiny_tokenizer(tmp_path_factory.mktemp("spm"))


def test_sentencepiece_captioner_turns_tokens_back_into_the_words(spm_model: Path) -> None:
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=str(spm_model))
    ids = [int(i) for i in sp.encode("hello there how are you today")]
    captioner = SentencePieceCaptioner(spm_model, silent_ids=frozenset())
    assert "".join(captioner.text(i) for i in ids) == " hello there how are you today"
    assert captioner.text(sp.unk_id()) == ""
    assert captioner.text(sp.bos_id()) == ""  # control pieces carry no text
    assert captioner.text(-1) == captioner.text(10_000) == ""


def test_moshi_padding_ids_carry_no_text(spm_model: Path) -> None:
    captioner = load_captioner(spm_model)
    assert captioner is not None
    assert SentencePieceCaptioner(spm_model, silent_ids=frozenset()).text(3) != ""
    assert captioner.text(3) == ""
    assert captioner.text(0) == ""
    assert load_captioner(None) is None


def test_caption_stream_reads_the_text_token_and_skips_nothing_emitted() -> None:
    stream = CaptionStream(TableCaptioner({5: " hi", 6: " there", 7: ""}))
    assert stream.take(steps(5, -1, 6)) == " hi there"
    assert stream.take(steps(-1, 7, -1)) == ""
    assert stream.take([np.zeros(0, np.int32)]) == ""  # a model that emits no tokens (echo)
    assert (stream.frames, stream.pieces) == (7, 2)


def test_captions_wait_for_an_open_channel_and_drop_what_it_missed() -> None:
    class Channel:
        def __init__(self) -> None:
            self.readyState = "connecting"
            self.sent: list[str] = []

        def send(self, data: str) -> None:
            self.sent.append(data)

    stream = CaptionStream(TableCaptioner({5: " early", 6: " live"}))
    channel = Channel()
    assert not send_captions(stream, channel, steps(5))
    assert not send_captions(stream, None, steps(5))
    channel.readyState = "open"
    assert not send_captions(stream, channel, steps(-1))
    assert send_captions(stream, channel, steps(6))
    assert [json.loads(m) for m in channel.sent] == [
        {"type": "caption", "text": " live", "frame": 4}
    ]


def test_downlink_keeps_tokens_until_taken_and_bounds_them() -> None:
    downlink = Downlink(24000, 48000, 960, 0.12)
    pcm = np.zeros(1920, np.int16)
    downlink.accept(DownlinkFrame(f, pcm, s) for f, s in enumerate(steps(1, 2, 3), 1))
    assert [int(t[0]) for t in downlink.take_tokens()] == [1, 2, 3]
    assert downlink.take_tokens() == []
    many = steps(*range(TOKEN_BACKLOG_FRAMES + 10))
    downlink.accept(DownlinkFrame(f, pcm, s) for f, s in enumerate(many, 1))
    kept = downlink.take_tokens()
    assert len(kept) == TOKEN_BACKLOG_FRAMES
    assert int(kept[-1][0]) == TOKEN_BACKLOG_FRAMES + 9  # the newest are kept


async def _captions_over_webrtc() -> list[str]:
    restrict_host_candidates(["127.0.0.1"])
    grid = PumpGrid(time.monotonic(), 0.08, 4, 0.015)
    uplink = Uplink(OpusDecoder(24000), JitterConfig(), 24000, 1920, grid.step_s)
    downlink = Downlink(24000, 48000, 960, 0.12)
    browser = RTCPeerConnection()
    browser.addTransceiver("audio", direction="sendrecv")
    received: list[str] = []
    got_all = asyncio.Event()
    browser_channel = browser.createDataChannel(CAPTIONS_LABEL)

    @browser_channel.on("message")
    def on_message(message: str) -> None:
        received.append(message)
        if len(received) == 2:
            got_all.set()

    opened: asyncio.Queue[RTCDataChannel] = asyncio.Queue()

    async def on_state(state: str) -> None:
        return None

    await browser.setLocalDescription(await browser.createOffer())
    gateway, answer_sdp = await answer(
        browser.localDescription.sdp, uplink, downlink, grid, on_state, opened.put_nowait
    )
    try:
        await browser.setRemoteDescription(RTCSessionDescription(answer_sdp, "answer"))
        channel = await asyncio.wait_for(opened.get(), 20)
        assert channel.label == CAPTIONS_LABEL
        while channel.readyState != "open":
            await asyncio.sleep(0.01)
        stream = CaptionStream(TableCaptioner({11: " full", 12: " duplex"}))
        assert send_captions(stream, channel, steps(11, -1))
        assert send_captions(stream, channel, steps(12))
        await asyncio.wait_for(got_all.wait(), 20)
    finally:
        await browser.close()
        await gateway.close()
    return received


def test_the_gateway_sends_captions_on_the_pages_data_channel() -> None:
    received = asyncio.run(_captions_over_webrtc())
    assert received == [caption_message(" full", 2), caption_message(" duplex", 3)]
