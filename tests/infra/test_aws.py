"""The AWS components under Pulumi's mocks: what `pulumi up` would register.

Each test builds the five components for a cluster (heron, the AWS example,
or a variant of it) with a recording mock monitor, then asserts on the
registered resources' inputs and options (protect, retainOnDelete,
ignoreChanges), all resolved: nothing is asserted inside an apply that
might never run.
"""

from __future__ import annotations

import base64
import copy
import gc
import ipaddress
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import pytest
from pulumi.runtime import settings
from ruamel.yaml import YAML

from corral.infra import bootstrap
from corral.infra.aws import ApiServers, Etcd, HybridLink, Network, NodePools, SecretStore
from corral.infra.aws.hybrid import check_psk
from corral.infra.aws.nodepools import autoscaler_tags
from corral.infra.plan import STACK_TYPE, RecordingMonitor, SecretValue
from corral.infra.platform import ClusterContext
from corral.model import Cluster
from corral.model.layout import node_group_name
from corral.model.rules import check_cluster

EXAMPLES = Path(__file__).resolve().parents[2] / "clusters"
PSK = "corral_test.key_0123456789abcdef"


# --- A recording mock monitor ------------------------------------------------


@dataclass
class Registered:
    type: str
    name: str
    parent: str
    custom: bool
    protect: bool
    retain_on_delete: bool
    delete_before_replace: bool
    ignore_changes: list[str]
    inputs: dict[str, Any]
    secrets: set[str]
    id: str = ""
    urn: str = ""


