"""The pod network works between any two nodes of a cluster.

For every kind of node a cluster has (API servers, which kubeadm registers as
nodes, and each pool's nodes), the test finds the flannel configuration that
node really gets from the rendered manifests: the one DaemonSet whose node
selector, node affinity and tolerations admit the node's labels and taints,
and the net-conf.json of the ConfigMap that DaemonSet mounts. Then it checks
every ordered pair of nodes, for every subnet relation the pair can have,
against a small model of the networks:

- flannel decides on the SENDING node. With `DirectRouting` (vxlan, ipip) it
  installs a plain route to a peer's pod subnet when the peer is on a
  directly connected subnet, and encapsulates otherwise; host-gw always sends
  plain; wireguard always encapsulates.
- A plain packet (addressed to a pod IP) arrives only where the network
  delivers pod addresses between the two hosts: an on-prem L2 segment (same
  rack/subnet) does. A cloud VPC/VNet does not (AWS source/destination check,
  no GCE routes or canIpForward, no Azure route table; corral adds no cloud
  routes), and two different subnets never share a segment.
- Encapsulated packets arrive wherever the hosts reach each other (the VPN
  joins cloud and sites; firewalls open flannel's UDP port), provided both
  ends agree on the VXLAN network, VNI and port.

A pair works iff the sender encapsulates or the network delivers plain pod
packets between them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from corral.manifests import all_objects, object_key, render
from corral.manifests import policy
from corral.model import Cluster, load_fleet
from corral.model.schema import Taint

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "clusters"

# A site and an on-prem CPU pool for turning a cloud-only example into a hybrid one.
HYBRID_SITE = "\nsites:\n  - {name: dc1, cidrs: [10.60.0.0/16], vpn: {peerAddress: 203.0.113.20, bgpASN: 65020}}\n"
HYBRID_POOL = '\n  - {name: cpu-dc1, provider: onprem, site: dc1, hosts: ["cpu-[001:008].dc1.internal"], labels: {corral.dev/rack: r1}}\n'


def example_text(name: str) -> str:
    return (EXAMPLES / f"{name}.yaml").read_text()


def load_text(tmp_path: Path, name: str, text: str) -> Cluster:
    folder = tmp_path / name
    folder.mkdir()
    (folder / f"{name}.yaml").write_text(text)
    return load_fleet([folder]).clusters[name]


def hybrid(tmp_path: Path, name: str) -> Cluster:
    """Cloud-only example `name` with an on-prem site and pool, and directRouting on."""
    text = example_text(name).replace("directRouting: false", "directRouting: true", 1)
    # The site's VPN carries less than the cloud-only MTU: the model's default fits it.
    text = re.sub(r", mtu: [0-9]+\}", "}", text, count=1)
    assert text.rstrip().splitlines()[-1].startswith("    "), f"{name}.yaml must end in its nodePools list"
    return load_text(tmp_path, name, text.rstrip("\n") + HYBRID_POOL.rstrip("\n") + "\n" + HYBRID_SITE)


def direct_routing_on(tmp_path: Path, name: str) -> Cluster:
    """Example `name` with directRouting: true (cloud-only: nothing may route directly)."""
    text = example_text(name).replace("directRouting: false", "directRouting: true", 1)
    return load_text(tmp_path, name, text)


CASES = {
    "jaguar": lambda tmp_path: load_fleet([EXAMPLES]).clusters["jaguar"],
    "heron": lambda tmp_path: load_fleet([EXAMPLES]).clusters["heron"],
    "ibis": lambda tmp_path: load_fleet([EXAMPLES]).clusters["ibis"],
    "heron-hybrid": lambda tmp_path: hybrid(tmp_path, "heron"),
    "ibis-hybrid": lambda tmp_path: hybrid(tmp_path, "ibis"),
    "ibis-direct-routing": lambda tmp_path: direct_routing_on(tmp_path, "ibis"),
}


# --- the nodes a cluster has ---------------------------------------------------


@dataclass(frozen=True)
class NodeKind:
    name: str
    labels: dict
    taints: tuple
    network: str  # "cloud:<provider>" or "onprem:<site>"

    @property
    def onprem(self) -> bool:
        return self.network.startswith("onprem:")


def node_kinds(cluster: Cluster) -> list[NodeKind]:
    cloud = cluster.control_plane.cloud
    kinds = [
        # kubeadm registers API servers with these (and no corral labels).
        NodeKind(
            "API server",
            {"kubernetes.io/os": "linux", "node-role.kubernetes.io/control-plane": ""},
            (Taint(key="node-role.kubernetes.io/control-plane", effect="NoSchedule"),),
            f"cloud:{cloud}",
        )
    ]
    for pool in cluster.node_pools:
        onprem = pool.provider == "onprem"
        kinds.append(NodeKind(
            f"pool {pool.name}",
            {"kubernetes.io/os": "linux", **cluster.node_labels(pool)},
            tuple(cluster.node_taints(pool)),
            f"onprem:{pool.site}" if onprem else f"cloud:{pool.provider}",
        ))
    return kinds


# --- what the manifests give a node ----------------------------------------------


def expression_matches(expression: dict, labels: dict) -> bool:
    key, operator, values = expression["key"], expression["operator"], expression.get("values", [])
    if operator == "In":
        return key in labels and labels[key] in values
    if operator == "NotIn":
        return key not in labels or labels[key] not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    raise AssertionError(f"node selector operator {operator} not modelled")


def runs_on(pod_spec: dict, node: NodeKind) -> bool:
    """The DaemonSet controller's decision: node selector, required node affinity, taints."""
    if any(node.labels.get(k) != v for k, v in pod_spec.get("nodeSelector", {}).items()):
        return False
    required = pod_spec.get("affinity", {}).get("nodeAffinity", {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution")
    if required and not any(
        all(expression_matches(e, node.labels) for e in term.get("matchExpressions", []))
        for term in required["nodeSelectorTerms"]
    ):
        return False
    return all(policy.tolerates(pod_spec.get("tolerations", []), t)
               for t in node.taints if t.effect in ("NoSchedule", "NoExecute"))


def flannel_daemonsets(objects: dict[str, dict]) -> list[dict]:
    return [o for o in objects.values()
            if o["kind"] == "DaemonSet" and o["metadata"]["namespace"] == policy.FLANNEL_NAMESPACE]


def net_conf_of(objects: dict[str, dict], node: NodeKind) -> dict:
    """The net-conf.json flanneld reads on `node`; exactly one flannel must run there."""
    running = [ds for ds in flannel_daemonsets(objects) if runs_on(ds["spec"]["template"]["spec"], node)]
    names = [ds["metadata"]["name"] for ds in running]
    assert len(running) == 1, f"{node.name}: flannel DaemonSets running there: {names} (need exactly one)"
    spec = running[0]["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
    [volume] = [v for v in spec["volumes"] if mounts.get(v["name"]) == "/etc/kube-flannel/"]
    config = objects[f"ConfigMap/{policy.FLANNEL_NAMESPACE}/{volume['configMap']['name']}"]
    return json.loads(config["data"]["net-conf.json"])


# --- the model of the networks -------------------------------------------------


def sends_plain(conf: dict, same_subnet: bool) -> bool:
    """Whether the sending flanneld routes to the peer's pods without encapsulation."""
    backend = conf["Backend"]
    kind = backend["Type"]
    if kind in ("vxlan", "ipip"):
        return bool(backend.get("DirectRouting")) and same_subnet
    if kind == "host-gw":
        return True
    if kind == "wireguard":
        return False
    raise AssertionError(f"flannel backend {kind} not modelled")


def network_delivers_pod_packets(a: NodeKind, b: NodeKind, same_subnet: bool) -> bool:
    """Only an on-prem L2 segment delivers packets addressed to pod IPs between hosts."""
    return same_subnet and a.network == b.network and a.onprem


def subnet_relations(a: NodeKind, b: NodeKind) -> list[bool]:
    # Two nodes of one network may share a subnet (a zone's node subnet, a
    # rack) or not; nodes of different networks never do.
    return [True, False] if a.network == b.network else [False]


def pair_kind(a: NodeKind, b: NodeKind, same_subnet: bool) -> str:
    if a.onprem != b.onprem:
        return "cloud-onprem"
    where = "onprem-onprem" if a.onprem else "cloud-cloud"
    if a.onprem:
        return f"{where} {'same rack (subnet)' if same_subnet else 'different rack'}"
    return f"{where} {'same subnet' if same_subnet else 'different subnets'}"


def broken_pairs(cluster: Cluster) -> list[str]:
    objects = {object_key(o): o for o in all_objects(render(cluster))}
    kinds = node_kinds(cluster)
    confs = {k.name: net_conf_of(objects, k) for k in kinds}
    broken = []
    for sender in kinds:
        for receiver in kinds:
            for same_subnet in subnet_relations(sender, receiver):
                plain = sends_plain(confs[sender.name], same_subnet)
                if plain and not network_delivers_pod_packets(sender, receiver, same_subnet):
                    broken.append(
                        f"{pair_kind(sender, receiver, same_subnet)}: {sender.name} -> {receiver.name} "
                        f"sends plain pod packets its network ({sender.network}) does not deliver"
                    )
    return broken


@pytest.fixture(params=sorted(CASES))
def cluster(request, tmp_path) -> Cluster:
    return CASES[request.param](tmp_path)


def test_every_pair_of_nodes_reaches_each_others_pods(cluster):
    assert broken_pairs(cluster) == []


def test_every_node_runs_flannel_with_one_vxlan_network(cluster):
    objects = {object_key(o): o for o in all_objects(render(cluster))}
    confs = [net_conf_of(objects, k) for k in node_kinds(cluster)]
    spec = cluster.network.flannel
    for conf in confs:
        # Encapsulated packets between nodes of different DaemonSets must decapsulate.
        assert conf["Network"] == cluster.kubernetes.pod_cidr
        assert conf["Backend"]["Type"] == spec.backend
        assert conf["Backend"].get("VNI") == (spec.vni if spec.backend == "vxlan" else None)
        assert conf["Backend"].get("Port") == (spec.port if spec.backend == "vxlan" else None)


def test_onprem_nodes_keep_direct_routing_within_their_rack(cluster):
    """The fix must not give up direct routing where it works: on-prem nodes
    route same-subnet pod traffic directly when the cluster asks for it."""
    objects = {object_key(o): o for o in all_objects(render(cluster))}
    for kind in node_kinds(cluster):
        conf = net_conf_of(objects, kind)
        same_rack_plain = sends_plain(conf, same_subnet=True)
        if kind.onprem:
            assert same_rack_plain == cluster.network.flannel.direct_routing, kind.name
        else:
            assert not same_rack_plain, f"{kind.name} is a cloud node and must encapsulate"


def test_the_model_rejects_direct_routing_between_cloud_machines():
    """The model itself: one net-conf for every node with DirectRouting (the
    rendering before this change) breaks cloud pairs on one subnet and
    nothing else."""
    api = NodeKind("API server", {}, (), "cloud:azure")
    pool = NodeKind("pool cpu", {}, (), "cloud:azure")
    rack_a = NodeKind("pool gpu-a", {}, (), "onprem:sf1")
    direct = {"Backend": {"Type": "vxlan", "VNI": 1, "Port": 8472, "DirectRouting": True}}
    assert sends_plain(direct, same_subnet=True)
    assert not network_delivers_pod_packets(api, pool, same_subnet=True)
    assert network_delivers_pod_packets(rack_a, rack_a, same_subnet=True)
    assert not network_delivers_pod_packets(rack_a, rack_a, same_subnet=False)
    assert not sends_plain(direct, same_subnet=False)
    assert not network_delivers_pod_packets(api, rack_a, same_subnet=False)
