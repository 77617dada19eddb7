"""What every service shell shares: the HTTP status endpoint, the leader lifecycle of the
central services, and process plumbing (signals, logging)."""