def _unwrap(value: Any, path: str, secrets: set[str]) -> Any:
    """Plain values, noting where the engine would get a secret (dotted input paths)."""
    if isinstance(value, SecretValue):
        secrets.add(path)
        return _unwrap(value.value, path, secrets)
    if isinstance(value, dict):
        return {k: _unwrap(v, f"{path}.{k}" if path else k, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [_unwrap(v, path, secrets) for v in value]
    return value


class Mocks(pulumi.runtime.Mocks):
    """Inputs come back as state, plus the few computed outputs the components read."""

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        state = dict(args.inputs)
        rid = f"{args.typ.rsplit(':', 1)[-1]}/{args.name}"
        if args.typ == "aws:ec2/vpnConnection:VpnConnection":
            for t, base in ((1, 0), (2, 4)):
                state[f"tunnel{t}Address"] = f"198.51.100.{t}"
                state[f"tunnel{t}InsideCidr"] = f"169.254.10.{base}/30"
                state[f"tunnel{t}VgwInsideAddress"] = f"169.254.10.{base + 1}"
                state[f"tunnel{t}CgwInsideAddress"] = f"169.254.10.{base + 2}"
                state[f"tunnel{t}BgpAsn"] = "65010"
        elif args.typ == "aws:ec2/launchTemplate:LaunchTemplate":
            state["latestVersion"] = 1
        elif args.typ == "aws:ec2/eip:Eip":
            state["publicIp"] = "192.0.2.1"
        elif args.typ.startswith("aws:iam/"):
            state.setdefault("name", args.name)
        elif args.typ == "aws:secretsmanager/secret:Secret":
            state["arn"] = f"arn:aws:secretsmanager:us-west-2:123456789012:secret:{args.inputs['name']}-AbCdEf"
        elif args.typ.startswith("aws:lb/"):
            state["arn"] = f"arn:aws:elasticloadbalancing:::{args.name}"
            state["dnsName"] = f"{args.name}.elb.amazonaws.com"
        return rid, state

    def call(self, args: pulumi.runtime.MockCallArgs):
        raise AssertionError(f"the AWS components must not invoke {args.token} (offline plans)")


class Recorder(RecordingMonitor):
    """The plan's recorder (parent, protect, retainOnDelete, secrets in place),
    also keeping what the AWS components set beyond it: ignoreChanges,
    deleteBeforeReplace, and the mock id other resources refer to."""

    def __init__(self, mocks: Mocks):
        super().__init__(mocks)
        self.extras: dict[str, tuple[list[str], bool, str]] = {}

    def RegisterResource(self, request):
        response = super().RegisterResource(request)
        if request.type != STACK_TYPE:
            with self._lock:
                self.extras[response.urn] = (list(request.ignoreChanges), bool(request.deleteBeforeReplace), response.id)
        return response

    @property
    def registered(self) -> list[Registered]:
        out = []
        for r in self.registrations:
            ignore_changes, delete_before_replace, rid = self.extras[r.urn]
            secrets: set[str] = set()
            inputs = _unwrap(r.inputs, "", secrets)
            out.append(Registered(
                type=r.type, name=r.name, parent=r.parent_urn, custom=r.custom,
                protect=r.protect, retain_on_delete=r.retain_on_delete,
                delete_before_replace=delete_before_replace, ignore_changes=ignore_changes,
                inputs=inputs, secrets=secrets, id=rid, urn=r.urn,
            ))
        return out


@dataclass
class Plan:
    cluster: Cluster
    ctx: ClusterContext
    resources: list[Registered]
    user_data: dict[str, str]
    resolved: dict[str, Any] = field(default_factory=dict)

    def of(self, type_: str) -> list[Registered]:
        return [r for r in self.resources if r.type == type_]

    def one(self, type_: str, name: str) -> Registered:
        found = [r for r in self.of(type_) if r.name == name]
        assert len(found) == 1, (type_, name, [r.name for r in self.of(type_)])
        return found[0]

    def by_id(self, rid: str) -> Registered:
        found = [r for r in self.resources if r.custom and r.id == rid]
        assert len(found) == 1, rid
        return found[0]


def build(cluster: Cluster, config: dict[str, str] | None = None, shared_keys: dict[str, str] | None = None) -> Plan:
    """Every AWS component of `cluster`, registered against the recorder."""
    recorder = Recorder(Mocks())
    settings.ROOT.set(None)  # a fresh stack per build, as the plan runner does
    pulumi.runtime.set_mocks(recorder.mocks, project="corral", stack=cluster.name, preview=False, monitor=recorder)
    pulumi.runtime.set_all_config(
        {"aws:region": cluster.control_plane.region, **(config or {})}, []
    )
    ctx = ClusterContext.of(cluster)
    lay = ctx.layout
    user_data = {m.name: f"#cloud-config\n# {m.name}\n" for m in (*lay.etcd_members, *lay.events_members, *lay.api_servers)}
    user_data.update({p.name: f"#cloud-config\n# pool {p.name}\n" for p in cluster.cloud_pools})
    secret = pulumi.Output.secret
    plan = Plan(cluster, ctx, [], user_data)

    @pulumi.runtime.test
    def program():
        network = Network(ctx.resource_name("network"), ctx)
        etcd = Etcd(ctx.resource_name("etcd"), ctx, network, lay.etcd_members,
                    [user_data[m.name] for m in lay.etcd_members])
        events = None
        if lay.events_members:
            events = Etcd(ctx.resource_name("etcd-events"), ctx, network, lay.events_members,
                          [user_data[m.name] for m in lay.events_members])
        api = ApiServers(ctx.resource_name("api"), ctx, network, [user_data[m.name] for m in lay.api_servers])
        pools = NodePools(ctx.resource_name("pools"), ctx, network, {p.name: user_data[p.name] for p in cluster.cloud_pools})
        # The secret store as the program fills it: one secret per machine role, then the grants.
        store = SecretStore(ctx.resource_name("secrets"), ctx)
        keys = [bootstrap.etcd_secret_key(m.name) for m in (*lay.etcd_members, *lay.events_members)]
        keys += [bootstrap.APISERVER_SECRET, *(bootstrap.pool_secret_key(p.name) for p in cluster.cloud_pools)]
        for key in keys:
            store.put(key, secret(f"value of {key}"))
        bootstrap.grant_readers(store, etcd, events, api, pools)
        pools.allow_resize(api.identities)
        keys = shared_keys if shared_keys is not None else {s.name: PSK for s in cluster.sites}
        link = HybridLink(ctx.resource_name("vpn"), ctx, network, {k: secret(v) for k, v in keys.items()})
        plan.resolved["network"] = network
        plan.resolved["api"] = api
        sites = pulumi.Output.all(**link.sites) if link.sites else pulumi.Output.from_input({})
        return sites.apply(lambda s: plan.resolved.__setitem__("sites", s))

    try:
        program()
    finally:
        # Finalize this run's leftovers (event loops, abandoned coroutines) now,
        # not inside some later compile(): on CPython 3.11 a finalizer that
        # imports a module during the AST conversion of another import has
        # been seen to end the session with "AST constructor recursion depth
        # mismatch" (once, in pytest's terminal summary).
        gc.collect()
        settings.ROOT.set(None)
    plan.resources = recorder.registered
    assert plan.resources, "nothing was registered"
    return plan


# --- Clusters -----------------------------------------------------------------


def example_data(name: str) -> dict:
    return YAML(typ="safe").load((EXAMPLES / f"{name}.yaml").read_text())


def cluster_of(data: dict) -> Cluster:
    cluster = Cluster.model_validate(data)
    findings = list(check_cluster(cluster))
    assert not findings, findings
    return cluster


def heron_with(change: Callable[[dict], None] | None = None) -> Cluster:
    data = copy.deepcopy(example_data("heron"))
    if change:
        change(data)
    return cluster_of(data)


def with_sites(data: dict) -> None:
    data["sites"] = [
        {"name": "pdx1", "cidrs": ["10.60.0.0/16", "10.61.0.0/16"], "vpn": {"peerAddress": "203.0.113.20", "bgpASN": 65020}},
        {"name": "sea1", "cidrs": ["10.70.0.0/16"], "vpn": {"peerAddress": "203.0.113.30", "bgpASN": 4_200_000_001}},
        # A site reached some other way: no VPN for it.
        {"name": "lab", "cidrs": ["10.80.0.0/16"]},
    ]
    # heron's jumbo MTU does not cross a VPN; the model's default fits it (corral/model/mtu.py).
    data["network"]["flannel"].pop("mtu")
    data["nodePools"].append({
        "name": "gpu-h100-pdx1", "provider": "onprem", "site": "pdx1",
        "hosts": ["gpu-[001:016].pdx1.internal"],
        "gpu": {"model": "H100", "count": 8, "driver": "550.127.05", "fabricManager": True},
    })


def gp3_disk(data: dict) -> None:
    # 300 MB/s: within what heron's r7i.2xlarge etcd members sustain (312.5 MB/s)
    data["controlPlane"]["etcd"]["disk"] = {"type": "gp3", "sizeGiB": 200, "iops": 12000, "throughputMBps": 300}


def io1_disk(data: dict) -> None:
    data["controlPlane"]["etcd"]["disk"] = {"type": "io1", "sizeGiB": 200, "iops": 10000}


@pytest.fixture(scope="module")
def heron() -> Plan:
    return build(heron_with())


@pytest.fixture(scope="module")
def hybrid() -> Plan:
    return build(heron_with(with_sites))


# --- Structure -----------------------------------------------------------------


def test_components_and_parents(heron: Plan):
    components = {r.type for r in heron.resources if not r.custom}
    assert components == {f"corral:aws:{c}" for c in ("Network", "Etcd", "ApiServers", "NodePools", "HybridLink", "SecretStore")}
    component_urns = {r.urn for r in heron.resources if not r.custom}
    for r in heron.resources:
        if r.custom:
            assert r.type.startswith("aws:"), r.type
            assert r.parent in component_urns, f"{r.type} {r.name} is not a component's child"
            assert r.name.startswith("heron-"), r.name


def test_every_tagged_resource_carries_cluster_tags(heron: Plan):
    tagged = [r for r in heron.resources if r.custom and "tags" in r.inputs and isinstance(r.inputs["tags"], dict)]
    assert len(tagged) > 30
    for r in tagged:
        assert r.inputs["tags"]["corral-cluster"] == "heron", r.name
        assert r.inputs["tags"]["managed-by"] == "corral"
        assert r.inputs["tags"]["Name"], r.name


def test_region_must_match_stack(tmp_path):
    with pytest.raises(Exception, match="aws:region is eu-west-1"):
        build(heron_with(), config={"aws:region": "eu-west-1"})


# --- Network -----------------------------------------------------------------


def test_network_subnets_per_zone(heron: Plan):
    vpc = heron.one("aws:ec2/vpc:Vpc", "heron-vpc")
    assert vpc.inputs["cidrBlock"] == "10.201.0.0/20"
    assert vpc.inputs["enableDnsHostnames"] is True
    subnets = heron.of("aws:ec2/subnet:Subnet")
    assert len(subnets) == 9
    for z in heron.ctx.layout.zones:
        for role, cidr in (("control", z.control_subnet), ("public", z.public_subnet), ("nodes", z.node_subnet)):
            s = heron.one("aws:ec2/subnet:Subnet", f"heron-{role}-{z.zone}")
            assert s.inputs["availabilityZone"] == z.zone
            assert s.inputs["cidrBlock"] == cidr
    nats = heron.of("aws:ec2/natGateway:NatGateway")
    assert sorted(heron.by_id(n.inputs["subnetId"]).name for n in nats) == [
        f"heron-public-{z.zone}" for z in heron.ctx.layout.zones
    ]
    defaults = [r for r in heron.of("aws:ec2/route:Route") if r.inputs["destinationCidrBlock"] == "0.0.0.0/0"]
    assert sum("natGatewayId" in r.inputs for r in defaults) == 3
    assert sum("gatewayId" in r.inputs for r in defaults) == 1


def _rules(plan: Plan) -> list[Registered]:
    return plan.of("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")


def _group_name(plan: Plan, rule: Registered) -> str:
    return plan.by_id(rule.inputs["securityGroupId"]).name


def _covers(rule: Registered, port: int, protocol: str = "tcp") -> bool:
    if rule.inputs["ipProtocol"] == "-1":
        return True
    return rule.inputs["ipProtocol"] == protocol and rule.inputs["fromPort"] <= port <= rule.inputs["toPort"]


@pytest.mark.parametrize("plan_name", ["heron", "hybrid"])
def test_etcd_ports_only_from_etcd_and_api_servers(plan_name: str, request):
    plan: Plan = request.getfixturevalue(plan_name)
    rules = _rules(plan)
    assert len(rules) > 10
    assert not [r for r in rules if r.inputs.get("cidrIpv4") == "0.0.0.0/0"], "ingress open to the world"
    etcd_rules = [r for r in rules if _group_name(plan, r) == "heron-etcd" and r.inputs["ipProtocol"] != "icmp"
                  and (_covers(r, 2379) or _covers(r, 2380))]
    assert etcd_rules
    for r in etcd_rules:
        assert "cidrIpv4" not in r.inputs, (r.name, r.inputs)
        assert plan.by_id(r.inputs["referencedSecurityGroupId"]).name in ("heron-etcd", "heron-api")
    sources = {plan.by_id(r.inputs["referencedSecurityGroupId"]).name for r in etcd_rules}
    assert sources == {"heron-etcd", "heron-api"}
    assert {(r.inputs["fromPort"], r.inputs["toPort"]) for r in etcd_rules} == {(2379, 2380)}


@pytest.mark.parametrize("plan_name", ["heron", "hybrid"])
def test_etcd_members_node_exporter_only_from_the_api_servers(plan_name: str, request):
    """9100/tcp to the etcd group (the members' node-exporter, for the global
    Prometheus, which runs only on the API servers): from the api group, no node
    subnet, no site; and the etcd group opens nothing but etcd's ports, 9100 and
    path MTU ICMP."""
    plan: Plan = request.getfixturevalue(plan_name)
    etcd_rules = [r for r in _rules(plan) if _group_name(plan, r) == "heron-etcd"]
    exporter = [r for r in etcd_rules if _covers(r, 9100)]
    assert {(r.inputs["ipProtocol"], r.inputs["fromPort"], r.inputs["toPort"]) for r in exporter} == {("tcp", 9100, 9100)}
    sources = [r.inputs.get("cidrIpv4") or plan.by_id(r.inputs["referencedSecurityGroupId"]).name for r in exporter]
    site_cidrs = [c for s in plan.cluster.sites for c in s.cidrs]
    assert sources == ["heron-api"]
    assert (len(site_cidrs) > 0) == (plan_name == "hybrid")
    others = {(r.inputs["ipProtocol"], r.inputs["fromPort"], r.inputs["toPort"]) for r in etcd_rules if r not in exporter}
    assert others == {("tcp", 2379, 2380), ("icmp", 3, 4)}


def test_api_kubelet_and_flannel_rules(hybrid: Plan):
    rules = _rules(hybrid)
    flannel = hybrid.cluster.network.flannel.port
    site_cidrs = {c for s in hybrid.cluster.sites for c in s.cidrs}
    node_subnets = {z.node_subnet for z in hybrid.ctx.layout.zones}

    def sources(group: str, port: int, protocol: str) -> set[str]:
        return {r.inputs.get("cidrIpv4") or hybrid.by_id(r.inputs["referencedSecurityGroupId"]).name
                for r in rules if _group_name(hybrid, r) == group and r.inputs["ipProtocol"] == protocol
                and _covers(r, port, protocol)}

    assert sources("heron-api", 6443, "tcp") >= {"10.201.0.0/20", *node_subnets, *site_cidrs}
    # Pool nodes and API servers (kubeadm nodes running flannel, the
    # autoscaler, monitoring) are both Kubernetes nodes: kubelet,
    # node-exporter and VXLAN from every other node.
    every_node = {*node_subnets, *site_cidrs, "heron-api"}
    for group in ("heron-api", "heron-nodes"):
        assert sources(group, 10250, "tcp") == every_node, group
        assert sources(group, 9100, "tcp") == every_node, group
        assert sources(group, flannel, "udp") == every_node, group
    assert sources("heron-nodes", 2379, "tcp") <= {hybrid.cluster.kubernetes.pod_cidr}
    egress = hybrid.of("aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule")
    assert len(egress) == 3


# --- etcd ----------------------------------------------------------------------


def _volume_checks(plan: Plan, members) -> None:
    disk = plan.cluster.control_plane.etcd.disk
    for m in members:
        volume = plan.one("aws:ebs/volume:Volume", f"{m.name}-data")
        assert volume.inputs["availabilityZone"] == m.zone
        assert volume.inputs["type"] == disk.type
        assert volume.inputs["size"] == disk.size_gib
        assert volume.inputs["iops"] == disk.iops
        assert volume.inputs["encrypted"] is True
        if disk.type == "gp3":
            assert volume.inputs["throughput"] == disk.throughput_mbps
        else:
            assert "throughput" not in volume.inputs, f"{disk.type} takes no throughput"
        assert volume.protect and volume.retain_on_delete, f"{volume.name} is not protected"

        instance = plan.one("aws:ec2/instance:Instance", m.name)
        assert instance.inputs["privateIp"] == m.ip
        assert instance.inputs["availabilityZone"] == m.zone
        subnet = plan.by_id(instance.inputs["subnetId"])
        assert subnet.name == f"heron-control-{m.zone}"
        assert ipaddress.ip_address(m.ip) in ipaddress.ip_network(subnet.inputs["cidrBlock"])
        assert instance.inputs["disableApiTermination"] is True
        assert instance.inputs["metadataOptions"]["httpTokens"] == "required"
        assert instance.inputs["tags"]["corral-etcd-volume"] == volume.id
        assert base64.b64decode(instance.inputs["userDataBase64"]).decode() == plan.user_data[m.name]
        assert "userDataBase64" not in instance.secrets  # references only: shown in plans
        assert "ami" in instance.ignore_changes and instance.delete_before_replace
        groups = [plan.by_id(g).name for g in instance.inputs["vpcSecurityGroupIds"]]
        assert groups == ["heron-etcd"]

        attachment = plan.one("aws:ec2/volumeAttachment:VolumeAttachment", f"{m.name}-data")
        assert attachment.inputs["volumeId"] == volume.id
        assert attachment.inputs["instanceId"] == instance.id
        assert attachment.inputs["deviceName"] == "/dev/sdf"


def test_etcd_volumes_io2(heron: Plan):
    members = heron.ctx.layout.etcd_members
    assert [m.zone for m in members] == ["us-west-2a", "us-west-2b", "us-west-2c"]
    assert len(heron.of("aws:ebs/volume:Volume")) == 3
    _volume_checks(heron, members)
    assert heron.one("aws:ebs/volume:Volume", "heron-etcd-0-data").inputs["iops"] == 12000


@pytest.mark.parametrize("change", [gp3_disk, io1_disk], ids=["gp3", "io1"])
def test_etcd_volume_types(change):
    plan = build(heron_with(change))
    _volume_checks(plan, plan.ctx.layout.etcd_members)
    throughputs = {v.inputs.get("throughput") for v in plan.of("aws:ebs/volume:Volume")}
    assert throughputs == ({300} if change is gp3_disk else {None})


def test_dedicated_events_cluster_and_five_members():
    def big(data: dict) -> None:
        data["controlPlane"]["etcd"]["members"] = 5
        data["controlPlane"]["etcd"]["dedicatedEventsCluster"] = True

    plan = build(heron_with(big))
    lay = plan.ctx.layout
    assert len(lay.events_members) == 5
    assert len(plan.of("aws:ebs/volume:Volume")) == 10
    etcd_components = [r for r in plan.resources if r.type == "corral:aws:Etcd"]
    assert sorted(r.name for r in etcd_components) == ["heron-etcd", "heron-etcd-events"]
    _volume_checks(plan, lay.etcd_members)
    _volume_checks(plan, lay.events_members)
    # Five members over three zones: two zones hold two each, at distinct addresses.
    ips = [plan.one("aws:ec2/instance:Instance", m.name).inputs["privateIp"] for m in (*lay.etcd_members, *lay.events_members)]
    assert len(set(ips)) == 10


# --- API servers ---------------------------------------------------------------


def test_api_servers_behind_internal_nlb(heron: Plan):
    lay = heron.ctx.layout
    for m in lay.api_servers:
        instance = heron.one("aws:ec2/instance:Instance", m.name)
        assert instance.inputs["privateIp"] == m.ip
        assert heron.by_id(instance.inputs["subnetId"]).name == f"heron-control-{m.zone}"
    lb = heron.one("aws:lb/loadBalancer:LoadBalancer", "heron-api")
    assert lb.inputs["internal"] is True
    assert lb.inputs["loadBalancerType"] == "network"
    mappings = lb.inputs["subnetMappings"]
    assert len(mappings) == len(lay.zones)
    first = mappings[0]
    assert heron.by_id(first["subnetId"]).name == f"heron-control-{lay.zones[0].zone}"
    assert first["privateIpv4Address"] == lay.api_vip
    for mapping in mappings:
        subnet = heron.by_id(mapping["subnetId"])
        assert ipaddress.ip_address(mapping["privateIpv4Address"]) in ipaddress.ip_network(subnet.inputs["cidrBlock"])
    tg = heron.one("aws:lb/targetGroup:TargetGroup", "heron-api")
    assert (tg.inputs["port"], tg.inputs["protocol"], tg.inputs["targetType"]) == (6443, "TCP", "ip")
    hc = tg.inputs["healthCheck"]
    assert (hc["protocol"], hc["path"], hc["port"]) == ("HTTPS", "/readyz", "6443")
    listener = heron.one("aws:lb/listener:Listener", "heron-api")
    assert (listener.inputs["port"], listener.inputs["protocol"]) == (6443, "TCP")
    assert listener.inputs["defaultActions"][0]["targetGroupArn"] == "arn:aws:elasticloadbalancing:::heron-api"
    targets = heron.of("aws:lb/targetGroupAttachment:TargetGroupAttachment")
    assert sorted(t.inputs["targetId"] for t in targets) == sorted(m.ip for m in lay.api_servers)
    api_ips = set(heron.resolved["api"].addresses.values())
    assert lay.api_vip in api_ips and len(api_ips) == 3


def test_autoscaler_identity_on_api_servers_only(heron: Plan):
    """cluster-autoscaler runs on the API servers (manifests) with their
    instance profile, which may resize only this cluster's ASGs."""
    role = heron.one("aws:iam/role:Role", "heron-apiserver")
    assume = json.loads(role.inputs["assumeRolePolicy"])
    assert [st["Principal"] for st in assume["Statement"]] == [{"Service": "ec2.amazonaws.com"}]
    policy = heron.one("aws:iam/rolePolicy:RolePolicy", "heron-cluster-autoscaler")
    assert heron.by_id(policy.inputs["role"]) is role
    statements = {st["Sid"]: st for st in json.loads(policy.inputs["policy"])["Statement"]}
    scale = statements["ScaleThisClustersGroups"]
    assert sorted(scale["Action"]) == ["autoscaling:SetDesiredCapacity", "autoscaling:TerminateInstanceInAutoScalingGroup"]
    condition = scale["Condition"]["StringEquals"]
    assert condition == {"aws:ResourceTag/k8s.io/cluster-autoscaler/heron": "owned"}
    # ... the tag every pool's ASG carries
    for group in heron.of("aws:autoscaling/group:Group"):
        tags = {t["key"]: t["value"] for t in group.inputs["tags"]}
        assert tags["k8s.io/cluster-autoscaler/heron"] == "owned"
    # Discovery and node templates only read; nothing else may change capacity.
    assert all(a.split(":")[1].startswith(("Describe", "Get")) for a in statements["Discover"]["Action"])
    profile = heron.one("aws:iam/instanceProfile:InstanceProfile", "heron-apiserver")
    assert profile.inputs["role"] == "heron-apiserver"
    # Every machine has its own role; only the API servers' may touch an ASG.
    api_names = {m.name for m in heron.ctx.layout.api_servers}
    for instance in heron.of("aws:ec2/instance:Instance"):
        expected = "heron-apiserver" if instance.name in api_names else instance.name
        assert instance.inputs.get("iamInstanceProfile") == expected, instance.name
    for template in heron.of("aws:ec2/launchTemplate:LaunchTemplate"):
        assert template.inputs["iamInstanceProfile"] == {"name": template.name}, template.name
    autoscaling = [p for p in heron.of("aws:iam/rolePolicy:RolePolicy") if "autoscaling:" in p.inputs["policy"]]
    assert [p.name for p in autoscaling] == ["heron-cluster-autoscaler"]



def test_one_secret_per_machine_role_read_only_by_that_role(heron: Plan):
    """Secrets Manager: a secret per etcd member, the API servers and each pool;
    each machine role's IAM role may GetSecretValue on its own secret's ARN only."""
    lay = heron.ctx.layout
    secrets = {s.inputs["name"]: s for s in heron.of("aws:secretsmanager/secret:Secret")}
    expected_owner = {f"corral/heron/{bootstrap.etcd_secret_key(m.name)}": m.name for m in lay.etcd_members}
    expected_owner["corral/heron/apiserver"] = "heron-apiserver"
    expected_owner.update({f"corral/heron/pool-{p.name}": node_group_name(heron.cluster, p) for p in heron.cluster.cloud_pools})
    assert set(secrets) == set(expected_owner)
    assert all(s.inputs["recoveryWindowInDays"] == 0 for s in secrets.values())
    versions = heron.of("aws:secretsmanager/secretVersion:SecretVersion")
    assert len(versions) == len(secrets) and all("secretString" in v.secrets for v in versions)
    arn = {name: f"arn:aws:secretsmanager:us-west-2:123456789012:secret:{name}-AbCdEf" for name in secrets}
    readers: dict[str, list[str]] = {}
    for policy in heron.of("aws:iam/rolePolicy:RolePolicy"):
        document = json.loads(policy.inputs["policy"])
        if not any("secretsmanager:" in str(st["Action"]) for st in document["Statement"]):
            continue
        # Exactly one statement: read one secret, by its full ARN, nothing else.
        (statement,) = document["Statement"]
        assert statement == {"Sid": "ReadOwnSecret", "Effect": "Allow",
                             "Action": ["secretsmanager:GetSecretValue"], "Resource": statement["Resource"]}
        role = heron.by_id(policy.inputs["role"])
        readers.setdefault(statement["Resource"], []).append(role.name)
    assert readers == {arn[name]: [owner] for name, owner in expected_owner.items()}
    # No other policy mentions a secret, and the autoscaler's touches no EC2 write.
    autoscaler = heron.one("aws:iam/rolePolicy:RolePolicy", "heron-cluster-autoscaler")
    actions = [a for st in json.loads(autoscaler.inputs["policy"])["Statement"] for a in st["Action"]]
    assert not [a for a in actions if a.startswith("ec2:") and not a.split(":")[1].startswith(("Describe", "Get"))]
    assert not [a for a in actions if a.startswith("secretsmanager:")]

# --- Node pools ------------------------------------------------------------------


def test_asg_per_pool_with_autoscaler_tags(heron: Plan):
    cluster = heron.cluster
    groups = heron.of("aws:autoscaling/group:Group")
    assert len(groups) == len(cluster.cloud_pools) == 3
    for pool in cluster.cloud_pools:
        name = node_group_name(cluster, pool)
        group = heron.one("aws:autoscaling/group:Group", name)
        assert group.inputs["name"] == name
        assert (group.inputs["minSize"], group.inputs["maxSize"]) == (pool.min_size, pool.max_size)
        assert group.inputs["desiredCapacity"] == pool.min_size
        assert "desiredCapacity" in group.ignore_changes
        subnets = [heron.by_id(s).name for s in group.inputs["vpcZoneIdentifiers"]]
        assert subnets == [f"heron-nodes-{z}" for z in pool.zones]
        tag_list = group.inputs["tags"]
        assert all(t["propagateAtLaunch"] is True for t in tag_list)
        tags = {t["key"]: t["value"] for t in tag_list}
        assert tags["k8s.io/cluster-autoscaler/enabled"] == "true"
        assert tags["k8s.io/cluster-autoscaler/heron"] == "owned"
        for key, value in cluster.node_labels(pool).items():
            assert tags[f"k8s.io/cluster-autoscaler/node-template/label/{key}"] == value
        for taint in cluster.node_taints(pool):
            assert tags[f"k8s.io/cluster-autoscaler/node-template/taint/{taint.key}"] == f"{taint.value}:{taint.effect}"
        gpu_tag = "k8s.io/cluster-autoscaler/node-template/resources/nvidia.com/gpu"
        assert tags.get(gpu_tag) == (str(pool.gpu.count) if pool.gpu else None)

        template = heron.by_id(group.inputs["launchTemplate"]["id"])
        assert template.type == "aws:ec2/launchTemplate:LaunchTemplate"
        assert group.inputs["launchTemplate"]["version"] == "1"
        assert template.inputs["instanceType"] == pool.machine_type
        assert template.inputs["metadataOptions"]["httpTokens"] == "required"
        assert template.inputs["blockDeviceMappings"][0]["ebs"]["volumeSize"] == pool.disk_size_gib
        assert "instanceMarketOptions" not in template.inputs
        assert base64.b64decode(template.inputs["userData"]).decode() == heron.user_data[pool.name]
        assert "userData" not in template.secrets  # references only: shown in plans

    # The team-reserved pool: team taint and label, GPU taint, workload label.
    reserved = {t["key"]: t["value"] for t in heron.one("aws:autoscaling/group:Group", "heron-gpu-a10g-inference").inputs["tags"]}
    assert reserved["k8s.io/cluster-autoscaler/node-template/taint/corral.dev/team"] == "inference:NoSchedule"
    assert reserved["k8s.io/cluster-autoscaler/node-template/taint/nvidia.com/gpu"] == "present:NoSchedule"
    assert reserved["k8s.io/cluster-autoscaler/node-template/label/corral.dev/workload"] == "inference"
    assert reserved["k8s.io/cluster-autoscaler/node-template/resources/nvidia.com/gpu"] == "8"


def test_spot_pool_and_gpu_image():
    def spot(data: dict) -> None:
        data["nodePools"][1]["spot"] = True

    plan = build(heron_with(spot), config={"corral:nodeImage": "ami-0123456789abcdef0",
                                           "corral:gpuNodeImage": "ami-0fedcba9876543210"})
    template = plan.one("aws:ec2/launchTemplate:LaunchTemplate", "heron-gpu-a10g")
    options = template.inputs["instanceMarketOptions"]
    assert options["marketType"] == "spot"
    assert options["spotOptions"]["spotInstanceType"] == "one-time"
    assert template.inputs["imageId"] == "ami-0fedcba9876543210"
    assert plan.one("aws:ec2/launchTemplate:LaunchTemplate", "heron-cpu-m7i").inputs["imageId"] == "ami-0123456789abcdef0"
    assert plan.one("aws:ec2/instance:Instance", "heron-etcd-0").inputs["ami"] == "ami-0123456789abcdef0"
    assert plan.one("aws:autoscaling/group:Group", "heron-gpu-a10g").inputs["capacityRebalance"] is True


def test_pool_sizes_do_not_change_the_resource_count(heron: Plan):
    def resize(data: dict) -> None:
        for pool in data["nodePools"]:
            # Stays under 1,000 nodes, where the model would add an events etcd.
            pool["maxSize"] = 900 if pool["name"] == "cpu-m7i" else 5

    bigger = build(heron_with(resize))
    assert len(bigger.resources) == len(heron.resources)
    assert bigger.one("aws:autoscaling/group:Group", "heron-cpu-m7i").inputs["maxSize"] == 900


def test_autoscaler_tag_limits():
    def long_label(data: dict) -> None:
        data["nodePools"][0]["labels"] = {"a" * 60 + ".example.com/" + "b" * 60: "x"}

    cluster = heron_with(long_label)
    with pytest.raises(Exception, match="longer than 128"):
        build(cluster)
    assert len(autoscaler_tags(heron_with(), heron_with().cloud_pools[0])) >= 6


def test_pool_zone_outside_the_network():
    def stray(data: dict) -> None:
        data["controlPlane"]["zones"] = ["us-west-2a", "us-west-2b"]

    cluster = heron_with(stray)
    # The model checks only that a pool's zones are in the region.
    cluster.cloud_pools[0].zones = ["us-west-2a", "us-west-2c"]
    with pytest.raises(Exception, match="us-west-2c.*not one of the control plane's zones"):
        build(cluster)


# --- Hybrid link -----------------------------------------------------------------


def test_no_vpn_without_sites(heron: Plan):
    assert not heron.of("aws:ec2/vpnGateway:VpnGateway")
    assert not heron.of("aws:ec2/vpnConnection:VpnConnection")
    assert heron.resolved["sites"] == {}


def test_vpn_per_site(hybrid: Plan):
    vpn_sites = [s for s in hybrid.cluster.sites if s.vpn]
    assert [s.name for s in vpn_sites] == ["pdx1", "sea1"]
    gateway = hybrid.one("aws:ec2/vpnGateway:VpnGateway", "heron-vpn")
    assert gateway.inputs["amazonSideAsn"] == "64512"
    attachment = hybrid.one("aws:ec2/vpnGatewayAttachment:VpnGatewayAttachment", "heron-vpn")
    assert hybrid.by_id(attachment.inputs["vpcId"]).name == "heron-vpc"
    propagations = hybrid.of("aws:ec2/vpnGatewayRoutePropagation:VpnGatewayRoutePropagation")
    assert sorted(hybrid.by_id(p.inputs["routeTableId"]).name for p in propagations) == sorted(
        f"heron-private-{z.zone}" for z in hybrid.ctx.layout.zones
    )

    customers = hybrid.of("aws:ec2/customerGateway:CustomerGateway")
    connections = hybrid.of("aws:ec2/vpnConnection:VpnConnection")
    assert len(customers) == len(connections) == len(vpn_sites)
    for site in vpn_sites:
        cgw = hybrid.one("aws:ec2/customerGateway:CustomerGateway", f"heron-vpn-{site.name}")
        assert cgw.inputs["type"] == "ipsec.1"
        assert cgw.inputs["ipAddress"] == str(site.vpn.peer_address)
        asn = cgw.inputs.get("bgpAsn") or cgw.inputs.get("bgpAsnExtended")
        assert asn == str(site.vpn.bgp_asn)
        assert ("bgpAsnExtended" in cgw.inputs) == (site.vpn.bgp_asn > 2_147_483_647)
        conn = hybrid.one("aws:ec2/vpnConnection:VpnConnection", f"heron-vpn-{site.name}")
        assert conn.inputs["customerGatewayId"] == cgw.id
        assert conn.inputs["vpnGatewayId"] == gateway.id
        assert conn.inputs["staticRoutesOnly"] is False
        assert conn.inputs["tunnel1PresharedKey"] == conn.inputs["tunnel2PresharedKey"] == PSK
        assert {"tunnel1PresharedKey", "tunnel2PresharedKey"} <= conn.secrets

        details = hybrid.resolved["sites"][site.name]
        assert details["site_bgp_asn"] == site.vpn.bgp_asn
        assert details["cloud_bgp_asn"] == 64512
        assert details["gateway_addresses"] == ["198.51.100.1", "198.51.100.2"]
        assert details["tunnels"][0]["inside_cidr"] == "169.254.10.0/30"
        assert details["cloud_cidrs"] == ["10.201.0.0/20"]
        assert PSK not in repr(details)


def test_psk_rules():
    assert check_psk("s", PSK) == PSK
    for bad in ("short", "0starts_with_zero", "has-a-dash-inside", "x" * 65):
        with pytest.raises(ValueError) as err:
            check_psk("sf1", bad)
        assert bad not in str(err.value)


def test_bad_psk_fails_the_deployment():
    with pytest.raises(Exception, match="pre-shared key for site pdx1 is not valid"):
        build(heron_with(with_sites), shared_keys={"pdx1": "0badkey-with-dash", "sea1": PSK})


def test_site_asn_must_differ_from_aws():
    def same_asn(data: dict) -> None:
        with_sites(data)
        data["sites"][0]["vpn"]["bgpASN"] = 64512

    with pytest.raises(Exception, match="equals the AWS side's ASN"):
        build(heron_with(same_asn))


# --- The etcd data disk's device path, as the bootstrap finds it ----------------


def test_locate_device_snippet_reads_the_volume_tag(tmp_path):
    """LOCATE_DEVICE against a fake IMDSv2: DEVICE is the volume's by-id path."""
    import http.server
    import subprocess
    import threading

    from corral.infra.aws.etcd import LOCATE_DEVICE, VOLUME_TAG

    class Imds(http.server.BaseHTTPRequestHandler):
        def do_PUT(self):
            ok = self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
            self._reply(200 if ok else 400, "token-1")

        def do_GET(self):
            ok = (self.path == f"/latest/meta-data/tags/instance/{VOLUME_TAG}"
                  and self.headers.get("X-aws-ec2-metadata-token") == "token-1")
            self._reply(200 if ok else 401, "vol-0123456789abcdef0")

        def _reply(self, code: int, body: str):
            self.send_response(code)
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Imds)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        script = LOCATE_DEVICE.replace("http://169.254.169.254", f"http://127.0.0.1:{server.server_port}")
        assert script != LOCATE_DEVICE
        out = subprocess.run(["bash", "-euo", "pipefail", "-c", script + 'echo "$DEVICE"'],
                             check=False, capture_output=True, text=True, timeout=60)
    finally:
        server.shutdown()
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_vol0123456789abcdef0"


# --- User data and images ----------------------------------------------------------


def test_user_data_over_16k_is_gzipped():
    """The API servers' cloud-init (certificates and keys) is ~22 KiB: over
    EC2's 16 KiB, so it goes gzipped (cloud-init reads gzip), deterministically."""
    import gzip
    import os

    from corral.infra.aws.common import USER_DATA_LIMIT, encode_user_data

    small = "#cloud-config\n" + "a: b\n" * 100
    assert base64.b64decode(encode_user_data(small)).decode() == small
    big = "#cloud-config\n" + "".join(f"# {base64.b64encode(os.urandom(48)).decode()}\n" for _ in range(280))
    assert len(big) > USER_DATA_LIMIT
    encoded = encode_user_data(big)
    assert encoded == encode_user_data(big)
    raw = base64.b64decode(encoded)
    assert len(raw) <= USER_DATA_LIMIT and gzip.decompress(raw).decode() == big
    with pytest.raises(ValueError, match="even gzipped"):
        encode_user_data(base64.b64encode(os.urandom(20_000)).decode())


def test_root_device_follows_the_image(heron: Plan):
    for template in heron.of("aws:ec2/launchTemplate:LaunchTemplate"):
        assert template.inputs["blockDeviceMappings"][0]["deviceName"] == "/dev/xvda"
    plan = build(heron_with(), config={"corral:rootDeviceName": "/dev/sda1"})
    for template in plan.of("aws:ec2/launchTemplate:LaunchTemplate"):
        assert template.inputs["blockDeviceMappings"][0]["deviceName"] == "/dev/sda1"


# --- In the real program (corral plan) ---------------------------------------------



def user_data_text(encoded: str) -> str:
    """EC2 user data as cloud-init reads it: base64, gzipped when large."""
    import gzip

    raw = base64.b64decode(encoded)
    return (gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw).decode()

@pytest.mark.parametrize("variant", [None, with_sites], ids=["heron", "heron-with-sites"])
def test_in_the_plan_of_the_real_program(variant):
    """`corral plan`'s runner with the core's program (PKI, cloud-init) and this package."""
    import json

    import corral.infra.aws as aws_package
    from corral.infra.plan import SECRET, plan_cluster

    cluster = heron_with(variant)
    plan = plan_cluster(cluster, platform=aws_package, stack_config={"aws:region": "us-west-2"})
    resources = plan.resources
    by_type: dict[str, list[dict]] = {}
    for r in resources:
        by_type.setdefault(r["type"], []).append(r)

    volumes = by_type["aws:ebs/volume:Volume"]
    assert len(volumes) == 3
    for v in volumes:
        assert v["protect"] and v["retainOnDelete"]
        assert v["inputs"]["type"] == "io2" and "throughput" not in v["inputs"]
    # User data holds references to the secret store, never a secret: plain in the plan.
    for instance in by_type["aws:ec2/instance:Instance"]:
        assert "corral-fetch-secrets" in user_data_text(instance["inputs"]["userDataBase64"])
        assert instance["parent"] in ("heron-etcd", "heron-apiservers")
    for template in by_type["aws:ec2/launchTemplate:LaunchTemplate"]:
        assert "corral-fetch-secrets" in user_data_text(template["inputs"]["userData"])
    for version in by_type["aws:secretsmanager/secretVersion:SecretVersion"]:
        assert version["inputs"]["secretString"] == SECRET
    for rule in by_type["aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"]:
        assert rule["inputs"].get("cidrIpv4") != "0.0.0.0/0"
    assert len(by_type["aws:autoscaling/group:Group"]) == 3
    assert "PRIVATE KEY" not in json.dumps(resources)

    sites = [s for s in cluster.sites if s.vpn]
    assert len(by_type.get("aws:ec2/customerGateway:CustomerGateway", [])) == len(sites)
    assert len(by_type.get("aws:ec2/vpnConnection:VpnConnection", [])) == len(sites)
    for connection in by_type.get("aws:ec2/vpnConnection:VpnConnection", []):
        assert connection["inputs"]["tunnel1PresharedKey"] == SECRET
        assert connection["parent"] == "heron-hybridlink"
