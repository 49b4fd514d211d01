"""The gateway's HTTP surface: the call API, health, metrics and the demo page.

    POST   /v1/calls        {"sdp": OFFER, "type": "offer"} -> 201 {"id", "sdp", "type"}
    POST   /v1/calls/sip    {"uri", "from"?, "username"?, "password"?} -> 201 {"id", "state"}:
                            a phone call placed through the SIP bridge (with --sip-port)
    GET    /v1/calls        live calls with their per-call records
    GET    /v1/calls/{id}   one call's record; 410 with the final record (and why it ended)
                            for a recently ended call
    DELETE /v1/calls/{id}   hang up; 200 with the final record
    GET    /v1/config       what the page needs: ICE servers, whether the API needs a token,
                            whether captions are sent, the model served, the tick period
    GET    /healthz         200 while the engine ticks, 503 otherwise; engine load
    GET    /metrics         Prometheus exposition
    GET    /                the demo page (web/)

Errors are JSON {"error": CODE, "detail": TEXT} with a fitting status: 400 for a bad request
or offer, 401 without the configured bearer token, 404 for an unknown call or path under
/v1/, 405 for a method a path does not take (with Allow), 413 for a body over
MAX_BODY_BYTES, 503 with Retry-After when the engine is full, draining or down.

With an auth token configured, only the call API (/v1/calls...) asks for it: the page, its
config, health and metrics stay open, and the token is never served — the person calling
types it in (or opens the page with #token=...), so loading the page grants nothing.
"""

import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from prometheus_client.exposition import choose_encoder

from engine.ring import EngineState, SlotState
from gateway.calls import RETRY_AFTER_S, CallRefused, CallRegistry
from gateway.phone.bridge import DialError, DialUnavailable, PhoneBridge
from gateway.sip.digest import Credentials
from gateway.webrtc import OfferError

log = logging.getLogger(__name__)

CALLS: web.AppKey[CallRegistry] = web.AppKey("calls", CallRegistry)
PHONE: web.AppKey[PhoneBridge] = web.AppKey("phone", PhoneBridge)
MAX_OFFER_BYTES = 64 * 1024
MAX_BODY_BYTES = 2 * MAX_OFFER_BYTES  # a request body past this is refused with 413
# aiohttp's own refusals under /v1/, as the API's error codes (json_errors)
HTTP_ERROR_CODES = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}
STALE_HEARTBEAT_S = 1.0
DIAL_RETRY_AFTER_S = 10  # an RTP port or the SIP socket may free up by then


def error(
    status: int, code: str, detail: str, headers: dict[str, str] | None = None
) -> web.Response:
    return web.json_response({"error": code, "detail": detail}, status=status, headers=headers)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The API's refusals that aiohttp makes itself (an unknown path or method, a body past
    MAX_BODY_BYTES) answered as JSON errors like the rest, under /v1/ only; a bug there is
    logged and answered as a JSON 500, not aiohttp's text page."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400 or not request.path.startswith("/v1/"):
            raise
        code = HTTP_ERROR_CODES.get(exc.status, "http_error")
        detail = exc.reason
        if exc.status == 413:
            detail = f"the request body is larger than {MAX_BODY_BYTES} bytes"
        allow = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
        return error(exc.status, code, detail, allow)
    except Exception:
        if not request.path.startswith("/v1/"):
            raise
        log.exception("%s %s failed", request.method, request.path)
        return error(500, "internal_error", "the gateway failed this request; see its log")


