"""Frameworks that run on Offerbus, and the scheduler SDK they are built with."""
