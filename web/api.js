// The gateway's HTTP API as the page uses it. Every failure becomes an ApiError whose `kind`
// names what the person calling should be told (server-full, engine-down, unauthorized, ...),
// so the page maps kinds to messages in one place.

export class ApiError extends Error {
  constructor(kind, detail, retryAfterS = null, body = null) {
    super(detail);
    this.kind = kind;
    this.retryAfterS = retryAfterS;
    this.body = body;
  }
}

const REQUEST_TIMEOUT_MS = 8000;

const REFUSALS = {
  engine_full: "server-full",
  engine_draining: "engine-draining",
  engine_starting: "engine-starting",
  engine_unavailable: "engine-down",
  unauthorized: "unauthorized",
};

export class Api {
  constructor() {
    this.token = null;
  }

  headers(json) {
    const h = {};
    if (json) h["Content-Type"] = "application/json";
    if (this.token) h["Authorization"] = "Bearer " + this.token;
    return h;
  }

  async request(method, path, body) {
    let res;
    try {
      res = await fetch(path, {
        method,
        headers: this.headers(body !== undefined),
        body: body === undefined ? undefined : JSON.stringify(body),
        cache: "no-store",
        keepalive: method === "DELETE", // a hang-up still reaches the server as the tab closes
        signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
      });
    } catch (err) {
      throw new ApiError("unreachable", "the Cadence server does not answer");
    }
    let data = null;
    try {
      data = await res.json();
    } catch (err) {
      data = null;
    }
    if (res.ok) return data;
    const code = data && data.error;
    const retry = Number(res.headers.get("Retry-After")) || null;
    if (res.status === 404) throw new ApiError("not-found", (data && data.detail) || "not found");
    if (res.status === 410) throw new ApiError("ended", data.detail, null, data.call);
    throw new ApiError(REFUSALS[code] || "failed", (data && data.detail) || res.statusText, retry);
  }

  config() { return this.request("GET", "/v1/config"); }

  // /healthz answers 503 with a body while the engine is down: that is a state, not an error.
  async health() {
    try {
      const res = await fetch("/healthz", {
        cache: "no-store", signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
      });
      return await res.json();
    } catch (err) {
      return { status: "unreachable", engine: "unreachable" };
    }
  }

  startCall(sdp) { return this.request("POST", "/v1/calls", { sdp, type: "offer" }); }
  callRecord(id) { return this.request("GET", "/v1/calls/" + id); }
  endCall(id) { return this.request("DELETE", "/v1/calls/" + id); }
}
