"""Control-plane settings sized by the cluster file (issue 28, item 4): the rules, and that
the values reach the kubeadm, scheduler and etcd configuration every API server and
etcd member is built from, as flags their pinned releases have."""

from __future__ import annotations

from pathlib import Path

import pytest
from ruamel.yaml import YAML
from typer.testing import CliRunner

from corral.cli import app
from corral.machine.api_server import api_server_args, render_kubeadm_init_config
from corral.machine.etcd_member import ETCD_VERSION, render_etcd_config
from corral.machine.kubeadm import JoinToken
from corral.machine.scheduler import render_scheduler_config
from corral.model import Cluster, load_fleet
from corral.model.control_plane_sizing import adaptive_percentage_of_nodes_to_score, machine_vcpus, size
from corral.model.layout import layout

ROOT = Path(__file__).resolve().parents[2]
FLEET = load_fleet([ROOT / "clusters"])

# Flags of the releases corral pins, from their references:
# kube-apiserver 1.31 (kubernetes/website content/en/docs/reference/command-line-tools-reference/
# kube-apiserver.md: the options table), only the ones corral may pass.
KUBE_APISERVER_131_FLAGS = {
    "admission-control-config-file", "audit-log-maxage", "audit-log-maxbackup", "audit-log-maxsize",
    "audit-log-path", "audit-policy-file", "enable-admission-plugins", "encryption-provider-config",
    "etcd-servers-overrides", "kubelet-certificate-authority", "max-mutating-requests-inflight",
    "max-requests-inflight",
}
# kube-controller-manager (kube-controller-manager.md): --kube-api-qps Default 20, --kube-api-burst Default 30.
KUBE_CONTROLLER_MANAGER_FLAGS = {"kube-api-qps", "kube-api-burst"}
# etcd 3.6's configuration file keys (etcd server/embed/config.go at v3.6.17, the `json:"..."`
# tags of Config; security sections in configYAML), as corral writes them. The kube tier runs
# corral's file on the real etcd and reads the gates back from its metrics.
ETCD_36_CONFIG_KEYS = {
    "name", "data-dir", "listen-peer-urls", "listen-client-urls", "advertise-client-urls",
    "initial-advertise-peer-urls", "initial-cluster", "initial-cluster-state", "initial-cluster-token",
    "quota-backend-bytes", "listen-metrics-urls", "client-transport-security", "peer-transport-security",
    "feature-gates",
}


def grown(tmp_path: Path, hosts: int, api_machine: str | None = None) -> Cluster:
    """jaguar (Azure, 5 Standard_D32s_v5 API servers) with its on-prem GPU pool at `hosts` hosts."""
    text = (ROOT / "clusters" / "jaguar.yaml").read_text()
    text = text.replace('hosts: ["gpu-[001:064].sf1.internal"]', f'hosts: ["gpu-[00001:{hosts:05d}].sf1.internal"]')
    text = text.replace('\n    racks: ["sf1-r[01:08]"]', "")  # its 8 racks would not divide the grown pool
    text = text.replace("podCIDR: 10.128.0.0/14", "podCIDR: 10.128.0.0/11")
    if api_machine:
        text = text.replace("machineType: Standard_D32s_v5", f"machineType: {api_machine}", 1)
    folder = tmp_path / f"{hosts}-{api_machine}"
    folder.mkdir()
    (folder / "jaguar.yaml").write_text(text)
    return load_fleet([folder]).clusters["jaguar"]


def test_a_small_cluster_keeps_kubernetes_defaults():
    sizing = size(FLEET.clusters["heron"])  # 420 nodes
    assert (sizing.max_requests_inflight, sizing.max_mutating_requests_inflight) == (400, 200)
    assert (sizing.controller_manager_qps, sizing.controller_manager_burst) == (20, 30)
    assert (sizing.scheduler_qps, sizing.scheduler_burst) == (50, 100)
    assert sizing.percentage_of_nodes_to_score is None
    assert sizing.server_concurrency == 600


def test_7500_nodes_on_a_64_vcpu_api_server_get_the_5000_node_validation_settings(tmp_path):
    sizing = size(grown(tmp_path, 7_292, "Standard_D64s_v5"))
    assert sizing.nodes == 7_500 and sizing.api_server_vcpus == 64
    assert (sizing.max_requests_inflight, sizing.max_mutating_requests_inflight) == (3_000, 1_000)
    assert (sizing.controller_manager_qps, sizing.controller_manager_burst) == (100, 100)
    assert (sizing.scheduler_qps, sizing.scheduler_burst) == (100, 100)
    # The adaptive default would score 5% (375 nodes); bin packing keeps 10%.
    assert adaptive_percentage_of_nodes_to_score(7_500) == 5
    assert sizing.percentage_of_nodes_to_score == 10


def test_a_smaller_api_server_caps_the_concurrency_by_its_vcpus(tmp_path):
    sizing = size(grown(tmp_path, 7_292, "Standard_D16s_v5"))
    # 62.5 seats per vCPU, as the validation's 4,000 on 64 vCPUs: 1,000 split 3:1.
    assert (sizing.max_requests_inflight, sizing.max_mutating_requests_inflight) == (750, 250)
    assert any("capped" in s.rule for s in sizing.settings)


