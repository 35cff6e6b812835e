"""What each Prometheus server asks the API server to watch (issue 28, item 5).

A kubernetes_sd_config is one watch (Prometheus' discovery manager shares one
discoverer between identical configs: discovery/manager.go registerProviders,
reflect.DeepEqual). A pod watch is filtered by the API server as far as
Prometheus lets it be (`selectors`: labelSelector and fieldSelector): only the
exporter's own running pods, in the monitoring namespace. A shard's node watch
carries only its own nodes: corral-node-approver labels every node with its shard
(`node-restriction.kubernetes.io/corral-monitoring-shard`, the hashmod of its name),
and the shard's node watch selects that label's value (one per server, shared by
its per-node jobs). DaemonSet pods carry no such label: their share stays hashmod's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from corral.manifests import monitoring
from corral.manifests.policy import MONITORING_NAMESPACE
from corral.model import load_fleet

ROOT = Path(__file__).resolve().parents[2]
FLEET = load_fleet([ROOT / "clusters"])


def big(tmp_path: Path):
    text = (ROOT / "clusters" / "jaguar.yaml").read_text()
    text = text.replace('hosts: ["gpu-[001:064].sf1.internal"]', 'hosts: ["gpu-[00001:07292].sf1.internal"]')
    text = text.replace('\n    racks: ["sf1-r[01:08]"]', "")  # its 8 racks would not divide the grown pool
    text = text.replace("podCIDR: 10.128.0.0/14", "podCIDR: 10.128.0.0/11")
    (tmp_path / "jaguar.yaml").write_text(text)
    return load_fleet([tmp_path]).clusters["jaguar"]


def watches(config: dict) -> list[dict]:
    """The distinct kubernetes_sd_configs of one server: its watches."""
    distinct: list[dict] = []
    for job in config["scrape_configs"]:
        for sd in job.get("kubernetes_sd_configs", []):
            if sd not in distinct:
                distinct.append(sd)
    return distinct


@pytest.mark.parametrize("name", sorted(FLEET.clusters) + ["7500-nodes"])
def test_each_shard_watches_only_running_exporter_pods_and_its_own_nodes(name, tmp_path):
    cluster = big(tmp_path) if name == "7500-nodes" else FLEET.clusters[name]
    gpu = any(pool.gpu for pool in cluster.node_pools)
    shards = monitoring.shard_count(cluster)
    for shard in range(shards):
        config = yaml.safe_load(monitoring.shard_config(cluster, gpu, shard, shards))
        found = watches(config)
        # The node list and watch of this shard's own nodes only, by the label the approver sets.
        assert [w for w in found if w["role"] == "node"] == [{"role": "node", "selectors": [
            {"role": "node", "label": f"node-restriction.kubernetes.io/corral-monitoring-shard={shard}"}]}]
        pod_watches = [w for w in found if w["role"] == "pod"]
        assert len(pod_watches) == (2 if gpu else 1)
        for watch in pod_watches:
            assert watch["namespaces"] == {"names": [MONITORING_NAMESPACE]}
            (selector,) = watch["selectors"]
            assert selector["role"] == "pod"
            assert selector["label"] in ("app.kubernetes.io/name=node-exporter", "app.kubernetes.io/name=dcgm-exporter")
            assert selector["field"] == "status.phase=Running"
        assert {w["role"] for w in found} <= {"node", "pod"}


@pytest.mark.parametrize("name", sorted(FLEET.clusters))
def test_the_global_server_watches_only_the_default_namespace_endpoints(name):
    cluster = FLEET.clusters[name]
    config = yaml.safe_load(monitoring.global_config(cluster, monitoring.shard_count(cluster)))
    assert watches(config) == [{"role": "endpoints", "namespaces": {"names": ["default"]}}]


def test_the_shard_node_watches_partition_the_nodes_and_keep_the_hashmod(tmp_path):
    """Shard i selects label value i, for i in 0..S-1, and still keeps only its hashmod share
    (a node whose label is stale is not scraped by a second shard)."""
    cluster = big(tmp_path)
    gpu = any(pool.gpu for pool in cluster.node_pools)
    shards = monitoring.shard_count(cluster)
    assert shards > 1
    selected = []
    for shard in range(shards):
        config = yaml.safe_load(monitoring.shard_config(cluster, gpu, shard, shards))
        (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "kubelet-cadvisor"]
        (watch,) = job["kubernetes_sd_configs"]
        selected.append(watch["selectors"][0]["label"].rsplit("=", 1)[1])
        assert job["relabel_configs"][:2] == [
            {"source_labels": ["__meta_kubernetes_node_name"], "modulus": shards, "target_label": "__tmp_shard",
             "action": "hashmod"},
            {"source_labels": ["__tmp_shard"], "regex": str(shard), "action": "keep"}]
    assert selected == [str(i) for i in range(shards)]
