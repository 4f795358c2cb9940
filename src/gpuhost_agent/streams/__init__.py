"""Container logs and terminals for the marketplace (docs/streams.md, sections 2 and 3).

channel.StreamChannel is the entry point: it keeps the channel WebSocket open,
checks each request (requests), and runs each accepted one as a LogPump or a
Terminal on a WebSocket of its own (sink).
"""
