"""The allocator: allocation policy (weighted DRF over frameworks, roles and reservations,
decline filters, suppress/revive). `core` is the pure state machine; `sorter` the fair order."""
