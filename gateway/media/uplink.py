"""The receive path of one call: jitter buffer -> decode or conceal -> resample -> framer.

Sans-IO: RTP payloads go in with their arrival time, the media clock pumps it every
sub-period, and `take_frame` hands the engine's exact frame (int16) to whoever writes the
ring. The codec sits behind `AudioDecoder`, so Opus and G.711 share everything else.
"""

from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from gateway.media.framer import Framer
from gateway.media.jitter import Arrival, JitterBuffer, JitterConfig, Unit
from gateway.media.pcm import to_float32, to_int16
from gateway.media.resample import Resampler


class AudioDecoder(Protocol):
    """A codec's decoder at its own output `rate` (the RTP clock's for G.711; Opus decodes at
    any of its rates whatever its 48 kHz clock); every method returns mono int16 samples, and
    `conceal` and `recover` take their length at that rate.

    `decode` and `recover` raise ValueError for a packet they cannot decode."""

    rate: int

    def decode(self, packet: bytes) -> NDArray[np.int16]: ...

    def conceal(self, samples: int) -> NDArray[np.int16]: ...

    def recover(self, next_packet: bytes, samples: int) -> NDArray[np.int16]: ...


class Uplink:
    def __init__(
        self,
        decoder: AudioDecoder,
        jitter: JitterConfig,
        model_rate: int,
        frame_samples: int,
        pump_period_s: float,
        longest_packet_s: float = 0.02,
    ) -> None:
        """`longest_packet_s`: the longest packet the stream may carry. A packet is decoded
        whole at one pump, up to (packet - pump period) ahead of the framer's schedule, so the
        framer's backlog must hold that much or it would cut audio out of every long packet."""
        self.jitter = JitterBuffer(jitter)
        self._decoder = decoder
        self._clock_rate = jitter.clock_rate  # the jitter buffer's durations are in its ticks
        self._resampler = (
            None if decoder.rate == model_rate else Resampler(decoder.rate, model_rate)
        )
        self._pump_samples = round(pump_period_s * decoder.rate)
        self._credit = 0  # decoder-rate samples owed to the framer
        ahead = max(0, round((longest_packet_s - pump_period_s) * model_rate))
        self.framer = Framer(frame_samples, max_backlog=frame_samples // 4 + ahead)
        self.concealed = 0  # packets' worth of audio made up by the codec
        self.undecodable = 0  # packets the codec refused (concealed instead)
        self._delays: list[float] = []  # played packets' delays since the last take_delays

    def receive(
        self, seq: int, timestamp: int, payload: bytes, now_s: float, ssrc: int | None = None
    ) -> Arrival:
        return self.jitter.push(seq, timestamp, payload, now_s, ssrc)

    def pump(self, now_s: float) -> None:
        """Move one pump period of audio from the jitter buffer into the framer."""
        self._credit += self._pump_samples
        while self._credit > 0:
            pcm = self._play(now_s)
            self._credit -= max(pcm.size, 1)
            self._feed(pcm)

    def _play(self, now_s: float) -> NDArray[np.int16]:
        out = self.jitter.pull(now_s)
        samples = out.samples * self._decoder.rate // self._clock_rate
        if out.unit is Unit.WAITING:
            return np.zeros(samples, np.int16)
        try:
            if out.unit is Unit.PACKET:
                assert out.payload is not None
                assert out.delay_s is not None
                self._delays.append(out.delay_s)
                return self._decoder.decode(out.payload)
            self.concealed += 1
            if out.unit is Unit.LOST and out.payload is not None:
                return self._decoder.recover(out.payload, samples)
        except ValueError:
            # a peer's malformed packet must not raise out of the pump, which serves every call;
            # counted when it is played, not again when its FEC was tried for the loss before it
            if out.unit is Unit.PACKET:
                self.undecodable += 1
                self.concealed += 1
        try:
            return self._decoder.conceal(samples)
        except ValueError:  # a length the codec cannot conceal: silence, the call goes on
            self.undecodable += 1
            return np.zeros(samples, np.int16)

    def _feed(self, pcm: NDArray[np.int16]) -> None:
        x = to_float32(pcm)
        if self._resampler is not None:
            x = self._resampler.process(x)
        self.framer.push(x)

    def take_delays(self) -> list[float]:
        delays, self._delays = self._delays, []
        return delays

    def take_frame(self) -> NDArray[np.int16]:
        return to_int16(self.framer.take())
