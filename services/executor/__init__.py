"""The executor: one per task, started by the agent; runs the task's container or process through
the runtime port, reports its status updates and kills it with a grace period."""
