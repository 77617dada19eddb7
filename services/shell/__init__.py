"""The service kit: what every service process shares: configuration (flags, TOML,
`OFFERBUS_*`), the reactor and ZeroMQ context, metrics, the status HTTP server, the leader
lifecycle of the elected services, the core driver, and one `main()`."""
