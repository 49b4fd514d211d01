"""Every Prometheus metric of the gateway process, in one registry.

Names follow cadence_gateway_<what>_<unit> in base units; labels are bounded (transport,
outcome, reason) and never carry a call id: a call id travels only as an exemplar on the sample
a call caused (its setup time, a packet's delay, a loss), so an operator can go from a spike to
the call's record at /v1/calls/{id}. Served as OpenMetrics when asked, which keeps exemplars.
"""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

JITTER_BUCKETS = (0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5)
SETUP_BUCKETS = (0.01, 0.025, 0.05, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
LAG_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16)

# Every label value known up front, so each series exists (at zero) from the first scrape:
# a rate over a series that appears only with its first event reads "no data", not 0.
TRANSPORTS = ("webrtc", "sip")
CALL_OUTCOMES = ("completed", "failed")
REFUSAL_REASONS = ("full", "draining", "starting", "unavailable")
PACKET_OUTCOMES = ("played", "lost", "late", "duplicate", "dropped")


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.calls_active = Gauge(
            "cadence_gateway_calls_active", "Calls in progress.", ["transport"], registry=r
        )
        self.calls = Counter(
            "cadence_gateway_calls_total",
            "Calls ended, by transport and outcome (completed, failed); refusals are counted "
            "in cadence_gateway_admission_refusals_total.",
            ["transport", "outcome"],
            registry=r,
        )
        self.admission_refusals = Counter(
            "cadence_gateway_admission_refusals_total",
            "Calls the engine refused, by reason (full, draining, unavailable).",
            ["reason"],
            registry=r,
        )
        self.setup_duration = Histogram(
            "cadence_gateway_call_setup_duration_seconds",
            "Time from a call request to its answer.",
            ["transport"],
            buckets=SETUP_BUCKETS,
            registry=r,
        )
        self.jitter_delay = Histogram(
            "cadence_gateway_jitter_buffer_delay_seconds",
            "Played-out delay of received packets beyond their earliest possible playout.",
            ["transport"],
            buckets=JITTER_BUCKETS,
            registry=r,
        )
        self.packets = Counter(
            "cadence_gateway_packets_total",
            "Received audio packets by outcome (played, lost, late, duplicate, dropped).",
            ["transport", "outcome"],
            registry=r,
        )
        self.concealed = Counter(
            "cadence_gateway_concealed_packets_total",
            "Packets' worth of audio made up by loss concealment.",
            ["transport"],
            registry=r,
        )
        self.send_queue = Histogram(
            "cadence_gateway_send_queue_seconds",
            "Audio queued for sending (send-queue depth), sampled at every pump.",
            buckets=(0.0, 0.02, 0.04, 0.06, 0.08, 0.1, 0.12, 0.16, 0.2),
            registry=r,
        )
        self.loop_lag = Histogram(
            "cadence_gateway_event_loop_lag_seconds",
            "How late the media clock's pumps ran against their instants.",
            buckets=LAG_BUCKETS,
            registry=r,
        )
        self.late_frames = Counter(
            "cadence_gateway_late_frames_total",
            "Uplink frames written to the engine's ring after their tick's release, or never "
            "(their pump instant skipped after a media-clock stall): the gateway's share of "
            "the engine's underruns.",
            ["transport"],
            registry=r,
        )
        self.dtmf_digits = Counter(
            "cadence_gateway_dtmf_digits_total",
            "Key presses received as RFC 4733 telephone-events.",
            ["transport"],
            registry=r,
        )
        self.engine_up = Gauge(
            "cadence_gateway_engine_up", "1 while the engine's control socket is up.", registry=r
        )
        self._create_series()

    def _create_series(self) -> None:
        for reason in REFUSAL_REASONS:
            self.admission_refusals.labels(reason)
        for transport in TRANSPORTS:
            self.calls_active.labels(transport)
            self.setup_duration.labels(transport)
            self.jitter_delay.labels(transport)
            self.concealed.labels(transport)
            self.late_frames.labels(transport)
            self.dtmf_digits.labels(transport)
            for outcome in CALL_OUTCOMES:
                self.calls.labels(transport, outcome)
            for outcome in PACKET_OUTCOMES:
                self.packets.labels(transport, outcome)
