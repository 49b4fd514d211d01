"""The admission control socket: newline-delimited JSON over a Unix stream socket.

Requests and replies, one JSON object per line:

    {"op": "hello"}                         -> {"ok": true, "ring": NAME, "slots": S, ...}
    {"op": "open", "call_id": ID}           -> {"ok": true, "slot": S, "generation": G}
                                               (ID: 1-64 printable ASCII characters, no spaces)
                                               | {"ok": false, "reason":
                                                  "full" | "draining" | "starting"}
    {"op": "close", "slot": S, "generation": G}  -> {"ok": true, "closed": bool}
                                               (false: not this connection's call, or stale)
    {"op": "status"}                        -> {"ok": true, "state": ..., "calls": [...], ...}
    {"op": "stall", "seconds": S}           -> {"ok": true} | {"ok": false, "reason":
                                               "test_hooks_disabled"}  (0 < S <= 5)
    {"op": "age"}                           -> {"ok": true} | {"ok": false, "reason":
                                               "test_hooks_disabled" | "bad_request"}
    anything else                           -> {"ok": false, "reason": "bad_request", ...}

It runs on its own thread, never on the tick thread. When a connection closes, every slot it
opened is freed: a gateway that dies cannot leak slots. Replies are queued per connection and
written as the socket takes them: a peer that reads slowly (a status reply of hundreds of calls
outgrows the socket buffer) delays only itself, never another gateway's admission; one that
lets more than MAX_PENDING_BYTES of replies pile up is disconnected.

`stall` makes the next tick late on purpose, so an integration test can cause a real deadline
miss; `age` makes every live call's attention context count as full before the next step (a
benchmark of calls two minutes in, without waiting two minutes). Both are refused unless the
engine was started with --test-hooks.
"""

import json
import logging
import re
import selectors
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from engine.slots import Admission, AdmissionRefused, SlotTable

log = logging.getLogger(__name__)

MAX_LINE_BYTES = 64 * 1024
MAX_PENDING_BYTES = 16 * 1024 * 1024  # unread replies one connection may hold
ACCEPT_BACKOFF_S = 0.1  # after accept() fails (no file descriptors left, say): retry this late
# a call id travels into metric exemplars (128 characters at most, name included) and logs
CALL_ID = re.compile(r"[!-~]{1,64}")  # printable ASCII, no spaces

StatusFn = Callable[[], dict[str, Any]]
MAX_STALL_S = 5.0  # below the step watchdog's default limit (10 s): a stall is a miss, not a hang


class Hooks(Protocol):
    """What the test-only ops do (the engine, when started with --test-hooks)."""

    def stall(self, seconds: float) -> None: ...

    def age(self) -> None: ...


class AdmissionObserver(Protocol):
    """What the engine does when the table changes (publish to the ring, count)."""

    def opened(self, call_id: str, admission: Admission) -> None: ...

    def refused(self, call_id: str, reason: str) -> None: ...

    def closed(self, slot: int) -> None: ...


