"""HTTP Digest authentication for SIP (RFC 3261 22, RFC 2617, RFC 7616): the client side.

A trunk or registrar answers 401 (WWW-Authenticate) or 407 (Proxy-Authenticate); the UA
retries with Authorization or Proxy-Authorization computed here. MD5 and SHA-256 (and their
-sess variants) with qop=auth, or the RFC 2069 form when the server offers no qop. auth-int is
not offered by the trunks Cadence targets and is refused. The client nonce and count are passed
in, so the computation stays deterministic and testable. `Answers` keeps every challenge one
request has drawn (a proxy's 407 and the registrar's 401), so each resend answers them all.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.sip.headers import SipParseError, split_outside_quotes

_HASHES = {"MD5": "md5", "SHA-256": "sha256"}
MAX_CHALLENGES = 4  # 401/407s one request may draw: a proxy's, a registrar's, 2 stale nonces


@dataclass(frozen=True)
class Challenge:
    realm: str
    nonce: str
    algorithm: str = "MD5"
    qop: tuple[str, ...] = ()
    opaque: str | None = None
    stale: bool = False


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str


def _unquote(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    return value


def parse_auth_params(value: str) -> tuple[str, dict[str, str]]:
    """`Scheme k=v, k="v"` -> (scheme, {lowercase key: unquoted value})."""
    scheme, _, rest = value.strip().partition(" ")
    params: dict[str, str] = {}
    for item in split_outside_quotes(rest, ","):
        if not item.strip():
            continue
        key, eq, raw = item.partition("=")
        if not eq or not key.strip():
            raise SipParseError(f"bad auth parameter {item!r}")
        params[key.strip().lower()] = _unquote(raw)
    return scheme, params


def parse_challenge(value: str) -> Challenge:
    scheme, params = parse_auth_params(value)
    if scheme.lower() != "digest" or "realm" not in params or "nonce" not in params:
        raise SipParseError(f"not a digest challenge: {value[:80]!r}")
    algorithm = params.get("algorithm", "MD5").upper()
    if algorithm.removesuffix("-SESS") not in _HASHES:
        raise SipParseError(f"unsupported digest algorithm {algorithm!r}")
    qop = tuple(q.strip().lower() for q in params.get("qop", "").split(",") if q.strip())
    if qop and "auth" not in qop:
        raise SipParseError("server requires a qop other than auth")
    return Challenge(
        params["realm"],
        params["nonce"],
        algorithm,
        qop,
        params.get("opaque"),
        params.get("stale", "").lower() == "true",
    )


def _hash(algorithm: str, text: str) -> str:
    return hashlib.new(_HASHES[algorithm.upper().removesuffix("-SESS")], text.encode()).hexdigest()


def response_digest(
    challenge: Challenge,
    credentials: Credentials,
    method: str,
    uri: str,
    cnonce: str,
    nonce_count: int,
) -> str:
    """The request-digest: H(HA1:nonce[:nc:cnonce:qop]:HA2)."""
    algorithm = challenge.algorithm
    ha1 = _hash(algorithm, f"{credentials.username}:{challenge.realm}:{credentials.password}")
    if algorithm.upper().endswith("-SESS"):
        ha1 = _hash(algorithm, f"{ha1}:{challenge.nonce}:{cnonce}")
    ha2 = _hash(algorithm, f"{method}:{uri}")
    if "auth" in challenge.qop:
        return _hash(algorithm, f"{ha1}:{challenge.nonce}:{nonce_count:08x}:{cnonce}:auth:{ha2}")
    return _hash(algorithm, f"{ha1}:{challenge.nonce}:{ha2}")


def authorization(
    challenge: Challenge,
    credentials: Credentials,
    method: str,
    uri: str,
    cnonce: str,
    nonce_count: int = 1,
) -> str:
    """The value of the Authorization / Proxy-Authorization header answering `challenge`."""
    digest = response_digest(challenge, credentials, method, uri, cnonce, nonce_count)
    parts = [
        f'username="{credentials.username}"',
        f'realm="{challenge.realm}"',
        f'nonce="{challenge.nonce}"',
        f'uri="{uri}"',
        f'response="{digest}"',
        f"algorithm={challenge.algorithm}",
    ]
    if "auth" in challenge.qop:
        parts += [f'cnonce="{cnonce}"', "qop=auth", f"nc={nonce_count:08x}"]
    if challenge.opaque is not None:
        parts.append(f'opaque="{challenge.opaque}"')
    return "Digest " + ", ".join(parts)


def verify(value: str, method: str, challenge: Challenge, password: str) -> bool:
    """Server side check of an Authorization value against the challenge we issued."""
    scheme, params = parse_auth_params(value)
    if scheme.lower() != "digest" or params.get("nonce") != challenge.nonce:
        return False
    nc_text = params.get("nc", "1")
    if not all(c in "0123456789abcdefABCDEF" for c in nc_text):
        return False
    expected = response_digest(
        challenge,
        Credentials(params.get("username", ""), password),
        method,
        params.get("uri", ""),
        params.get("cnonce", ""),
        int(nc_text, 16),
    )
    return params.get("response") == expected


@dataclass
class _Answer:
    header: str  # Authorization (a 401's challenge) or Proxy-Authorization (a 407's)
    challenge: Challenge
    sent: bool = False  # answered in a request already (a challenge again is a refusal)


@dataclass
class Answers:
    """The challenges one request has drawn, each answered again on every resend.

    RFC 3261 22.2-22.3: through a challenging proxy to a challenging registrar the request ends
    up carrying a Proxy-Authorization and an Authorization, one per realm, and the nonce count
    of each rises with every request that reuses its nonce (RFC 7616 3.4). A realm challenging
    again once answered refused the credentials unless the challenge says stale=true (RFC 7616
    3.3), whether or not its nonce is new: one wrong answer per request, not one per nonce.
    A stale challenge is answered again (the same nonce: its new details, the count going
    on; a new nonce: a new cnonce, counted from 1), up to MAX_CHALLENGES in all.

    `next_request` starts the answers of another request of the same dialog (a BYE, a
    re-INVITE after the INVITE): nothing answered yet, so its first challenge is no refusal,
    but a nonce answered before by any request of the dialog keeps its cnonce and counts on.
    """

    answers: dict[tuple[str, str], _Answer] = field(default_factory=dict)
    challenges: int = 0
    # every nonce met by the requests sharing this ledger: its cnonce and the last count sent
    nonces: dict[str, tuple[str, int]] = field(default_factory=dict)

    def next_request(self) -> Answers:
        """Empty answers for another request of the dialog, sharing its nonce ledger."""
        return Answers(nonces=self.nonces)

    def _fresh(self, header: str, challenge: Challenge, cnonce: Callable[[], str]) -> _Answer:
        self.nonces.setdefault(challenge.nonce, (cnonce(), 0))
        return _Answer(header, challenge)

    def take(self, status: int, values: list[str], cnonce: Callable[[], str]) -> str | None:
        """Take a 401's or 407's challenges: None to resend, else why the request failed."""
        header = "Authorization" if status == 401 else "Proxy-Authorization"
        self.challenges += 1
        if self.challenges > MAX_CHALLENGES:
            return f"still challenged after {MAX_CHALLENGES} answers"
        fresh: dict[str, Challenge] = {}
        for value in values:
            try:
                challenge = parse_challenge(value)
            except SipParseError:
                continue
            fresh.setdefault(challenge.realm, challenge)
        if not fresh:
            return "no digest challenge it could answer"
        for realm, challenge in fresh.items():
            old = self.answers.get((header, realm))
            if old is None or not old.sent:
                self.answers[header, realm] = self._fresh(header, challenge, cnonce)
            elif not challenge.stale:
                # answered and challenged again, not for a stale nonce: refused, whatever
                # the nonce (RFC 7616 3.3, RFC 2617 3.2.1); a new answer would be as wrong
                return f'realm "{realm}" refused the credentials'
            elif old.challenge.nonce == challenge.nonce:
                old.challenge = challenge  # its opaque, algorithm, qop; nc counts on
            else:
                self.answers[header, realm] = self._fresh(header, challenge, cnonce)
        return None

    def headers(
        self, credentials: Credentials, method: str, uri: str
    ) -> tuple[tuple[str, str], ...]:
        """The authorization headers of the next request, each with its nonce count + 1."""
        found: list[tuple[str, str]] = []
        for answer in self.answers.values():
            nonce = answer.challenge.nonce
            cnonce, count = self.nonces[nonce]
            self.nonces[nonce] = (cnonce, count + 1)
            answer.sent = True
            value = authorization(answer.challenge, credentials, method, uri, cnonce, count + 1)
            found.append((answer.header, value))
        return tuple(found)
