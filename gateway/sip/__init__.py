"""Sans-IO SIP for phone calls: messages, transactions, dialogs, SDP, digest and the agent.

Nothing in this package opens a socket or reads a clock: a driver feeds bytes and `now` in and
sends the datagrams the agent returns.
"""
