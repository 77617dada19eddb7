"""The offer-broker: the table of outstanding offers, their timeouts and rescinds, and the
validation of ACCEPT against them. `core` is the pure state machine; a shell feeds it."""
