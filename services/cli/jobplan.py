"""`offerbus job plan`, the decision: where a job's instances would go, from the master's
/state, by the service framework's own placement (frameworks/service.py `plan`) applied to
an offer of each live agent's free resources, and why no more would go on each agent.
Pure: a spec and a /state document in, a JobPlan out."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import json_format

from frameworks import service
from frameworks.spec import instance_of
from schemas import common_pb2
from services import tasks as task_states
from services.resources import Resources

Doc = dict[str, Any]
PLACEABLE = "AGENT_STATUS_REGISTERED"  # the agents whose resources are offered


@dataclass
class AgentPlan:
    """One agent: its free resources (for the job's role), the instances placed there
    (new ones, and the job's live ones already there), and why no (more) would go."""

    agent_id: str
    hostname: str
    status: str
    free: str
    new: list[int] = field(default_factory=list)
    running: list[int] = field(default_factory=list)
    why_not: str = ""


@dataclass
class JobPlan:
    name: str
    want: int
    live: int  # the job's instances running or being started now
    agents: list[AgentPlan]
    unplaced: list[int]  # instances no agent has room for
    why: str  # the placement's reason for the unplaced ones ("" when none)
    remove: list[int] = field(default_factory=list)  # live instances beyond `want`

    def doc(self) -> Doc:
        return dataclasses.asdict(self)


def _resources(items: list[Doc]) -> Resources:
    return Resources.from_proto(
        json_format.ParseDict(r, common_pb2.Resource(), ignore_unknown_fields=True)
        for r in items)


def _free(agent: Doc, role: str) -> Resources:
    """What an offer of this agent would hold for a framework of `role`."""
    total = _resources(agent.get("agent_info", {}).get("resources", []))
    used = _resources(agent.get("used_resources", []))
    left = total - used if total.contains(used) else Resources()
    return left.for_role(role)


def _offer(agent: Doc, free: Resources) -> common_pb2.Offer:
    info = agent.get("agent_info", {})
    offer = common_pb2.Offer(offer_id=info.get("agent_id", ""), agent_id=info.get("agent_id", ""),
                             hostname=info.get("hostname", ""))
    for attr in info.get("attributes", []):
        offer.attributes.append(json_format.ParseDict(attr, common_pb2.Attribute(),
                                                      ignore_unknown_fields=True))
    offer.resources.extend(free.to_proto())
    return offer


def live_instances(spec: service.ServiceSpec, state: Doc) -> dict[int, service.Instance]:
    """The job's instances the master knows live (tasks `<name>-<index>-<attempt>` of the
    frameworks named after the job), by index, with their host."""
    fids = {f.get("framework_info", {}).get("framework_id") for f in state.get("frameworks", [])
            if f.get("framework_info", {}).get("name") == spec.name}
    hosts = {a.get("agent_info", {}).get("agent_id"): a.get("agent_info", {}).get("hostname", "")
             for a in state.get("agents", [])}
    out: dict[int, service.Instance] = {}
    for t in state.get("tasks", []):
        task_id = t.get("task_info", {}).get("task_id", "")
        status = t.get("status", {}).get("state", "")
        index, attempt = instance_of(spec.name, task_id)
        if t.get("framework_id") not in fids or index is None or \
                not task_states.is_active_name(status):
            continue
        agent = t.get("agent_id") or t.get("task_info", {}).get("agent_id", "")
        if index not in out or out[index].attempts < attempt:
            out[index] = service.Instance(index, task_id=task_id, agent_id=agent,
                                          hostname=hosts.get(agent, ""), state=status,
                                          attempts=attempt)
    return out


def plan_job(spec: service.ServiceSpec, state: Doc) -> JobPlan:
    """Where the job's missing instances would go if every live agent offered its free
    resources now, and, for each agent, why it would take no (more) instance."""
    live = live_instances(spec, state)
    agents = sorted(state.get("agents", []),
                    key=lambda a: (a.get("agent_info", {}).get("hostname", ""),
                                   a.get("agent_info", {}).get("agent_id", "")))
    rows: dict[str, AgentPlan] = {}
    offers: list[common_pb2.Offer] = []
    for agent in agents:
        info = agent.get("agent_info", {})
        aid = info.get("agent_id", "")
        free = _free(agent, spec.role)
        row = AgentPlan(aid, info.get("hostname", ""),
                        agent.get("status", "").removeprefix("AGENT_STATUS_"), str(free))
        row.running = sorted(i.index for i in live.values()
                             if i.agent_id == aid and i.index < spec.instances)
        rows[aid] = row
        if agent.get("status") == PLACEABLE:
            offers.append(_offer(agent, free))
        else:
            row.why_not = f"agent is {row.status.lower()}: its resources are not offered"
    placed = service.plan(spec, live, offers)
    instances = dict(live)
    left: dict[str, Resources] = {o.offer_id: Resources.from_proto(o.resources) for o in offers}
    for offer_id, indexes in placed.launches.items():
        row = rows[offer_id]
        row.new = sorted(indexes)
        for index in indexes:
            instances[index] = service.Instance(index, agent_id=offer_id,
                                                hostname=row.hostname, state="TASK_STAGING")
            ports = Resources.of(ports=[(p, p) for p in placed.ports.get(index, [])])
            left[offer_id] = left[offer_id] - spec.resources() - ports
    # Why would one more instance not go on each agent (after this placement)?
    more = dataclasses.replace(spec, instances=spec.instances + 1)
    kept = {i: inst for i, inst in instances.items() if i < spec.instances}
    for offer in offers:
        one = common_pb2.Offer()
        one.CopyFrom(offer)
        del one.resources[:]
        one.resources.extend(left[offer.offer_id].to_proto())
        again = service.plan(more, {**kept, **{i: service.Instance(i, state="TASK_RUNNING")
                                               for i in range(spec.instances)
                                               if i not in kept}}, [one])
        if again.launches:
            rows[offer.offer_id].why_not = ""
        else:
            rows[offer.offer_id].why_not = again.why.partition(": ")[2]
    unplaced = [i for i in range(spec.instances) if i not in instances]
    remove = sorted(i for i in live if i >= spec.instances)
    return JobPlan(spec.name, spec.instances, len(live), list(rows.values()), unplaced,
                   placed.why, remove)
