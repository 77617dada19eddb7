"""The vocabulary of Offerbus traces: span names and attribute keys, shared by every service,
the SDK and `offerbus trace` / `offerbus why`. One trace follows one offer:

  allocate (allocator) -> offer (broker) -> decide (framework SDK) -> validate (broker)
    -> launch (master: re-validation, records the task) -> run (agent: executor started)
    -> start (executor: container created and started; event "TASK_RUNNING")

Each hop's parent arrives in a message: Allocation.traceparent (allocator -> broker),
Offer.traceparent (broker -> framework), the Envelope.traceparent of the framework's
Accept/Decline (relayed by the master to the broker), of the LaunchRequest (broker ->
master), RunTasks.Launch.traceparent (master -> agent), and the Envelope.traceparent of the
executor's Launch event (agent -> executor). The master keeps the launch span's
traceparent in TaskRecord.traceparent; later status updates are spans named "status" that
LINK to it. Rescinds and expiries are spans named "rescind" under the offer.
"""

# Span names.
ALLOCATE = "allocate"
OFFER = "offer"
RESCIND = "rescind"
DECIDE = "decide"
VALIDATE = "validate"
LAUNCH = "launch"
RUN = "run"
START = "start"
STATUS = "status"

# Attribute keys (all spans use the ones that apply).
FRAMEWORK_ID = "offerbus.framework_id"
FRAMEWORK_NAME = "offerbus.framework_name"
AGENT_ID = "offerbus.agent_id"
HOSTNAME = "offerbus.hostname"
ROLE = "offerbus.role"
OFFER_ID = "offerbus.offer_id"
OFFER_IDS = "offerbus.offer_ids"
ALLOCATION_ID = "offerbus.allocation_id"
TASK_ID = "offerbus.task_id"
TASK_IDS = "offerbus.task_ids"
EXECUTOR_ID = "offerbus.executor_id"
RESOURCES = "offerbus.resources"  # Resources.__str__, e.g. "cpus:0.5;mem:256"
DOMINANT_SHARE = "offerbus.dominant_share"
DOMINANT_RESOURCE = "offerbus.dominant_resource"
WEIGHT = "offerbus.weight"
CYCLE = "offerbus.cycle"
SKIPPED = "offerbus.skipped"  # ["<framework_id>: <outcome>: <reason>", ...] this cycle
# Why an allocation is less than the agent had free (allocate spans, only when so):
FAIR_SHARE_CUT = "offerbus.fair_share.cut"  # what progressive filling kept for others
RESERVED_ELSEWHERE = "offerbus.reserved_elsewhere"  # free, reserved for other roles
# ["<agent_id>: <what> for <framework_id>", ...]: its offers reclaimed or tasks revoked
# this cycle for frameworks below their share
FAIR_SHARE_RECLAIMED = "offerbus.fair_share.reclaimed"
REVOCABLE = "offerbus.revocable"  # bool: beyond the framework's guaranteed share
DECISION = "offerbus.decision"  # "accept" | "decline"
REASON = "offerbus.reason"  # the framework's reason, or why something was refused
REFUSE_SECONDS = "offerbus.refuse_seconds"
VALID = "offerbus.valid"  # bool: a validation's verdict
FAILED_CHECK = "offerbus.failed_check"  # which check refused it
IMAGE = "offerbus.image"
CONTAINER_ID = "offerbus.container_id"
TASK_STATE = "offerbus.task_state"
EXPIRES_AT_US = "offerbus.expires_at_us"
