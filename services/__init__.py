"""Offerbus services: one package per service plus the shared `bus`."""
