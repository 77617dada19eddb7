"""The master: the front door for agents and frameworks, the registry, task records and the
state stream. core.py is the pure state machine; shell.py runs it on sockets."""