@web.middleware
async def require_token(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Bearer-token check of the call API, when the gateway is configured with a token."""
    token = request.app[CALLS].config.auth_token
    if token is None or not request.path.startswith("/v1/calls"):
        return await handler(request)
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not _same_token(given, token):
        return error(
            401,
            "unauthorized",
            "this gateway needs 'Authorization: Bearer <token>'",
            {"WWW-Authenticate": 'Bearer realm="cadence"'},
        )
    return await handler(request)


def _same_token(given: str, token: str) -> bool:
    try:
        presented = given.encode()
    except UnicodeEncodeError:  # a header byte that is no character: not the token either
        return False
    return hmac.compare_digest(presented, token.encode())


async def _json_body(request: web.Request) -> object:
    """The request's JSON body; ValueError if it is none (RecursionError: nested past the
    parser's depth, well inside the size limit; LookupError: a Content-Type charset Python
    has no codec for)."""
    try:
        return await request.json(loads=json.loads)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError, LookupError) as exc:
        raise ValueError(str(exc)) from None


async def create_call(request: web.Request) -> web.Response:
    calls = request.app[CALLS]
    try:
        body = await _json_body(request)
    except ValueError:
        return error(400, "bad_request", 'the body must be JSON: {"sdp": ..., "type": "offer"}')
    if not isinstance(body, dict) or not isinstance(body.get("sdp"), str):
        return error(400, "bad_request", 'the body needs an "sdp" string')
    if body.get("type", "offer") != "offer":
        return error(400, "bad_request", "only SDP offers are accepted")
    if len(body["sdp"]) > MAX_OFFER_BYTES:
        return error(400, "bad_request", "the offer is too large")
    try:
        call, answer_sdp = await calls.start_webrtc(body["sdp"])
    except CallRefused as refused:
        retry = str(RETRY_AFTER_S.get(refused.reason, 10))
        return error(503, f"engine_{refused.reason}", str(refused), {"Retry-After": retry})
    except OfferError as exc:
        return error(400, "bad_offer", str(exc))
    return web.json_response({"id": call.id, "sdp": answer_sdp, "type": "answer"}, status=201)


async def dial_sip(request: web.Request) -> web.Response:
    phone = request.app.get(PHONE)
    if phone is None:
        return error(404, "sip_off", "this gateway has no SIP bridge (start it with --sip-port)")
    try:
        body = await _json_body(request)
    except ValueError:
        return error(400, "bad_request", 'the body must be JSON: {"uri": "sip:..."}')
    fields = ("uri", "username", "password", "from")
    if not isinstance(body, dict) or not isinstance(body.get("uri"), str):
        return error(400, "bad_request", 'the body needs a "uri" string')
    if any(body.get(f) is not None and not isinstance(body[f], str) for f in fields):
        return error(400, "bad_request", "uri, from, username and password must be strings")
    username, password = body.get("username"), body.get("password")
    credentials = Credentials(username, password or "") if username else None
    try:
        call = await phone.dial(body["uri"], credentials, body.get("from"))
    except CallRefused as refused:
        retry = str(RETRY_AFTER_S.get(refused.reason, 10))
        return error(503, f"engine_{refused.reason}", str(refused), {"Retry-After": retry})
    except DialError as exc:
        return error(400, "bad_uri", str(exc))
    except DialUnavailable as exc:
        return error(503, "dial_unavailable", str(exc), {"Retry-After": str(DIAL_RETRY_AFTER_S)})
    return web.json_response({"id": call.id, "state": call.state}, status=201)


async def list_calls(request: web.Request) -> web.Response:
    calls = request.app[CALLS]
    return web.json_response({"calls": [calls.record(c) for c in calls.calls.values()]})


async def get_call(request: web.Request) -> web.Response:
    calls = request.app[CALLS]
    call_id = request.match_info["call_id"]
    call = calls.calls.get(call_id)
    if call is None:
        final = calls.ended.get(call_id)
        if final is not None:
            reason = final["end_reason"]
            body = {"error": "call_ended", "detail": f"the call ended: {reason}", "call": final}
            return web.json_response(body, status=410)
        return error(404, "not_found", "no such live call")
    return web.json_response(calls.record(call))


async def delete_call(request: web.Request) -> web.Response:
    calls = request.app[CALLS]
    record = await calls.end(request.match_info["call_id"], "hangup")
    if record is None:
        return error(404, "not_found", "no such live call")
    return web.json_response(record)


async def get_config(request: web.Request) -> web.Response:
    calls = request.app[CALLS]
    config = calls.config
    _, period_ns = calls.ring.clock()
    return web.json_response(
        {
            "ice_servers": config.browser_ice_servers(),
            "auth": "bearer" if config.auth_token is not None else "none",
            "captions": calls.captioner is not None,
            "model": calls.engine.hello.get("model"),  # what the engine serves: echo, moshi
            "tick_ms": period_ns / 1e6,
            "slots": calls.ring.spec.slots,
        }
    )


async def healthz(request: web.Request) -> web.Response:
    calls = request.app[CALLS]
    state, age = engine_health(calls)
    body: dict[str, Any] = {
        "engine": state,
        "heartbeat_age_s": round(age, 3),
        "calls": len(calls.calls),
        "slots": calls.ring.spec.slots,
        # every gateway's calls: the engine's load, not this process's share of it
        "slots_live": int((calls.ring.control["state"] == SlotState.LIVE).sum()),
    }
    phone = request.app.get(PHONE)
    if phone is not None:
        body["sip_dialogs"] = phone.agent.live_dialogs()
        body["rtp_ports_free"] = phone.ports.free
        if phone.registration is not None:
            body["sip_registration"] = phone.registration.state
    ok = state == "ready" and calls.engine.connected and age < STALE_HEARTBEAT_S
    body["status"] = "ok" if ok else "unhealthy"
    return web.json_response(body, status=200 if ok else 503)


def engine_health(calls: CallRegistry) -> tuple[str, float]:
    _, beat_ns = calls.ring.heartbeat()
    age = time.monotonic() - beat_ns / 1e9
    try:
        state = calls.ring.engine_state().name.lower()
    except ValueError:
        state = "unknown"
    if not calls.engine.connected:
        state = EngineState.STOPPED.name.lower()
    return state, age


async def metrics(request: web.Request) -> web.Response:
    # OpenMetrics when the scraper asks for it (Prometheus does): only it carries exemplars
    encode, content_type = choose_encoder(request.headers.get("Accept", ""))
    body = encode(request.app[CALLS].metrics.registry)
    return web.Response(body=body, headers={"Content-Type": content_type})


async def index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(request.app[CALLS].config.web_root / "index.html")


def build_app(calls: CallRegistry, phone: PhoneBridge | None = None) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[json_errors, require_token])
    app[CALLS] = calls
    if phone is not None:
        app[PHONE] = phone
    app.router.add_post("/v1/calls", create_call)
    app.router.add_post("/v1/calls/sip", dial_sip)
    app.router.add_get("/v1/calls", list_calls)
    app.router.add_get("/v1/calls/{call_id}", get_call)
    app.router.add_delete("/v1/calls/{call_id}", delete_call)
    app.router.add_get("/v1/config", get_config)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/", index)
    app.router.add_static("/static", calls.config.web_root)
    return app
