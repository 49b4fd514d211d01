"""Digest authentication against the worked examples of RFC 2617 and RFC 7616."""

from __future__ import annotations

import pytest

from gateway.sip.digest import (
    Answers,
    Challenge,
    Credentials,
    authorization,
    parse_auth_params,
    parse_challenge,
    response_digest,
    verify,
)
from gateway.sip.headers import SipParseError

RFC7616_NONCE = "7ypf/xlj9XXwfDPEoM4URrv/xwf94BcCAzFZH4GiTo0v"
RFC7616_CNONCE = "f2/wE4q74E6zIJEtWaHKaf5wv/H5QzzpXusqGemxURZJ"


def test_rfc2617_md5_example() -> None:
    challenge = Challenge(
        "testrealm@host.com", "dcd98b7102dd2f0e8b11d0f600bfb0c093", "MD5", ("auth",)
    )
    credentials = Credentials("Mufasa", "Circle Of Life")
    digest = response_digest(challenge, credentials, "GET", "/dir/index.html", "0a4f113b", 1)
    assert digest == "6629fae49393a05397450978507c4ef1"


@pytest.mark.parametrize(
    ("algorithm", "expected"),
    [
        ("MD5", "8ca523f5e9506fed4657c9700eebdbec"),
        ("SHA-256", "753927fa0e85d155564e2e272a28d1802ca10daf4496794697cf8db5856cb6c1"),
    ],
)
def test_rfc7616_examples(algorithm: str, expected: str) -> None:
    challenge = Challenge("http-auth@example.org", RFC7616_NONCE, algorithm, ("auth",))
    credentials = Credentials("Mufasa", "Circle of Life")
    digest = response_digest(challenge, credentials, "GET", "/dir/index.html", RFC7616_CNONCE, 1)
    assert digest == expected


def test_parse_challenge_from_asterisk_style_header() -> None:
    value = 'Digest  realm="asterisk",nonce="1701253201/abc",opaque="7e5a",algorithm=md5,qop="auth"'
    assert parse_challenge(value) == Challenge(
        "asterisk", "1701253201/abc", "MD5", ("auth",), "7e5a"
    )


def test_authorization_round_trips_through_verify() -> None:
    challenge = Challenge("trunk", "n1", "SHA-256-sess", ("auth", "auth-int"), "op")
    value = authorization(challenge, Credentials("alice", "pw"), "REGISTER", "sip:trunk", "c1", 2)
    scheme, params = parse_auth_params(value)
    assert scheme == "Digest"
    assert (params["nc"], params["qop"], params["opaque"]) == ("00000002", "auth", "op")
    assert verify(value, "REGISTER", challenge, "pw")
    assert not verify(value, "REGISTER", challenge, "wrong")
    assert not verify(value, "INVITE", challenge, "pw")


def test_rfc2069_form_without_qop() -> None:
    challenge = Challenge("r", "n")
    value = authorization(challenge, Credentials("u", "p"), "INVITE", "sip:x", "c")
    assert "qop" not in value
    assert verify(value, "INVITE", challenge, "p")


@pytest.mark.parametrize(
    "value",
    [
        'Basic realm="x"',
        'Digest nonce="n"',
        'Digest realm="r", nonce="n", algorithm=SHA-512-256',
        'Digest realm="r", nonce="n", qop="auth-int"',
        'Digest realm="r", nonce',
    ],
)
def test_unusable_challenges_raise(value: str) -> None:
    with pytest.raises(SipParseError):
        parse_challenge(value)


def test_answers_keep_every_realm_and_count_each_nonce_on() -> None:
    answers = Answers()
    tokens = iter(["c1", "c2", "c3"])
    two_proxies = ['Digest realm="a", nonce="na", qop="auth"', 'Digest realm="b", nonce="nb"']
    assert answers.take(407, two_proxies, lambda: next(tokens)) is None
    assert answers.take(401, ['Digest realm="r", nonce="nr"'], lambda: next(tokens)) is None
    sent = answers.headers(Credentials("u", "p"), "REGISTER", "sip:r")
    assert [(name, parse_auth_params(v)[1]["realm"]) for name, v in sent] == [
        ("Proxy-Authorization", "a"),
        ("Proxy-Authorization", "b"),
        ("Authorization", "r"),
    ]
    again = answers.headers(Credentials("u", "p"), "REGISTER", "sip:r")
    assert parse_auth_params(again[0][1])[1]["nc"] == "00000002"
    stale = ['Digest realm="a", nonce="na", qop="auth", stale=true']
    assert answers.take(407, stale, lambda: "c4") is None  # stale: answered again
    refused = answers.take(407, ['Digest realm="b", nonce="nb"'], lambda: "c5")
    assert refused == 'realm "b" refused the credentials'


