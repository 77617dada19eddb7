"""The service framework's placement (pure): packing instances into offers, constraints,
restarts of dead instances, and an explanation when something cannot be placed."""

from __future__ import annotations

from frameworks.service import Instance, ServiceSpec, plan, task_info
from schemas import common_pb2
from services.resources import Resources


def offer(oid: str, host: str, cpus: float, mem: float, rack: str = "a") -> common_pb2.Offer:
    o = common_pb2.Offer(offer_id=oid, agent_id=f"S-{host}", hostname=host)
    o.resources.extend(Resources.of(cpus=cpus, mem=mem).to_proto())
    o.attributes.add(name="rack", text=rack)
    return o


def spec(**kw: object) -> ServiceSpec:
    base = {"name": "web", "image": "offerbus/busybox", "instances": 5, "cpus": 0.5,
            "mem": 64.0}
    base.update(kw)
    return ServiceSpec(**base)  # type: ignore[arg-type]


def _plan(*a: object) -> tuple[dict[str, list[int]], list[str], str]:
    p = plan(*a)  # type: ignore[arg-type]
    return p.launches, p.declines, p.why


def test_spreads_missing_instances_over_hosts() -> None:
    launches, declines, why = _plan(spec(), {}, [offer("o1", "h1", 1.0, 1024),
                                                offer("o2", "h2", 4.0, 1024)])
    assert launches == {"o1": [0, 2], "o2": [1, 3, 4]} and declines == [] and why == ""
    instances = {0: Instance(0, "web-0-1", state="TASK_RUNNING", hostname="h1")}
    launches, _, _ = _plan(spec(instances=3), instances, [offer("o1", "h1", 4, 1024),
                                                         offer("o2", "h2", 4, 1024)])
    assert launches == {"o2": [1], "o1": [2]}


def test_live_instances_are_not_launched_again_and_dead_ones_are() -> None:
    instances = {0: Instance(0, "web-0-1", state="TASK_RUNNING", hostname="h1"),
                 1: Instance(1, "web-1-1", state="TASK_FAILED", hostname="h1")}
    launches, _, _ = _plan(spec(instances=2), instances, [offer("o1", "h1", 4.0, 1024)])
    assert launches == {"o1": [1]}


def test_hostname_unique_places_one_per_host() -> None:
    instances = {0: Instance(0, "web-0-1", state="TASK_RUNNING", hostname="h1")}
    launches, declines, why = _plan(spec(instances=3, constraints=["hostname:unique"]),
                                   instances, [offer("o1", "h1", 4, 1024),
                                               offer("o2", "h2", 4, 1024)])
    assert launches == {"o2": [1]} and declines == ["o1"]
    assert "hostname:unique" in why and "1 instance" in why


def test_attribute_match() -> None:
    launches, declines, why = _plan(spec(instances=1, constraints=["rack:b"]), {},
                                   [offer("o1", "h1", 4, 1024, rack="a"),
                                    offer("o2", "h2", 4, 1024, rack="b")])
    assert launches == {"o2": [0]} and declines == ["o1"] and why == ""


def test_a_task_larger_than_any_offer_is_explained_not_crashed() -> None:
    launches, declines, why = _plan(spec(instances=1, mem=1_000_000), {},
                                   [offer("o1", "h1", 4, 4096)])
    assert launches == {} and declines == ["o1"]
    assert "no offer fits" in why and "h1" in why


def test_task_info_carries_container_resources_and_identity() -> None:
    s = spec(command=["sleep", "3600"])
    inst = Instance(3, attempts=2)
    task = task_info(s, inst, offer("o1", "h1", 4, 1024))
    assert task.task_id == "web-3-2" and task.agent_id == "S-h1"
    assert task.container.docker.image == "offerbus/busybox"
    assert list(task.command.arguments) == ["3600"] and task.command.value == "sleep"
    assert Resources.from_proto(task.resources) == Resources.of(cpus=0.5, mem=64)
