"""The pods that use the API servers' cloud identity reach it; no other pod does.

Every kubelet machine drops pod-network traffic to the instance metadata service
(corral/machine/metadata_block.py). cluster-autoscaler gets its cloud credentials there on
every cloud (AWS IMDSv2, GCE's metadata token, Azure IMDS managed identity: the docstring of
policy.autoscaler_host_network names the upstream code), so it must run on the host's
network, as the node approver does. The block's rules are read from the rendered script and
evaluated here as iptables would (first matching rule; DROP or on to the next table).
"""

from __future__ import annotations

import ipaddress
import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from corral.machine import metadata_block
from corral.model import Cluster
from corral.model.layout import layout

from .test_manifests import FLEET, find, objects_of, pod_spec

CLOUDS = {"heron": "aws", "ibis": "gcp", "jaguar": "azure"}
METADATA = "169.254.169.254"
AUTOSCALER = "Deployment/kube-system/cluster-autoscaler"


@dataclass(frozen=True)
class Rule:
    source: ipaddress.IPv4Network
    destination: ipaddress.IPv4Network
    protocol: str | None
    port: int | None
    port_negated: bool
    target: str

    def matches(self, source: str, destination: str, protocol: str, port: int) -> bool:
        if ipaddress.ip_address(source) not in self.source or ipaddress.ip_address(destination) not in self.destination:
            return False
        if self.protocol is not None and self.protocol != protocol:
            return False
        # `--dport N` matches port N; `! --dport N` every other port.
        return self.port is None or (port == self.port) != self.port_negated


def block_rules(cluster: Cluster) -> list[Rule]:
    """The raw-table PREROUTING rules the machine's block script sets, in the order iptables
    holds them (each is inserted at the top: the last one set is checked first)."""
    (script,) = [f.content for f in metadata_block.files(cluster) if f.path == metadata_block.BLOCK_POD_METADATA_SCRIPT]
    rules = []
    for line in script.splitlines():
        if not line.startswith("RULE=("):
            continue
        words = shlex.split(line.removeprefix("RULE=(").removesuffix(")"))
        assert words[0] == "PREROUTING", line
        fields: dict[str, str] = {}
        negated, i = False, 1
        while i < len(words):
            if words[i] == "!":
                negated = True
                i += 1
                continue
            fields[words[i]] = words[i + 1]
            if words[i] == "--dport":
                fields["negated"] = "yes" if negated else ""
            negated, i = False, i + 2
        rules.append(Rule(ipaddress.ip_network(fields["-s"]), ipaddress.ip_network(fields["-d"]), fields.get("-p"),
                          int(fields["--dport"]) if "--dport" in fields else None, fields.get("negated") == "yes",
                          fields["-j"]))
    return list(reversed(rules))


def dropped(cluster: Cluster, source: str, destination: str, protocol: str, port: int) -> bool:
    for rule in block_rules(cluster):
        if rule.matches(source, destination, protocol, port):
            return rule.target == "DROP"
    return False


def a_pod_address(cluster: Cluster) -> str:
    return str(next(ipaddress.ip_network(cluster.kubernetes.pod_cidr).hosts()))


def test_the_example_clusters_cover_every_cloud():
    assert {name: FLEET.clusters[name].control_plane.cloud for name in CLOUDS} == CLOUDS


@pytest.mark.parametrize("name", sorted(CLOUDS))
def test_the_autoscaler_reaches_the_metadata_service_on_the_host_network_only(name):
    """A pod-network pod's request to the metadata API is dropped on every cloud (so the
    autoscaler could get no token from there); the autoscaler runs on the host's network,
    whose source is the machine's own address, which no rule names."""
    cluster = FLEET.clusters[name]
    assert dropped(cluster, a_pod_address(cluster), METADATA, "tcp", 80)
    spec = pod_spec(find(objects_of(cluster), AUTOSCALER))
    assert spec.get("hostNetwork") is True, f"{name}: cluster-autoscaler cannot reach its cloud identity"
    # Cluster DNS still resolves the API's names (the pod's own resolv.conf would skip it).
    assert spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    api_server = cluster_api_server_address(cluster)
    assert not dropped(cluster, api_server, METADATA, "tcp", 80)


