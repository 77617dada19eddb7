"""The agent: one per machine; owns its resources, executors, containers, and the status updates
not yet acknowledged (status_updates.py is their pure core, checkpoint.py their disk)."""