def test_a_realm_answered_and_challenged_again_without_stale_refused_whatever_the_nonce() -> None:
    """RFC 7616 3.3 / RFC 2617 3.2.1: only stale=true asks for a new answer; a new nonce
    without it means the credentials were refused (retrying would send wrong ones again)."""
    answers = Answers()
    assert answers.take(401, ['Digest realm="r", nonce="n1", qop="auth"'], lambda: "c1") is None
    answers.headers(Credentials("u", "p"), "REGISTER", "sip:r")
    refused = answers.take(401, ['Digest realm="r", nonce="n2", qop="auth"'], lambda: "c2")
    assert refused == 'realm "r" refused the credentials'


def test_stale_challenges_are_answered_up_to_the_bound() -> None:
    answers = Answers()
    assert answers.take(401, ['Digest realm="r", nonce="n1"'], lambda: "c") is None
    for n in range(2, 5):
        answers.headers(Credentials("u", "p"), "REGISTER", "sip:r")
        stale = [f'Digest realm="r", nonce="n{n}", stale=true']
        assert answers.take(401, stale, lambda: "c") is None
    answers.headers(Credentials("u", "p"), "REGISTER", "sip:r")
    last = answers.take(401, ['Digest realm="r", nonce="n5", stale=true'], lambda: "c")
    assert last == "still challenged after 4 answers"


def test_a_stale_challenge_repeating_the_nonce_replaces_the_challenge() -> None:
    """The new challenge's opaque, algorithm and qop are answered; the nonce being the same,
    its cnonce stays and its nonce count rises."""
    answers = Answers()
    first = 'Digest realm="r", nonce="n", qop="auth", opaque="o1"'
    assert answers.take(401, [first], lambda: "c1") is None
    answers.headers(Credentials("u", "p"), "REGISTER", "sip:r")
    again = 'Digest realm="r", nonce="n", qop="auth", opaque="o2", algorithm=SHA-256, stale=true'
    assert answers.take(401, [again], lambda: "c2") is None
    [(name, value)] = answers.headers(Credentials("u", "p"), "REGISTER", "sip:r")
    params = parse_auth_params(value)[1]
    assert (name, params["opaque"], params["algorithm"]) == ("Authorization", "o2", "SHA-256")
    assert (params["cnonce"], params["nc"]) == ("c1", "00000002")
    challenge = Challenge("r", "n", "SHA-256", ("auth",), "o2")
    assert verify(value, "REGISTER", challenge, "p")


def test_next_request_of_the_dialog_answers_afresh_and_counts_a_known_nonce_on() -> None:
    """A BYE after the INVITE: its first challenge is no refusal (the BYE carried nothing),
    and the nonce the INVITE answered keeps its cnonce, its count rising (RFC 7616 3.4)."""
    invite = Answers()
    challenge = ['Digest realm="r", nonce="n", qop="auth"']
    assert invite.take(401, challenge, lambda: "c1") is None
    invite.headers(Credentials("u", "p"), "INVITE", "sip:r")
    bye = invite.next_request()
    assert bye.answers == {}
    assert bye.challenges == 0
    assert bye.take(401, challenge, lambda: "c2") is None
    [(_, value)] = bye.headers(Credentials("u", "p"), "BYE", "sip:r")
    params = parse_auth_params(value)[1]
    assert (params["cnonce"], params["nc"]) == ("c1", "00000002")
    assert verify(value, "BYE", Challenge("r", "n", qop=("auth",)), "p")
    # challenged again without stale: refused, as for any request
    assert bye.take(401, challenge, lambda: "c3") == 'realm "r" refused the credentials'
    # a new nonce starts from 1 with a new cnonce
    update = invite.next_request()
    assert update.take(401, ['Digest realm="r", nonce="m", qop="auth"'], lambda: "c4") is None
    [(_, value)] = update.headers(Credentials("u", "p"), "UPDATE", "sip:r")
    params = parse_auth_params(value)[1]
    assert (params["cnonce"], params["nc"]) == ("c4", "00000001")