def cluster_api_server_address(cluster: Cluster) -> str:
    return layout(cluster).api_servers[0].ip


@pytest.mark.parametrize("name", sorted(CLOUDS))
def test_the_autoscaler_on_the_host_network_opens_no_port_on_the_api_servers(name):
    """Its metrics and health check (`--address`, default :8085) on the loopback only, and no
    container or host port declared."""
    deployment = find(objects_of(FLEET.clusters[name]), AUTOSCALER)
    (container,) = pod_spec(deployment)["containers"]
    addresses = [a for a in container["args"] if a.startswith("--address=")]
    assert addresses == ["--address=127.0.0.1:8085"]
    assert "ports" not in container


@pytest.mark.parametrize("name", sorted(CLOUDS))
def test_only_pods_that_hold_the_cloud_identity_share_the_api_servers_network(name):
    """Host-network pods on the API servers are the machine's processes: the autoscaler,
    the node approver and (where it replaces cloud instances) the repair controller, and the
    node DaemonSets that run on every machine. Nothing else in kube-system joins them."""
    objects = objects_of(FLEET.clusters[name])
    identity_users = {AUTOSCALER, "Deployment/kube-system/corral-node-approver", "Deployment/corral-repair/corral-repair"}
    host_network = {key for key, obj in objects.items()
                    if obj.get("kind") == "Deployment" and pod_spec(obj).get("hostNetwork")}
    assert AUTOSCALER in host_network
    assert host_network <= identity_users, host_network - identity_users


def test_gcp_pods_keep_the_vpc_resolver_on_the_metadata_address_and_lose_the_rest():
    """On GCE the metadata server is also the VPC's DNS resolver (Cloud DNS, "Name resolution
    order"): CoreDNS forwards there from the pod network. DNS (53, UDP and TCP) passes; the
    metadata HTTP API (80, and any other port) is dropped."""
    ibis = FLEET.clusters["ibis"]
    pod = a_pod_address(ibis)
    assert not dropped(ibis, pod, METADATA, "udp", 53)
    assert not dropped(ibis, pod, METADATA, "tcp", 53)
    for protocol, port in (("tcp", 80), ("tcp", 443), ("tcp", 8080), ("udp", 80)):
        assert dropped(ibis, pod, METADATA, protocol, port), (protocol, port)


@pytest.mark.parametrize("name", ["heron", "jaguar"])
def test_other_clouds_drop_every_pod_packet_to_the_metadata_address(name):
    """AWS (Route 53 Resolver at 169.254.169.253 and the VPC base +2) and Azure (168.63.129.16)
    resolve elsewhere: nothing to the metadata address is left open, DNS included."""
    cluster = FLEET.clusters[name]
    pod = a_pod_address(cluster)
    for protocol, port in (("udp", 53), ("tcp", 53), ("tcp", 80)):
        assert dropped(cluster, pod, METADATA, protocol, port), (protocol, port)


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("iptables") is None or shutil.which("unshare") is None,
                    reason="runs the rule script in a network namespace of its own: root, iptables, unshare")
def test_the_gcp_rule_script_is_accepted_by_iptables_and_idempotent(tmp_path: Path):
    """The `! --dport` rules parse in real iptables, and a second run (every boot runs it)
    adds nothing: two rules, TCP and UDP, each sparing port 53."""
    ibis = FLEET.clusters["ibis"]
    (script_text,) = [f.content for f in metadata_block.files(ibis) if f.path == metadata_block.BLOCK_POD_METADATA_SCRIPT]
    script = tmp_path / "block"
    script.write_text(script_text)
    result = subprocess.run(["unshare", "--net", "bash", "-c", f"bash {script} && bash {script} && iptables -t raw -S PREROUTING"],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    rules = [line for line in result.stdout.splitlines() if line.startswith("-A PREROUTING")]
    assert len(rules) == 2, rules
    assert sorted(r.split(" -p ")[1].split()[0] for r in rules) == ["tcp", "udp"]
    assert all("-d 169.254.169.254/32" in r and "! --dport 53" in r and r.endswith("-j DROP") for r in rules)
