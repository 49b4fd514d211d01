"""Phone calls: the asyncio driver of the sans-IO SIP core (gateway/sip) and RTP (gateway/rtp).

`signalling` carries SIP over UDP and TCP to and from the `Agent`; `rtp` is one call's media
socket; `pacer` sends every phone call's packets on the engine's grid; `bridge` turns SIP
events into calls of the `CallRegistry`, so phone calls share the WebRTC calls' media path.
"""
