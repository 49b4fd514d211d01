// Input and output levels through WebAudio: an AnalyserNode on the microphone and one on the
// call's returned track, sampled every animation frame into a rolling strip per side. Both
// strips moving at once is the point of the demo: the model listens while it speaks.
// The samples are also kept as a trace (time, input RMS, output RMS) that tests read.

const HISTORY = 160; // bars in a strip
const SAMPLE_MS = 20;
const TRACE_MAX = 3000; // a minute of samples

function rms(analyser, buffer) {
  analyser.getFloatTimeDomainData(buffer);
  let sum = 0;
  for (let i = 0; i < buffer.length; i++) sum += buffer[i] * buffer[i];
  return Math.sqrt(sum / buffer.length);
}

// 0..1 on a log scale from -60 dBFS to 0 dBFS, so speech fills the strip visibly.
function meterHeight(level) {
  const db = 20 * Math.log10(Math.max(level, 1e-6));
  return Math.min(1, Math.max(0, (db + 60) / 60));
}

class Strip {
  constructor(canvas, color) {
    this.canvas = canvas;
    this.color = color;
    this.values = new Array(HISTORY).fill(0);
  }

  push(level) {
    this.values.push(meterHeight(level));
    this.values.shift();
  }

  draw() {
    const c = this.canvas;
    const ratio = window.devicePixelRatio || 1;
    const w = Math.round(c.clientWidth * ratio);
    const h = Math.round(c.clientHeight * ratio);
    if (c.width !== w || c.height !== h) { c.width = w; c.height = h; }
    const g = c.getContext("2d");
    g.clearRect(0, 0, w, h);
    g.fillStyle = this.color;
    const step = w / HISTORY;
    this.values.forEach((v, i) => {
      const bar = Math.max(1, v * h);
      g.fillRect(i * step, (h - bar) / 2, Math.max(1, step - 1), bar);
    });
  }
}

export class Meters {
  constructor(inputCanvas, outputCanvas) {
    this.strips = {
      input: new Strip(inputCanvas, "#5b8def"),
      output: new Strip(outputCanvas, "#22c39a"),
    };
    this.ctx = null;
    this.nodes = {};
    this.buffer = null;
    this.trace = [];
    this.last = { input: 0, output: 0 };
    this.running = false;
  }

  // Must run inside the click that starts the call: browsers only start audio on a gesture.
  async start() {
    if (!this.ctx) this.ctx = new AudioContext();
    if (this.ctx.state !== "running") await this.ctx.resume();
    this.buffer = new Float32Array(1024);
    if (!this.running) {
      // sampled on a timer, drawn per frame: a hidden tab throttles frames, not the trace
      this.running = true;
      setInterval(() => this.sample(), SAMPLE_MS);
      requestAnimationFrame(() => this.draw());
    }
  }

  attach(side, stream) {
    if (this.nodes[side]) this.nodes[side].source.disconnect();
    const source = this.ctx.createMediaStreamSource(stream);
    const analyser = this.ctx.createAnalyser();
    analyser.fftSize = 1024;
    source.connect(analyser);
    this.nodes[side] = { source, analyser };
  }

  detach() {
    for (const side of Object.keys(this.nodes)) this.nodes[side].source.disconnect();
    this.nodes = {};
  }

  sample() {
    const now = performance.now();
    for (const side of ["input", "output"]) {
      const node = this.nodes[side];
      this.last[side] = node ? rms(node.analyser, this.buffer) : 0;
      this.strips[side].push(this.last[side]);
    }
    if (this.nodes.input || this.nodes.output) {
      this.trace.push([now, this.last.input, this.last.output]);
      if (this.trace.length > TRACE_MAX) this.trace.splice(0, this.trace.length - TRACE_MAX);
    }
  }

  draw() {
    this.strips.input.draw();
    this.strips.output.draw();
    requestAnimationFrame(() => this.draw());
  }
}
