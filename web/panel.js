// The live panel of the call: what the browser measures (getStats) next to what the server
// measures (the call's record: the engine's per-call tick counters and the gateway's jitter
// buffer) and the engine's load (/healthz). Values are written into elements marked
// data-stat="name", and kept as numbers on `values` for tests.

function ms(seconds) {
  return seconds === null || seconds === undefined ? "–" : `${Math.round(seconds * 1000)} ms`;
}

function count(n) {
  return n === null || n === undefined ? "–" : n.toLocaleString("en-US");
}

export class Panel {
  constructor(root) {
    this.root = root;
    this.values = {};
    this.previousBuffer = null;
  }

  set(name, text, value, tone = "") {
    this.values[name] = value;
    const el = this.root.querySelector(`[data-stat="${name}"]`);
    if (!el) return;
    el.textContent = text;
    el.dataset.tone = tone;
  }

  reset() {
    this.previousBuffer = null;
    for (const el of this.root.querySelectorAll("[data-stat]")) {
      if (el.dataset.stat !== "load") { el.textContent = "–"; el.dataset.tone = ""; }
    }
    const load = this.values.load;
    this.values = { load };
  }

  connection(state) {
    const tone = state === "connected" ? "good" : state === "failed" ? "bad" : "";
    this.set("connection", state, state, tone);
  }

  browser(stats) {
    if (!stats) return;
    this.set("rtt", ms(stats.rttS), stats.rttS);
    // the browser's playout buffer over the last interval, not since the call began
    if (stats.jitterBufferEmitted !== undefined) {
      const prev = this.previousBuffer;
      this.previousBuffer = [stats.jitterBufferDelay, stats.jitterBufferEmitted];
      if (prev && stats.jitterBufferEmitted > prev[1]) {
        const s = (stats.jitterBufferDelay - prev[0]) / (stats.jitterBufferEmitted - prev[1]);
        this.set("playout", ms(s), s);
      }
    }
  }

  record(rec) {
    const engine = rec.engine || {};
    if (engine.ticks !== undefined) {
      // every deadline the call had: ticks run plus ticks the engine skipped (each a miss)
      const met = engine.ticks + (engine.skipped ?? 0) - engine.misses;
      this.set("met", count(met), met, "good");
      this.set("missed", count(engine.misses), engine.misses, engine.misses ? "bad" : "good");
      this.set("underruns", count(engine.underruns), engine.underruns, engine.underruns ? "warn" : "");
    }
    const jb = rec.jitter_buffer || {};
    const delay = jb.delay_p50_s ?? jb.target_delay_s;
    this.set("jitter", ms(delay), delay);
    this.set("duration", `${Math.floor(rec.duration_s)} s`, rec.duration_s);
  }

  health(h) {
    if (h.slots === undefined) {
      this.set("load", "engine unreachable", null, "bad");
      return;
    }
    const tone = h.status === "ok" ? (h.slots_live >= h.slots ? "warn" : "good") : "bad";
    const text = h.status === "ok" ? `${h.slots_live} / ${h.slots} calls` : `engine ${h.engine}`;
    this.set("load", text, h.slots_live, tone);
  }
}
