"""The gateway's side of registration: a failed REGISTER is retried, with backoff, until one
succeeds; stopping cancels the retry."""

import asyncio
from pathlib import Path

import pytest

from gateway.config import GatewayConfig
from gateway.phone import registration as module
from gateway.phone.bridge import register_proxy
from gateway.phone.registration import Registration
from gateway.sip.events import Output, Registered, RegistrationFailed

AOR = "sip:cadence@trunk.example"


class Agent:
    def __init__(self) -> None:
        self.expires: list[int] = []  # every REGISTER asked for
        self.proxies: list[object] = []  # and where each was to be sent

    def register(self, registrar: str, aor: str, now: float, **options: object) -> list[Output]:
        self.expires.append(int(options["expires"]))  # type: ignore[call-overload]
        self.proxies.append(options["proxy"])
        return []


class Signalling:
    """What Registration uses of SipSignalling: its agent, and delivery of what it returns."""

    def __init__(self) -> None:
        self.agent = Agent()

    def deliver(self, outputs: list[Output]) -> None:
        assert outputs == []


def test_a_failed_registration_is_retried_with_backoff_until_it_succeeds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(module, "RETRY_FIRST_S", 0.05)
    monkeypatch.setattr(module, "RETRY_LONGEST_S", 0.1)

    async def scenario() -> None:
        signalling = Signalling()
        registration = Registration(signalling, AOR, None, None)  # type: ignore[arg-type]
        registration.start()
        registration.on_event(RegistrationFailed(AOR, None))  # the registrar did not answer
        assert registration.state == "failed"
        await asyncio.sleep(0.08)
        assert (registration.state, len(signalling.agent.expires)) == ("registering", 2)
        registration.on_event(RegistrationFailed(AOR, 503))
        await asyncio.sleep(0.07)
        assert len(signalling.agent.expires) == 2, "the second wait is longer: 0.1 s"
        await asyncio.sleep(0.06)
        assert len(signalling.agent.expires) == 3
        registration.on_event(Registered(AOR, 120))
        assert registration.state == "registered"
        await registration.stop()  # removes the binding
        assert signalling.agent.expires[-1] == 0

    asyncio.run(scenario())


def test_every_register_goes_through_the_outbound_proxy_when_there_is_one() -> None:
    async def scenario() -> None:
        direct, proxied = Signalling(), Signalling()
        Registration(direct, AOR, None, None).start()  # type: ignore[arg-type]
        through = Registration(proxied, AOR, None, None, ("10.0.0.9", 5070))  # type: ignore[arg-type]
        through.start()
        through.on_event(Registered(AOR, 120))
        await through.stop()
        assert direct.agent.proxies == [None]
        assert proxied.agent.proxies == [("10.0.0.9", 5070)] * 2, "the binding and its removal"

    asyncio.run(scenario())


def test_the_register_takes_the_outbound_proxy_unless_the_registrar_is_named() -> None:
    trunk = ("10.0.0.9", 5070)

    def config(**options: object) -> GatewayConfig:
        return GatewayConfig(Path("engine.sock"), sip_port=5062, sip_register=AOR, **options)  # type: ignore[arg-type]

    assert register_proxy(config()) is None  # the address-of-record's domain, directly
    assert register_proxy(config(sip_proxy=trunk)) == trunk
    named = config(sip_proxy=trunk, sip_registrar="sip:registrar.example")
    assert register_proxy(named) is None


def test_stopping_cancels_a_pending_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(module, "RETRY_FIRST_S", 0.05)

    async def scenario() -> None:
        signalling = Signalling()
        registration = Registration(signalling, AOR, None, None)  # type: ignore[arg-type]
        registration.start()
        registration.on_event(RegistrationFailed(AOR, 403))
        await registration.stop()
        await asyncio.sleep(0.1)
        assert signalling.agent.expires == [module.EXPIRES_S], "nothing sent after the stop"

    asyncio.run(scenario())


def test_refused_credentials_are_one_clear_error(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        registration = Registration(Signalling(), AOR, None, None)  # type: ignore[arg-type]
        registration.start()
        reason = 'realm "trunk.example" refused the credentials'
        with caplog.at_level("ERROR", logger=module.__name__):
            registration.on_event(RegistrationFailed(AOR, 401, reason))
        await registration.stop()

    asyncio.run(scenario())
    [record] = caplog.records
    assert record.getMessage() == (
        f'SIP registration of {AOR} failed: 401 (realm "trunk.example" refused the '
        "credentials); retrying in 30 s"
    )
