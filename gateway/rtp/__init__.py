"""RTP media primitives for phone calls: packets, G.711, RFC 4733 events, send/receive state.

All sans-IO: callers pass bytes and `now`; nothing here opens a socket or reads a clock.
"""
