// Minimal caller: one RTCPeerConnection, offer POSTed to /v1/calls, DELETE to hang up.
"use strict";
const callButton = document.getElementById("call");
const hangupButton = document.getElementById("hangup");
const statusLine = document.getElementById("status");
const remote = document.getElementById("remote");
let pc = null;
let callId = null;
let mic = null;

function say(text) { statusLine.textContent = text; }

async function waitForIce(peer) {
  if (peer.iceGatheringState === "complete") return;
  await new Promise((resolve) => {
    peer.addEventListener("icegatheringstatechange", () => {
      if (peer.iceGatheringState === "complete") resolve();
    });
  });
}

async function call() {
  callButton.disabled = true;
  try {
    mic = await navigator.mediaDevices.getUserMedia({
      audio: { echoCancellation: true, noiseSuppression: true, autoGainControl: true },
    });
  } catch (err) {
    say("Microphone unavailable: " + err.message);
    callButton.disabled = false;
    return;
  }
  pc = new RTCPeerConnection({ iceServers: [] });
  mic.getTracks().forEach((t) => pc.addTrack(t, mic));
  pc.ontrack = (ev) => { remote.srcObject = ev.streams[0] || new MediaStream([ev.track]); };
  pc.onconnectionstatechange = () => {
    say("Connection: " + pc.connectionState);
    if (pc.connectionState === "failed") hangup();
  };
  await pc.setLocalDescription(await pc.createOffer());
  await waitForIce(pc);
  const res = await fetch("/v1/calls", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ sdp: pc.localDescription.sdp, type: "offer" }),
  });
  const body = await res.json();
  if (!res.ok) {
    say("Call refused: " + (body.detail || body.error));
    teardown();
    return;
  }
  callId = body.id;
  await pc.setRemoteDescription({ type: "answer", sdp: body.sdp });
  hangupButton.disabled = false;
  say("Calling…");
}

function teardown() {
  if (pc) pc.close();
  if (mic) mic.getTracks().forEach((t) => t.stop());
  pc = null; mic = null;
  callButton.disabled = false;
  hangupButton.disabled = true;
}

async function hangup() {
  const id = callId;
  callId = null;
  teardown();
  if (id) await fetch("/v1/calls/" + id, { method: "DELETE" });
  say("Call ended.");
}

callButton.addEventListener("click", call);
hangupButton.addEventListener("click", hangup);
