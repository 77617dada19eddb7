"""Emulators for scale and chaos work: many virtual agents in one process (agents.py), and
many frameworks with set accept rates and task shapes (frameworks.py)."""
