"""The shared message bus: framing, peers and heartbeats, state stream, epochs, election."""
