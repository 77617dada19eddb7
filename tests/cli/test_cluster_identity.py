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
