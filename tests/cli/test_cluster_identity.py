"""`offerbus up/down` and the cluster's identity, without starting a cluster: the id `up`
records from the master's /state, and which containers `down` may remove (its cluster's or
its own executors', never every Offerbus container)."""

from __future__ import annotations

from pathlib import Path

from services.cli import cluster
from services.executor.runtime import LABEL_AGENT, LABEL_CLUSTER, LABEL_EXECUTOR, LABEL_TASK


def labels(cluster_id: str = "", executor: str = "", agent: str = "master-1-S1") -> dict[str, str]:
    out = {LABEL_TASK: "web-0-1", LABEL_AGENT: agent}
    if cluster_id:
        out[LABEL_CLUSTER] = cluster_id
    if executor:
        out[LABEL_EXECUTOR] = executor
    return out


def test_down_removes_only_its_clusters_containers() -> None:
    mine = {"web-0-1.1a2b3c4d"}
    assert cluster.owned(labels("c-A"), "c-A", set())
    assert not cluster.owned(labels("c-B"), "c-A", set())
    assert cluster.owned(labels(executor="web-0-1.1a2b3c4d"), "c-A", mine)
    assert cluster.owned(labels(executor="web-0-1.1a2b3c4d"), "", mine)
    # The same agent id in another cluster (ids were not unique across clusters), another
    # executor: not ours. Unknown id and no executors: nothing at all.
    assert not cluster.owned(labels(executor="web-0-1.99999999"), "", mine)
    assert not cluster.owned(labels(), "", set())
    assert not cluster.owned(labels("c-B"), "", set())


def test_up_records_the_cluster_id_when_the_master_publishes_it(tmp_path: Path) -> None:
    assert cluster.record_cluster_id(tmp_path, {"agents": []}) == ""
    assert not cluster.cluster_id_path(tmp_path).exists()
    assert cluster.known_cluster_id(tmp_path) == ""  # no file, no cluster running here
    assert cluster.record_cluster_id(tmp_path, {"cluster_id": "c-42"}) == "c-42"
    assert cluster.known_cluster_id(tmp_path) == "c-42"


def test_local_agents_get_disjoint_host_port_ranges() -> None:
    """The agents of a local cluster share one machine: with one ports range for all, two
    tasks on two agents were given the same host port and Docker refused the second
    ("port is already allocated"), which then failed over and over."""
    from services.cli.cluster import agent_resources
    from services.resources import UNRESERVED, Resources

    def ports_of(text: str) -> list[tuple[int, int]]:
        return list(Resources.parse(text).ranges[("ports", UNRESERVED)])

    spec = "cpus:4;mem:4096;disk:10240;ports:[31000-31999]"
    ports = [ports_of(agent_resources(spec, i)) for i in range(3)]
    assert ports[0] == [(31000, 31999)]
    assert ports[1] == [(32000, 32999)] and ports[2] == [(33000, 33999)]
    two = "cpus:1;ports:[100-109,200-209]"
    assert ports_of(agent_resources(two, 1)) == [(210, 219), (310, 319)]
    assert agent_resources("cpus:1;mem:64", 2) == "cpus:1;mem:64"  # no ports: unchanged
