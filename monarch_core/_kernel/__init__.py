"""The trio kernel: wire format, sessions, routing, the poller. Imports nothing above it."""
