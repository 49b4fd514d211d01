// One call from this page: microphone, RTCPeerConnection, the offer/answer through the API,
// the captions data channel, and the hang-up. It reports what happens as events
// ("connection", "caption", "track") and leaves every word shown to the person to page.js.

import { ApiError } from "./api.js";

const MIC_CONSTRAINTS = {
  audio: { echoCancellation: true, noiseSuppression: true, autoGainControl: true },
  video: false,
};

// A microphone failure, named like the API's refusals so the page treats both alike.
function micError(err) {
  if (err.name === "NotAllowedError" || err.name === "SecurityError") {
    return new ApiError("mic-denied", err.message);
  }
  if (err.name === "NotFoundError" || err.name === "OverconstrainedError") {
    return new ApiError("mic-missing", err.message);
  }
  return new ApiError("mic-failed", err.message || String(err));
}

const GATHER_LIMIT_MS = 3000;

// Gathering ends when every ICE server answered or gave up; an unreachable TURN server can
// take far longer than a person waits, so the offer goes with what was found by then.
function iceGathered(pc) {
  if (pc.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(timer);
      pc.removeEventListener("icegatheringstatechange", check);
      resolve();
    };
    const check = () => { if (pc.iceGatheringState === "complete") done(); };
    const timer = setTimeout(done, GATHER_LIMIT_MS);
    pc.addEventListener("icegatheringstatechange", check);
  });
}

export class CallSession extends EventTarget {
  constructor(api, config) {
    super();
    this.api = api;
    this.config = config;
    this.id = null;
    this.pc = null;
    this.mic = null;
    this.remote = null;
    this.ended = false;
  }

  emit(type, detail) { this.dispatchEvent(new CustomEvent(type, { detail })); }

  async start() {
    if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) {
      throw new ApiError("mic-failed", "this page needs https (or localhost) for the microphone");
    }
    try {
      this.mic = await navigator.mediaDevices.getUserMedia(MIC_CONSTRAINTS);
    } catch (err) {
      throw micError(err);
    }
    try {
      await this.connect();
    } catch (err) {
      this.close();
      throw err;
    }
  }

  async connect() {
    const pc = new RTCPeerConnection({ iceServers: this.config.ice_servers || [] });
    this.pc = pc;
    for (const track of this.mic.getAudioTracks()) pc.addTrack(track, this.mic);
    pc.addEventListener("track", (ev) => {
      this.remote = ev.streams[0] || new MediaStream([ev.track]);
      this.emit("track", this.remote);
    });
    pc.addEventListener("connectionstatechange", () => this.emit("connection", pc.connectionState));
    if (this.config.captions) {
      // opened before the offer so that the offer negotiates SCTP; the gateway sends on it
      const channel = pc.createDataChannel("captions");
      channel.addEventListener("message", (ev) => {
        const message = JSON.parse(ev.data);
        if (message.type === "caption") this.emit("caption", message.text);
      });
    }
    await pc.setLocalDescription(await pc.createOffer());
    await iceGathered(pc); // one round trip: the gateway takes no trickled candidates
    const answer = await this.api.startCall(pc.localDescription.sdp);
    this.id = answer.id;
    await pc.setRemoteDescription({ type: "answer", sdp: answer.sdp });
  }

  // Ends the call here and, unless the server ended it already, there too. The API hears of
  // the hang-up before the transport closes, so the server records a hang-up, not a lost peer.
  async hangup(serverKnows = false) {
    if (this.ended) return;
    this.ended = true;
    if (this.mic) this.mic.getTracks().forEach((t) => t.stop());
    if (this.id && !serverKnows) {
      try {
        await this.api.endCall(this.id);
      } catch (err) {
        // the server ended it already or is gone: either way the call is over
      }
    }
    if (this.pc) this.pc.close();
  }

  close() {
    if (this.ended) return;
    this.ended = true;
    if (this.mic) this.mic.getTracks().forEach((t) => t.stop());
    if (this.pc) this.pc.close();
  }

  async stats() {
    if (!this.pc) return null;
    const report = await this.pc.getStats();
    const out = { rttS: null, jitterBufferS: null, packetsLost: null };
    let pair = null;
    report.forEach((s) => {
      if (s.type === "transport" && s.selectedCandidatePairId) pair = report.get(s.selectedCandidatePairId);
    });
    if (!pair) report.forEach((s) => { if (s.type === "candidate-pair" && s.nominated) pair = s; });
    if (pair && pair.currentRoundTripTime !== undefined) out.rttS = pair.currentRoundTripTime;
    report.forEach((s) => {
      if (s.type === "inbound-rtp" && s.kind === "audio") {
        out.packetsLost = s.packetsLost;
        out.jitterBufferDelay = s.jitterBufferDelay;
        out.jitterBufferEmitted = s.jitterBufferEmittedCount;
      }
    });
    return out;
  }
}
