// The demo page: wires the Call / Hang up buttons to a CallSession, polls the server while a
// call lasts, and turns every way a call can fail into one notice a person understands.
// The page's state is on window.cadence for tests (state, notice kind, levels, panel values).

import { Api, ApiError } from "./api.js";
import { CallSession } from "./call.js";
import { Meters } from "./meters.js";
import { Panel } from "./panel.js";

const RECORD_POLL_MS = 1000;
const HEALTH_POLL_MS = 2500;
const CAPTION_KEEP_CHARS = 600;

const $ = (id) => document.getElementById(id);
const api = new Api();
const meters = new Meters($("level-in"), $("level-out"));
const panel = new Panel(document);
let config = null;
let session = null;
let recordTimer = null;
let polling = false;

const page = {
  state: "idle", notice: null, notices: [], meters, panel, get session() { return session; },
};
window.cadence = page;

// What the person reads for each way a call fails or ends; `action` labels the button.
const NOTICES = {
  "mic-denied": { tone: "bad", action: "Try again",
    text: "Microphone blocked. Allow this site to use the microphone (the icon in the address bar), then try again." },
  "mic-missing": { tone: "bad", action: "Try again", text: "No microphone found. Connect one and try again." },
  "mic-failed": { tone: "bad", action: "Try again", text: "The microphone could not be opened." },
  "server-full": { tone: "warn", action: "Try again",
    text: "Server full: every line is in a call right now. Cadence admits a call only when it can meet all 80 ms deadlines." },
  "engine-draining": { tone: "warn", action: "Try again", text: "The server is restarting and takes no new calls." },
  "engine-starting": { tone: "warn", action: "Try again", text: "The speech engine is still starting." },
  "engine-down": { tone: "bad", action: "Call again", text: "The speech engine is down." },
  "unreachable": { tone: "bad", action: "Try again", text: "The Cadence server does not answer." },
  "engine-back": { tone: "", action: "Call again", text: "The speech engine is back." },
  "unauthorized": { tone: "warn", action: null, text: "This server needs an access token: enter it below." },
  "network-unstable": { tone: "warn", action: null, text: "Connection interrupted: trying to recover…" },
  "network-lost": { tone: "bad", action: "Reconnect", text: "Network lost: the call's connection failed." },
  "call-ended": { tone: "", action: "Call again", text: "The server ended the call." },
  "failed": { tone: "bad", action: "Try again", text: "The call could not be set up." },
};

// Why the server ended a call (its record's end_reason) -> the notice to show.
const END_REASONS = {
  engine_down: ["engine-down", "The call ended."],
  gateway_stopping: ["engine-draining", "The call ended."],
  peer_failed: ["network-lost", ""],
  setup_timeout: ["failed", "The connection never came up: a firewall may block it (the server may need a TURN server)."],
  hangup: ["call-ended", ""],
};

function notify(kind, extra = "") {
  const box = $("notice");
  page.notice = kind;
  if (!kind) { box.hidden = true; box.dataset.kind = ""; return; }
  const n = NOTICES[kind] || NOTICES.failed;
  page.notices.push(kind);
  box.hidden = false;
  box.dataset.kind = kind;
  box.dataset.tone = n.tone;
  $("notice-text").textContent = extra ? `${n.text} ${extra}` : n.text;
  $("notice-action").hidden = !n.action;
  $("notice-action").textContent = n.action || "";
}

function setState(state) {
  page.state = state;
  document.body.dataset.state = state;
  $("call").hidden = state === "live" || state === "connecting";
  $("hangup").hidden = !($("call").hidden);
  $("call").disabled = state === "starting" || config === null; // no call before /v1/config
  $("state-label").textContent = {
    idle: "Ready", starting: "Opening the microphone…", connecting: "Connecting…",
    live: "In a call", ended: "Call ended",
  }[state];
}

function showCaption(text) {
  const box = $("captions");
  box.dataset.state = "live";
  const line = $("caption-text");
  line.textContent = (line.textContent + text).slice(-CAPTION_KEEP_CHARS);
}

function resetCaptions() {
  const box = $("captions");
  $("caption-text").textContent = "";
  box.dataset.state = config && config.captions ? "waiting" : "unavailable";
  if (config && config.model && config.model !== "echo") {
    $("caption-unavailable").textContent =
      `This server runs ${config.model} without captions: it needs a tokenizer (--captions-tokenizer) to send them.`;
  }
}