@pytest.mark.parametrize("hosts, expected", [(700, (750, 250)), (1_700, (1_350, 450)), (4_500, (3_000, 1_000))])
def test_the_concurrency_moves_in_tiers_of_node_count(tmp_path, hosts, expected):
    sizing = size(grown(tmp_path, hosts, "Standard_D64s_v5"))
    assert (sizing.max_requests_inflight, sizing.max_mutating_requests_inflight) == expected


def test_the_adaptive_score_matches_the_documented_line():
    # "50% for a 100-node cluster and ... 10% for a 5000-node cluster. The lower bound ... is 5%."
    assert adaptive_percentage_of_nodes_to_score(100) == 50
    assert adaptive_percentage_of_nodes_to_score(5_000) == 10
    assert adaptive_percentage_of_nodes_to_score(20_000) == 5


@pytest.mark.parametrize("cloud, machine, vcpus", [
    ("aws", "m7i.4xlarge", 16), ("aws", "m5.xlarge", 4), ("aws", "c6i.large", 2),
    ("azure", "Standard_D32s_v5", 32), ("azure", "Standard_E16s_v5", 16),
    ("gcp", "n2-standard-16", 16), ("gcp", "c3-highmem-88", 88),
    ("aws", "p5.48xlarge-like", None), ("gcp", "a3-megagpu-8g", None), ("azure", "Standard_ND96isr_H100_v5", None),
])
def test_machine_vcpus_only_where_the_name_says(cloud, machine, vcpus):
    assert machine_vcpus(cloud, machine) == vcpus


def test_the_flags_reach_the_api_servers_kubeadm_configuration(tmp_path):
    cluster = grown(tmp_path, 7_292, "Standard_D64s_v5")
    lay = layout(cluster)
    documents = list(YAML(typ="safe", pure=True).load_all(
        render_kubeadm_init_config(cluster, lay, [JoinToken("abcdef.0123456789abcdef", "test")])))
    config = next(d for d in documents if d["kind"] == "ClusterConfiguration")
    # v1beta4 (1.31): extraArgs as a list of {name, value}.
    apiserver = {a["name"]: a["value"] for a in config["apiServer"]["extraArgs"]}
    manager = {a["name"]: a["value"] for a in config["controllerManager"]["extraArgs"]}
    assert apiserver["max-requests-inflight"] == "3000" and apiserver["max-mutating-requests-inflight"] == "1000"
    assert manager == {"kube-api-qps": "100", "kube-api-burst": "100"}
    assert set(apiserver) <= KUBE_APISERVER_131_FLAGS
    assert set(manager) <= KUBE_CONTROLLER_MANAGER_FLAGS


@pytest.mark.parametrize("name", sorted(FLEET.clusters))
def test_every_flag_exists_in_the_pinned_releases(name):
    cluster = FLEET.clusters[name]
    lay = layout(cluster)
    assert set(api_server_args(cluster, lay)) | {"kubelet-certificate-authority"} <= KUBE_APISERVER_131_FLAGS
    assert ETCD_VERSION.startswith("3.6.")
    etcd = YAML(typ="safe", pure=True).load(render_etcd_config(cluster, lay.etcd_members[0], lay.etcd_members))
    assert set(etcd) <= ETCD_36_CONFIG_KEYS
    assert set(etcd["feature-gates"].split(",")) == {"InitialCorruptCheck=true", "CompactHashCheck=true"}


def test_the_scheduler_configuration_carries_its_client_rate_and_score(tmp_path):
    small = YAML(typ="safe", pure=True).load(render_scheduler_config(FLEET.clusters["ibis"]))
    assert small["clientConnection"]["qps"] == 50 and small["clientConnection"]["burst"] == 100
    assert "percentageOfNodesToScore" not in small
    large = YAML(typ="safe", pure=True).load(render_scheduler_config(grown(tmp_path, 7_292)))
    assert large["clientConnection"]["qps"] == 100
    assert large["percentageOfNodesToScore"] == 10


def test_corral_show_prints_each_setting_with_its_source():
    result = CliRunner().invoke(app, ["show", "jaguar", "--clusters", str(ROOT / "clusters")])
    assert result.exit_code == 0, result.output
    shown = result.output
    for expected in ("--max-requests-inflight=400", "--max-mutating-requests-inflight=200",
                     "--kube-api-qps=20", "clientConnection.qps=50", "percentageOfNodesToScore=(default)",
                     "quota-backend-bytes=8589934592", "feature-gates=InitialCorruptCheck=true,CompactHashCheck=true"):
        line = next((line for line in shown.splitlines() if expected in line), None)
        assert line is not None and line.startswith("# "), f"{expected} not shown:\n{shown}"
        assert "[" in line and line.rstrip().endswith("]"), line  # its source
    # Still one YAML document: the settings are comments after the resolved definition.
    data = YAML(typ="safe", pure=True).load(shown)
    assert data["name"] == "jaguar"