class ControlServer:
    def __init__(
        self,
        path: Path,
        table: SlotTable,
        hello: dict[str, Any],
        status: StatusFn,
        observer: AdmissionObserver,
        hooks: Hooks | None = None,
    ) -> None:
        self._path = path
        self._table = table
        self._hello = hello
        self._status = status
        self._observer = observer
        self._hooks = hooks  # None unless test hooks are on
        self._selector = selectors.DefaultSelector()
        self._buffers: dict[int, bytearray] = {}  # per connection: request bytes so far
        self._pending: dict[int, bytearray] = {}  # per connection: reply bytes not yet sent
        self._stop = threading.Event()
        path.unlink(missing_ok=True)
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(path))
        self._listener.listen(64)
        self._listener.setblocking(False)
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._thread = threading.Thread(target=self._serve, name="control", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)
        for key in list(self._selector.get_map().values()):
            self._selector.unregister(key.fileobj)
            key.fileobj.close()  # type: ignore[union-attr]
        self._selector.close()
        self._path.unlink(missing_ok=True)

    def _serve(self) -> None:
        while not self._stop.is_set():
            for key, events in self._selector.select(timeout=0.1):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if sock is self._listener:
                    self._accept()
                    continue
                if events & selectors.EVENT_WRITE and not self._flush(sock):
                    continue  # dropped
                if events & selectors.EVENT_READ:
                    self._read(sock)

    def _accept(self) -> None:
        try:
            conn, _ = self._listener.accept()
        except BlockingIOError:
            return
        except OSError as exc:  # EMFILE, ENOBUFS...: the connection waits in the backlog
            log.warning("control socket cannot accept a connection now: %s", exc)
            self._stop.wait(ACCEPT_BACKOFF_S)
            return
        conn.setblocking(False)
        self._buffers[conn.fileno()] = bytearray()
        self._pending[conn.fileno()] = bytearray()
        self._selector.register(conn, selectors.EVENT_READ)

    def _read(self, conn: socket.socket) -> None:
        owner = conn.fileno()
        try:
            data = conn.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(conn)
            return
        buf = self._buffers[owner]
        buf += data
        while b"\n" in buf:
            line, _, rest = bytes(buf).partition(b"\n")
            buf[:] = rest
            reply = self._handle(line, owner)
            self._pending[owner] += json.dumps(reply).encode() + b"\n"
            if len(self._pending[owner]) > MAX_PENDING_BYTES:
                log.warning("control connection does not read its replies; closing it")
                self._drop(conn)
                return
            if not self._flush(conn):
                return
        if len(buf) > MAX_LINE_BYTES:
            log.warning("control connection sent an over-long line; closing it")
            self._drop(conn)

    def _flush(self, conn: socket.socket) -> bool:
        """Send what the socket takes now; watch for writability while some is left.
        False when the connection was dropped."""
        pending = self._pending[conn.fileno()]
        try:
            sent = conn.send(pending) if pending else 0
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._drop(conn)
            return False
        del pending[:sent]
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if pending else 0)
        if self._selector.get_key(conn).events != events:
            self._selector.modify(conn, events)
        return True

    def _drop(self, conn: socket.socket) -> None:
        owner = conn.fileno()
        for info in self._table.close_owner(owner):
            log.info("gateway connection closed: freed slot %d (call %s)", info.slot, info.call_id)
            self._observer.closed(info.slot)
        self._buffers.pop(owner, None)
        self._pending.pop(owner, None)
        self._selector.unregister(conn)
        conn.close()

    def _handle(self, line: bytes, owner: int) -> dict[str, Any]:
        try:
            request = json.loads(line)
            if not isinstance(request, dict):
                raise ValueError("a request is a JSON object")
            op = request.get("op")
            if op == "hello":
                return {"ok": True, **self._hello}
            if op == "status":
                return {"ok": True, **self._status()}
            if op == "open":
                return self._open(_call_id(request["call_id"]), owner)
            if op == "close":
                slot, generation = int(request["slot"]), int(request["generation"])
                closed = self._table.close(slot, generation, owner)
                if closed:
                    self._observer.closed(slot)
                return {"ok": True, "closed": closed}
            if op == "stall":
                return self._stall_next_tick(float(request["seconds"]))
            if op == "age":
                if self._hooks is None:
                    return {"ok": False, "reason": "test_hooks_disabled"}
                self._hooks.age()
                return {"ok": True}
            raise ValueError(f"unknown op {op!r}")
        except (ValueError, KeyError, TypeError, OverflowError, RecursionError) as exc:
            # OverflowError: int(1e400); RecursionError: JSON nested past the parser's depth
            return {"ok": False, "reason": "bad_request", "detail": str(exc)[:200]}
        except Exception:
            # this thread admits every call of every gateway: a bug in one request's handling
            # is answered and logged, never allowed to end it
            log.exception("control request failed: %r", line[:200])
            return {"ok": False, "reason": "internal_error"}

    def _stall_next_tick(self, seconds: float) -> dict[str, Any]:
        if self._hooks is None:
            return {"ok": False, "reason": "test_hooks_disabled"}
        if not 0.0 < seconds <= MAX_STALL_S:
            raise ValueError(f"stall seconds must be in (0, {MAX_STALL_S:g}]")
        log.warning("test hook: stalling the next tick by %.3f s", seconds)
        self._hooks.stall(seconds)
        return {"ok": True}

    def _open(self, call_id: str, owner: int) -> dict[str, Any]:
        try:
            admission = self._table.open(call_id, owner)
        except AdmissionRefused as refused:
            self._observer.refused(call_id, refused.reason)
            return {"ok": False, "reason": refused.reason}
        self._observer.opened(call_id, admission)
        return {"ok": True, "slot": admission.slot, "generation": admission.generation}


def _call_id(value: object) -> str:
    if not isinstance(value, str) or CALL_ID.fullmatch(value) is None:
        raise ValueError("call_id must be 1 to 64 printable ASCII characters without spaces")
    return value


class ControlError(ConnectionError):
    """The control socket is not there, closed, or answered something that is not a reply."""


def ask(sock: socket.socket, request: dict[str, Any]) -> dict[str, Any]:
    """One request and its reply over a connected blocking socket (for tools and tests; the
    gateway's asyncio client is gateway/engine_client.py). Slots opened on `sock` stay open as
    long as it does."""
    sock.sendall(json.dumps(request).encode() + b"\n")
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(65536)
        if not chunk:
            raise ControlError("the engine closed its control socket")
        data += chunk
    reply = json.loads(data)
    if not isinstance(reply, dict):
        raise ControlError("the engine sent a malformed reply")
    return reply


def ask_once(path: Path, request: dict[str, Any], timeout_s: float = 5.0) -> dict[str, Any]:
    """Connect, ask one thing, disconnect."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        try:
            sock.connect(str(path))
        except OSError as exc:
            raise ControlError(f"engine control socket {path}: {exc}") from exc
        return ask(sock, request)