async function startCall() {
  if (session || !config) return;
  notify(null);
  panel.reset();
  resetCaptions();
  setState("starting");
  await meters.start(); // inside the click: audio may only start on a gesture
  const s = new CallSession(api, config);
  session = s;
  s.addEventListener("track", (ev) => {
    $("remote").srcObject = ev.detail;
    meters.attach("output", ev.detail);
  });
  s.addEventListener("connection", (ev) => onConnection(s, ev.detail));
  s.addEventListener("caption", (ev) => showCaption(ev.detail));
  try {
    await s.start();
  } catch (err) {
    session = null;
    meters.detach();
    setState("idle");
    const kind = err instanceof ApiError ? err.kind : "failed";
    const retry = err.retryAfterS ? `Try again in ${err.retryAfterS} s.` : "";
    // why it failed, where the page knows: a plain-http page has no microphone at all
    notify(kind, kind === "failed" || kind === "mic-failed" ? err.message : retry);
    if (kind === "unauthorized") $("auth").hidden = false;
    return;
  }
  meters.attach("input", s.mic);
  setState("connecting");
  recordTimer = setInterval(() => pollRecord(s), RECORD_POLL_MS);
}

function onConnection(s, state) {
  if (s !== session) return;
  panel.connection(state);
  if (state === "connected") {
    setState("live");
    if (page.notice === "network-unstable") notify(null);
  } else if (state === "disconnected") {
    notify("network-unstable");
  } else if (state === "failed") {
    endCall("network-lost", false);
  }
}

async function pollRecord(s) {
  if (s !== session || polling) return; // one poll at a time, even when the server is slow
  polling = true;
  try {
    panel.browser(await s.stats());
    panel.record(await api.callRecord(s.id));
  } catch (err) {
    if (s !== session || !(err instanceof ApiError)) return;
    if (err.kind === "ended") {
      panel.record(err.body);
      const [kind, extra] = END_REASONS[err.body.end_reason] || ["call-ended", ""];
      endCall(kind, true, extra);
      return;
    }
    // unreachable: the connection's own state says whether the network is lost
    if (err.kind !== "not-found") return;
    const health = await api.health();
    panel.health(health);
    if (health.status === "ok") endCall("call-ended", true);
    else endCall("engine-down", true, `Engine ${health.engine}: the call ended.`);
  } finally {
    polling = false;
  }
}

async function endCall(kind, serverKnows, extra = "") {
  const s = session;
  if (!s) return;
  session = null;
  clearInterval(recordTimer);
  meters.detach();
  $("remote").srcObject = null;
  setState(kind ? "ended" : "idle");
  notify(kind, extra);
  await s.hangup(serverKnows);
}

// Between calls the engine's health is the notice; after a call ended because the engine
// went down, that notice stays until the engine is back, then says so.
async function pollHealth() {
  const health = await api.health();
  panel.health(health);
  if (session) return;
  const down = page.notice === "engine-down" || page.notice === "unreachable";
  if (health.status === "ok") {
    if (down) notify(page.state === "idle" ? null : "engine-back");
  } else if (!page.notice || page.notice === "engine-back") {
    if (health.status === "unreachable") notify("unreachable");
    else notify("engine-down", `Engine ${health.engine}: calls cannot start until it is back.`);
  }
}

// A header carries printable ASCII only: fetch would throw on anything else, read as "unreachable".
const TOKEN_FORM = /^[\x21-\x7e]+$/;

// #token=... as written: URLSearchParams would read a base64 "+" as a space.
function tokenFromHash() {
  const part = location.hash.slice(1).split("&").find((p) => p.startsWith("token="));
  if (!part) return null;
  try {
    return decodeURIComponent(part.slice("token=".length));
  } catch (err) {
    return null; // a malformed escape: no token
  }
}

function readToken() {
  const fromHash = tokenFromHash();
  if (fromHash) {
    sessionStorage.setItem("cadence-token", fromHash);
    // off the address bar and the history, and a reload takes the saved (or typed) token
    history.replaceState(null, "", location.pathname + location.search);
  }
  const token = fromHash || sessionStorage.getItem("cadence-token");
  return token && TOKEN_FORM.test(token) ? token : null;
}

async function init() {
  setState("idle");
  try {
    config = await api.config();
  } catch (err) {
    notify("unreachable");
    $("call").disabled = true;
    setTimeout(init, HEALTH_POLL_MS);
    return;
  }
  $("call").disabled = false;
  $("tick-ms").textContent = `${config.tick_ms} ms`;
  resetCaptions();
  if (config.auth === "bearer") {
    api.token = readToken();
    $("auth").hidden = !!api.token;
  }
  pollHealth();
  setInterval(pollHealth, HEALTH_POLL_MS);
}

$("call").addEventListener("click", startCall);
$("hangup").addEventListener("click", () => endCall(null, false));
$("notice-action").addEventListener("click", startCall);
$("auth").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const token = $("token").value.trim();
  if (!TOKEN_FORM.test(token)) {
    notify("unauthorized", "A token is letters, digits and symbols, without spaces.");
    return;
  }
  api.token = token;
  sessionStorage.setItem("cadence-token", api.token);
  $("auth").hidden = true;
  notify(null);
});
window.addEventListener("pagehide", () => { if (session) endCall(null, false); });
init();
