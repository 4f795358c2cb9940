"""Container logs, terminals, tunnels and SSH for the marketplace (docs/streams.md).

channel.StreamChannel is the entry point: it keeps the channel WebSocket open,
checks each request (requests), and runs each accepted one on a WebSocket of
its own (sink): a LogPump, a Terminal, a TunnelRelay, or an SshConnection
(the agent's own SSH server on the stream: ssh_server, ssh_session, ssh_files).
"""
