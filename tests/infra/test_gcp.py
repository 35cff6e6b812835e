"""The GCP components under Pulumi's mocks: what `pulumi up` would be asked to create.

Each test builds ibis (or a variant of it, loaded through the real loader so
it passes every model rule) with the five `corral.infra.gcp` components, and
inspects what the components registered: type token, name, parent, resource
options (protect, retainOnDelete, ignoreChanges) and inputs, exactly as the
engine would receive them (camelCase property names, secrets marked).
Outputs are resolved after the program has finished, so every assertion
looks at a real value.
"""

from __future__ import annotations

import copy
import ipaddress
import json
import re
from dataclasses import dataclass
from pathlib import Path

import pulumi
import pytest
from pulumi.runtime import rpc
from pulumi.runtime.mocks import MockMonitor
from pulumi.runtime.settings import SETTINGS
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await
from ruamel.yaml import YAML

from corral.infra import bootstrap
from corral.infra.platform import ClusterContext
from corral.machine.data_disk import ETCD_DISK_LOCATORS, GCP_ETCD_DEVICE_NAME
from corral.model import load_cluster
from corral.model.layout import node_group_name

ROOT = Path(__file__).resolve().parents[2]
IBIS = ROOT / "clusters" / "ibis.yaml"
PROJECT = "corral-test"
HA_VPN_ADDRESSES = ("34.1.0.10", "34.1.0.11")


# --- Mocks and a recorder ----------------------------------------------------


class GcpMocks(pulumi.runtime.Mocks):
    """Echo inputs back, plus the computed outputs the components read."""

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        state = dict(args.inputs)
        name = args.inputs.get("name") or args.name
        kind = args.typ.rsplit(":", 1)[-1]
        zone, region = args.inputs.get("zone"), args.inputs.get("region")
        scope = f"zones/{zone}" if zone else f"regions/{region}" if region else "global"
        collection = kind[0].lower() + kind[1:] + "s"
        state["selfLink"] = f"https://www.googleapis.com/compute/v1/projects/{PROJECT}/{scope}/{collection}/{name}"
        if kind == "InstanceTemplate":
            state["selfLinkUnique"] = state["selfLink"] + "?uniqueId=1"
        if kind == "InstanceGroupManager":
            state["instanceGroup"] = (
                f"https://www.googleapis.com/compute/v1/projects/{PROJECT}/zones/{zone}/instanceGroups/{name}"
            )
        if kind == "Account":  # a service account
            state["email"] = f"{args.inputs['accountId']}@{PROJECT}.iam.gserviceaccount.com"
            state["project"] = PROJECT
        if kind == "IAMCustomRole":
            state["name"] = f"projects/{PROJECT}/roles/{args.inputs['roleId']}"
        if kind == "Secret" and "secretId" in args.inputs:  # Secret Manager's id
            return f"projects/{PROJECT}/secrets/{args.inputs['secretId']}", state
        if kind == "HaVpnGateway":
            state["vpnInterfaces"] = [{"id": i, "ipAddress": ip} for i, ip in enumerate(HA_VPN_ADDRESSES)]
        return f"{name}-id", state

    def call(self, args: pulumi.runtime.MockCallArgs):
        return {}


@dataclass
class Registered:
    type: str
    name: str
    parent: str
    custom: bool
    protect: bool
    retain_on_delete: bool
    ignore_changes: list[str]
    inputs: dict


class Recorder(MockMonitor):
    """A mock monitor that also keeps every registration's options.

    (corral.infra.plan has its own RecordingMonitor; this one also keeps
    ignoreChanges, and runs with known computed outputs instead of a preview.
    `test_the_core_plan_of_ibis` runs the core's recorder over this package.)
    """

    def __init__(self, mocks: pulumi.runtime.Mocks):
        super().__init__(mocks)
        self.registered = []

    def RegisterResource(self, request):
        response = super().RegisterResource(request)
        if request.type != "pulumi:pulumi:Stack":
            self.registered.append(Registered(
                type=request.type,
                name=request.name,
                parent=request.parent,
                custom=request.custom,
                protect=request.protect,
                retain_on_delete=request.retainOnDelete,
                ignore_changes=list(request.ignoreChanges),
                inputs=rpc.deserialize_properties(request.object),
            ))
        return response

    def of_type(self, kind: str) -> list[Registered]:
        return [r for r in self.registered if r.type == f"gcp:compute/{kind[0].lower() + kind[1:]}:{kind}"]

    def named(self, name: str, kind: str | None = None) -> Registered:
        found = [r for r in self.registered if r.name == name and (kind is None or r.type.endswith(":" + kind))]
        assert len(found) == 1, f"{len(found)} resources named {name}"
        return found[0]


def plain(value):
    """A registered input without secret markers."""
    if rpc.is_rpc_secret(value):
        return plain(rpc.unwrap_rpc_secret(value))
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def resolve(output):
    """The value of an Output once the program has run (fails if unknown)."""
    out = pulumi.Output.from_input(output)
    assert _sync_await(out.is_known()), "output is unknown"
    return _sync_await(out.future())


def run(program, config: dict[str, str] | None = None) -> tuple[Recorder, object]:
    """Run `program` under the mocks; its result and what it registered."""
    mocks = GcpMocks()
    recorder = Recorder(mocks)
    pulumi.runtime.set_mocks(mocks, project="corral", stack="test", preview=False, monitor=recorder)
    pulumi.runtime.set_all_config({"gcp:project": PROJECT, **(config or {})})
    SETTINGS.rpc_manager.clear()
    SETTINGS.outputs.clear()
    result = {}

    def body():
        result["value"] = program()

    _sync_await(run_pulumi_func(body))
    return recorder, result.get("value")


# --- Clusters --------------------------------------------------------------

def ibis_data() -> dict:
    return YAML(typ="safe").load(IBIS.read_text())


def load_variant(tmp_path: Path, change=None):
    """ibis, changed by `change(data)`, through the real loader and rules."""
    data = copy.deepcopy(ibis_data())
    if change:
        change(data)
    path = tmp_path / f"{data['name']}.yaml"
    path.write_text(json.dumps(data, indent=2))  # JSON is YAML
    return load_cluster(path)


def with_sites(data: dict) -> None:
    data["sites"] = [
        {"name": "dc1", "cidrs": ["10.60.0.0/16"], "vpn": {"peerAddress": "198.51.100.7", "bgpASN": 65020}},
        {"name": "lab", "cidrs": ["10.61.0.0/16"]},  # no VPN: no tunnels
        {"name": "dc2", "cidrs": ["10.62.0.0/16", "10.63.0.0/16"],
         "vpn": {"peerAddress": "203.0.113.20", "bgpASN": 65030}},
    ]
    # Cloud VPN carries less than ibis's 1410 + 50; the model's default fits it (corral/model/mtu.py).
    data["network"]["flannel"].pop("mtu")


def full_program(cluster):
    """All five components as the core program wires them (user data stand-ins)."""
    from corral.infra import gcp

    ctx = ClusterContext.of(cluster)
    lay = ctx.layout

    def program():
        network = gcp.Network("network", ctx)
        etcd = gcp.Etcd("etcd", ctx, network, lay.etcd_members,
                        [f"#cloud-config etcd {m.name}" for m in lay.etcd_members])
        events = None
        if lay.events_members:
            events = gcp.Etcd("etcd-events", ctx, network, lay.events_members,
                              [f"#cloud-config events {m.name}" for m in lay.events_members])
        api = gcp.ApiServers("apiservers", ctx, network, [f"#cloud-config api {m.name}" for m in lay.api_servers])
        pools = gcp.NodePools("nodepools", ctx, network, {p.name: f"#cloud-config {p.name}" for p in cluster.cloud_pools})
        link = gcp.HybridLink("hybrid", ctx, network,
                              {s.name: pulumi.Output.secret(f"psk-{s.name}") for s in cluster.sites if s.vpn})
        # The secret store as the program fills it: one secret per machine role, then the grants.
        store = gcp.SecretStore("secrets", ctx)
        keys = [bootstrap.etcd_secret_key(m.name) for m in (*lay.etcd_members, *lay.events_members)]
        keys += [bootstrap.APISERVER_SECRET, *(bootstrap.pool_secret_key(p.name) for p in cluster.cloud_pools)]
        for key in keys:
            store.put(key, pulumi.Output.secret(f"value of {key}"))
        bootstrap.grant_readers(store, etcd, events, api, pools)
        return {"ctx": ctx, "network": network, "etcd": etcd, "events": events, "api": api,
                "pools": pools, "link": link, "store": store}

    return program


@pytest.fixture(scope="module")
def ibis():
    cluster = load_cluster(IBIS)
    recorder, parts = run(full_program(cluster))
    return cluster, recorder, parts


# --- Naming and structure ---------------------------------------------------


GCE_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def test_components_have_the_contract_type_tokens(ibis):
    _, rec, _ = ibis
    components = {r.name: r.type for r in rec.registered if not r.custom}
    assert components == {
        "network": "corral:gcp:Network",
        "etcd": "corral:gcp:Etcd",
        "apiservers": "corral:gcp:ApiServers",
        "nodepools": "corral:gcp:NodePools",
        "hybrid": "corral:gcp:HybridLink",
        "secrets": "corral:gcp:SecretStore",
    }


def test_every_resource_is_a_child_with_a_valid_gce_name(ibis):
    _, rec, _ = ibis
    custom = [r for r in rec.registered if r.custom]
    assert len(custom) > 30
    for r in custom:
        assert "corral:gcp:" in r.parent, f"{r.name} has no component parent"
        # service accounts are named by accountId; IAM members by Pulumi name only
        name = r.inputs.get("name") or r.inputs.get("namePrefix") or r.inputs.get("accountId") or r.name
        assert name and name.startswith("ibis-"), r
        if "name" in r.inputs:
            assert GCE_NAME.match(name) and len(name) <= 63, name


def test_component_signatures_match_the_contract():
    import inspect

    from corral.infra import gcp

    expected = {
        "Network": ["name", "ctx", "opts"],
        "Etcd": ["name", "ctx", "network", "members", "user_data", "opts"],
        "ApiServers": ["name", "ctx", "network", "user_data", "opts"],
        "NodePools": ["name", "ctx", "network", "user_data", "opts"],
        "HybridLink": ["name", "ctx", "network", "shared_keys", "opts"],
    }
    for cls, params in expected.items():
        sig = inspect.signature(getattr(gcp, cls).__init__)
        assert list(sig.parameters)[1:] == params, cls
        assert sig.parameters["opts"].default is None


# --- Network ----------------------------------------------------------------


def test_autoscaler_identity_on_api_servers_only(ibis):
    """cluster-autoscaler runs on the API servers (manifests) as their service
    account: read on the project, resize only on this cluster's pool MIGs (an
    IAM condition naming each). Every etcd member and pool has an account of
    its own that holds no project role at all."""
    cluster, rec, parts = ibis
    account = rec.named("ibis-apiserver", "Account")
    assert account.inputs["accountId"] == "ibis-apiserver" and 6 <= len("ibis-apiserver") <= 30
    email = f"ibis-apiserver@{PROJECT}.iam.gserviceaccount.com"
    read = rec.named("ibis-autoscaler-read", "IAMCustomRole").inputs
    resize = rec.named("ibis-autoscaler-resize", "IAMCustomRole").inputs
    assert read["roleId"] == "corral_ibis_autoscaler_read" and resize["roleId"] == "corral_ibis_autoscaler_resize"
    assert resize["permissions"] == ["compute.instanceGroupManagers.update"]  # the only write
    assert sorted(read["permissions"]) == sorted([
        "compute.instanceGroupManagers.get", "compute.instanceGroupManagers.list",
        "compute.instanceGroups.get", "compute.instanceGroups.list",
        "compute.instances.get", "compute.instances.list",
        "compute.instanceTemplates.get", "compute.instanceTemplates.list",
        "compute.machineTypes.get", "compute.machineTypes.list", "compute.zones.list",
    ])
    assert all(p.rsplit(".", 1)[1] in ("get", "list") for p in read["permissions"])
    members = {m.name: m.inputs for m in rec.registered if m.type == "gcp:projects/iAMMember:IAMMember"}
    assert set(members) == {"ibis-apiserver-autoscaler-read", "ibis-apiserver-autoscaler-resize"}
    for member in members.values():
        assert member["member"] == f"serviceAccount:{email}" and member["project"] == PROJECT
    # The custom roles, never a predefined (broad) one.
    assert members["ibis-apiserver-autoscaler-read"]["role"] == f"projects/{PROJECT}/roles/corral_ibis_autoscaler_read"
    assert members["ibis-apiserver-autoscaler-resize"]["role"] == f"projects/{PROJECT}/roles/corral_ibis_autoscaler_resize"
    assert "condition" not in members["ibis-apiserver-autoscaler-read"]
    condition = members["ibis-apiserver-autoscaler-resize"]["condition"]["expression"]
    migs = [g["mig"] for info in parts["pools"].groups.values() for g in info["zones"].values()]
    assert condition == " || ".join(f'resource.name.endsWith("/instanceGroupManagers/{m}")' for m in migs)
    api_names = {m.name for m in parts["ctx"].layout.api_servers}
    instances = rec.of_type("Instance")
    assert {i.inputs["name"] for i in instances} >= api_names
    for instance in instances:
        accounts = instance.inputs["serviceAccount"]
        own = "ibis-apiserver" if instance.inputs["name"] in api_names else instance.inputs["name"]
        assert accounts["email"] == f"{own}@{PROJECT}.iam.gserviceaccount.com", instance.inputs["name"]
        assert accounts["scopes"] == ["https://www.googleapis.com/auth/cloud-platform"]
    for template in rec.of_type("InstanceTemplate"):
        pool = template.inputs["labels"]["corral-pool"]
        assert template.inputs["serviceAccount"]["email"] == f"ibis-pool-{pool}@{PROJECT}.iam.gserviceaccount.com"



def test_one_secret_per_machine_role_read_only_by_that_role(ibis):
    """Secret Manager: a secret per etcd member, the API servers and each pool,
    in the cluster's region, each readable by exactly one service account."""
    cluster, rec, parts = ibis
    lay = parts["ctx"].layout
    owner = {f"ibis-{bootstrap.etcd_secret_key(m.name)}": m.name for m in lay.etcd_members}
    owner["ibis-apiserver"] = "ibis-apiserver"
    owner.update({f"ibis-pool-{p.name}": f"ibis-pool-{p.name}" for p in cluster.cloud_pools})
    def of(kind: str) -> list:
        return [r for r in rec.registered if r.type == f"gcp:secretmanager/{kind[0].lower() + kind[1:]}:{kind}"]

    secrets = {r.inputs["secretId"]: r for r in of("Secret")}
    assert set(secrets) == set(owner)
    for secret in secrets.values():
        assert secret.inputs["replication"] == {"userManaged": {"replicas": [{"location": "us-central1"}]}}
    versions = of("SecretVersion")
    assert len(versions) == len(secrets)
    assert all(rpc.is_rpc_secret(v.inputs["secretData"]) for v in versions)
    grants = of("SecretIamMember")
    readers: dict[str, list[str]] = {}
    for grant in grants:
        assert grant.inputs["role"] == "roles/secretmanager.secretAccessor"
        secret_id = grant.inputs["secretId"].rsplit("/", 1)[-1]
        readers.setdefault(secret_id, []).append(grant.inputs["member"])
    assert readers == {
        secret_id: [f"serviceAccount:{account}@{PROJECT}.iam.gserviceaccount.com"]
        for secret_id, account in owner.items()
    }

def test_network_is_custom_mode_with_a_subnet_per_zone_range(ibis):
    cluster, rec, parts = ibis
    lay = parts["ctx"].layout
    (vpc,) = rec.of_type("Network")
    assert vpc.inputs["autoCreateSubnetworks"] is False
    # ibis: flannel VXLAN MTU 1410 + 50 = GCE's default 1460.
    assert vpc.inputs["mtu"] == cluster.network.flannel.mtu + 50 == 1460
    subnets = {s.inputs["name"]: s.inputs for s in rec.of_type("Subnetwork")}
    for z in lay.zones:
        letter = z.zone[-1]
        assert subnets[f"ibis-control-{letter}"]["ipCidrRange"] == z.control_subnet
        assert subnets[f"ibis-nodes-{letter}"]["ipCidrRange"] == z.node_subnet
        assert subnets[f"ibis-nodes-{letter}"]["region"] == "us-central1"
    assert len(subnets) == 2 * len(lay.zones)
    (nat,) = rec.of_type("RouterNat")
    assert nat.inputs["sourceSubnetworkIpRangesToNat"] == "ALL_SUBNETWORKS_ALL_IP_RANGES"
    assert resolve(parts["network"].control_subnets[lay.zones[0].zone]).endswith("/subnetworks/ibis-control-a")


def test_vpc_mtu_follows_flannel(tmp_path):
    from corral.infra.gcp.network import vpc_mtu

    def jumbo(data):
        data["network"]["flannel"]["mtu"] = 8846

    assert vpc_mtu(ClusterContext.of(load_variant(tmp_path, jumbo))) == 8896

    # The model refuses more (tests/model/test_mtu.py); the VPC still guards itself.
    too_big = load_variant(tmp_path, jumbo)
    too_big.network.flannel.mtu = 8950
    with pytest.raises(ValueError, match="at most 8846"):
        vpc_mtu(ClusterContext.of(too_big))


def firewall_rules(rec: Recorder) -> dict[str, dict]:
    return {r.inputs["name"]: r.inputs for r in rec.of_type("Firewall")}


def opens(rule: dict, protocol: str, port: int) -> bool:
    for allow in rule["allows"]:
        if allow["protocol"] != protocol:
            continue
        for spec in allow.get("ports") or []:
            low, _, high = spec.partition("-")
            if int(low) <= port <= int(high or low):
                return True
    return False


def test_etcd_ports_are_never_open_to_the_world(ibis, tmp_path):
    for rec in (ibis[1], run(full_program(load_variant(tmp_path, with_sites)))[0]):
        rules = firewall_rules(rec)
        etcd_rules = [r for r in rules.values() if opens(r, "tcp", 2379) or opens(r, "tcp", 2380)]
        assert [r["name"] for r in etcd_rules] == ["ibis-etcd"]
        (rule,) = etcd_rules
        assert "sourceRanges" not in rule or not rule["sourceRanges"]
        assert sorted(rule["sourceTags"]) == ["apiserver", "etcd"]
        assert rule["targetTags"] == ["etcd"]
        for r in rules.values():
            assert "0.0.0.0/0" not in (r.get("sourceRanges") or []), r["name"]


def test_etcd_members_node_exporter_only_from_the_api_servers(ibis, tmp_path):
    """9100/tcp to tag etcd (the members' node-exporter, for the global Prometheus,
    which runs only on the API servers): one rule, from tag apiserver, no range."""
    sited = load_variant(tmp_path, with_sites)
    for cluster, rec in ((ibis[0], ibis[1]), (sited, run(full_program(sited))[0])):
        rules = firewall_rules(rec)
        to_members = [r for r in rules.values()
                      if opens(r, "tcp", 9100) and (not r.get("targetTags") or "etcd" in r["targetTags"])]
        assert [r["name"] for r in to_members] == ["ibis-etcd-node-exporter"]
        (rule,) = to_members
        assert rule["allows"] == [{"protocol": "tcp", "ports": ["9100"]}]
        assert rule["targetTags"] == ["etcd"] and rule["sourceTags"] == ["apiserver"]
        sites = [c for s in cluster.sites for c in s.cidrs]
        assert (len(sites) > 0) == (cluster is sited)
        assert not rule.get("sourceRanges"), rule["sourceRanges"]


def test_api_kubelet_and_flannel_rules(tmp_path):
    cluster = load_variant(tmp_path, with_sites)
    rec, parts = run(full_program(cluster))
    rules = firewall_rules(rec)
    lay = parts["ctx"].layout
    node_cidrs = {z.node_subnet for z in lay.zones}
    site_cidrs = {c for s in cluster.sites for c in s.cidrs}

    api = rules["ibis-apiserver"]
    assert opens(api, "tcp", 6443) and api["targetTags"] == ["apiserver"]
    assert node_cidrs | site_cidrs | {cluster.control_plane.network_cidr} <= set(api["sourceRanges"])

    health = rules["ibis-apiserver-health"]
    assert set(health["sourceRanges"]) == {"35.191.0.0/16", "130.211.0.0/22"}
    assert opens(health, "tcp", 6443)

    overlay = rules["ibis-overlay"]
    assert opens(overlay, "tcp", 10250) and opens(overlay, "tcp", 9100)  # kubelet, node-exporter
    assert opens(overlay, "udp", cluster.network.flannel.port)
    assert not opens(overlay, "tcp", 2379)
    assert node_cidrs | site_cidrs == set(overlay["sourceRanges"])
    assert "node" in overlay["targetTags"]


# --- Etcd -------------------------------------------------------------------


def check_etcd(cluster, rec: Recorder, members) -> None:
    disk_spec = cluster.control_plane.etcd.disk
    for m in members:
        disk = rec.named(f"{m.name}-data", "Disk")
        assert disk.inputs["zone"] == m.zone
        assert disk.inputs["type"] == disk_spec.type
        assert disk.inputs["size"] == disk_spec.size_gib
        assert disk.inputs["provisionedIops"] == disk_spec.iops
        if disk_spec.type == "hyperdisk-balanced":
            assert disk.inputs["provisionedThroughput"] == disk_spec.throughput_mbps
        else:
            assert "provisionedThroughput" not in disk.inputs
        assert disk.protect and disk.retain_on_delete

        vm = rec.named(m.name, "Instance")
        assert vm.inputs["zone"] == m.zone
        assert vm.inputs["machineType"] == cluster.control_plane.etcd.machine_type
        assert vm.inputs["deletionProtection"] is True
        (nic,) = vm.inputs["networkInterfaces"]
        assert nic["networkIp"] == m.ip
        assert nic["subnetwork"].endswith(f"/subnetworks/ibis-control-{m.zone[-1]}")
        (attached,) = vm.inputs["attachedDisks"]
        assert attached["deviceName"] == "etcd-data"
        assert attached["source"].endswith(f"/disks/{m.name}-data")
        assert vm.inputs["tags"] == ["etcd"]
        check_metadata_and_shielding(vm.inputs, gpu=False)


def check_metadata_and_shielding(inputs: dict, gpu: bool) -> None:
    """User data in metadata holds no secret (not even marked as one), project SSH
    keys are blocked, and the machine is a Shielded VM (Secure Boot off only on
    GPU machines, whose DKMS-built NVIDIA modules are unsigned)."""
    assert not rpc.is_rpc_secret(inputs["metadata"]), "user data holds references, never secrets"
    metadata = plain(inputs["metadata"])
    assert metadata["user-data"].startswith("#cloud-config")
    assert "PRIVATE KEY" not in metadata["user-data"]
    assert metadata["block-project-ssh-keys"] == "true"
    assert inputs["shieldedInstanceConfig"] == {
        "enableSecureBoot": not gpu, "enableVtpm": True, "enableIntegrityMonitoring": True,
    }


def test_etcd_disks_per_member_zone_type_size_iops_throughput(ibis):
    cluster, rec, parts = ibis
    members = parts["ctx"].layout.etcd_members
    assert len(members) == 3
    assert {m.zone for m in members} == set(cluster.control_plane.zones)
    check_etcd(cluster, rec, members)
    assert parts["etcd"].device_path == "/dev/disk/by-id/google-etcd-data"


@pytest.mark.parametrize("disk", [
    {"type": "hyperdisk-extreme", "sizeGiB": 256, "iops": 20000},
    {"type": "pd-extreme", "sizeGiB": 1000, "iops": 15000},
])
def test_iops_only_disk_types_get_no_throughput(tmp_path, disk):
    def change(data):
        data["controlPlane"]["etcd"]["disk"] = disk
        data["controlPlane"]["etcd"]["machineType"] = "n2-highmem-80"

    cluster = load_variant(tmp_path, change)
    rec, parts = run(full_program(cluster))
    check_etcd(cluster, rec, parts["ctx"].layout.etcd_members)


def test_dedicated_events_cluster_gets_its_own_protected_disks(tmp_path):
    def change(data):
        data["controlPlane"]["etcd"]["dedicatedEventsCluster"] = True

    cluster = load_variant(tmp_path, change)
    rec, parts = run(full_program(cluster))
    events = parts["ctx"].layout.events_members
    assert events
    check_etcd(cluster, rec, events)
    assert rec.named("etcd-events").type == "corral:gcp:Etcd"
    disks = rec.of_type("Disk")
    assert len(disks) == 6 and all(d.protect and d.retain_on_delete for d in disks)


def test_hyperdisk_on_n2_is_flagged():
    # ibis' etcd machine type (n2-highmem-8) cannot attach hyperdisk-balanced.
    from corral.infra.gcp.common import DISK_SERIES, series

    assert series("n2-highmem-8") not in DISK_SERIES["hyperdisk-balanced"]
    assert series("c3-highmem-8") in DISK_SERIES["hyperdisk-balanced"]


# --- API servers ------------------------------------------------------------


def test_api_servers_sit_behind_an_internal_tcp_load_balancer(ibis):
    _, rec, parts = ibis
    lay = parts["ctx"].layout
    for server in lay.api_servers:
        vm = rec.named(server.name, "Instance")
        assert vm.inputs["networkInterfaces"][0]["networkIp"] == server.ip
        assert vm.inputs["zone"] == server.zone
        assert vm.inputs["tags"] == ["apiserver"]
        check_metadata_and_shielding(vm.inputs, gpu=False)
    groups = rec.of_type("InstanceGroup")
    assert {g.inputs["zone"] for g in groups} == {s.zone for s in lay.api_servers}
    assert sum(len(g.inputs["instances"]) for g in groups) == len(lay.api_servers)

    (hc,) = rec.of_type("RegionHealthCheck")
    assert hc.inputs["httpsHealthCheck"] == {"port": 6443, "requestPath": "/readyz"}
    (backend,) = rec.of_type("RegionBackendService")
    assert backend.inputs["loadBalancingScheme"] == "INTERNAL"
    assert backend.inputs["protocol"] == "TCP"
    assert len(backend.inputs["backends"]) == len(groups)
    (rule,) = rec.of_type("ForwardingRule")
    assert rule.inputs["ipAddress"] == lay.api_vip
    assert rule.inputs["ports"] == ["6443"]
    assert rule.inputs["loadBalancingScheme"] == "INTERNAL"
    assert rule.inputs["subnetwork"].endswith("/subnetworks/ibis-control-a")
    assert ipaddress.ip_address(lay.api_vip) in ipaddress.ip_network(lay.zones[0].control_subnet)


# --- Node pools -------------------------------------------------------------


def test_a_mig_per_pool_zone_with_min_max_exposed(ibis):
    cluster, rec, parts = ibis
    pools = parts["pools"]
    migs = {m.inputs["name"]: m for m in rec.of_type("InstanceGroupManager")}
    specs = resolve(pools.autoscaler_nodes)
    assert set(pools.groups) == {p.name for p in cluster.cloud_pools}
    for pool in cluster.cloud_pools:
        group = pools.groups[pool.name]
        assert group["name"] == node_group_name(cluster, pool)
        assert (group["min"], group["max"]) == (pool.min_size, pool.max_size)
        assert list(group["zones"]) == pool.zones
        assert sum(z["max"] for z in group["zones"].values()) == pool.max_size
        assert sum(z["min"] for z in group["zones"].values()) == pool.min_size
        for zone, share in group["zones"].items():
            mig = migs[share["mig"]]
            assert share["mig"] == f"{group['name']}-{zone[-1]}"
            assert mig.inputs["zone"] == zone
            assert mig.inputs["targetSize"] == share["min"]
            assert "targetSize" in mig.ignore_changes
            url = f"https://www.googleapis.com/compute/v1/projects/{PROJECT}/zones/{zone}/instanceGroups/{share['mig']}"
            assert f"{share['min']}:{share['max']}:{url}" in specs
    # cpu-n2: 150 over three zones; gpu-a100: 32 over a and c.
    assert [z["max"] for z in pools.groups["cpu-n2"]["zones"].values()] == [50, 50, 50]
    assert [z["max"] for z in pools.groups["gpu-a100"]["zones"].values()] == [16, 16]
    assert len(specs) == len(migs) == 3 + 2 + 3
    assert pools.cloud_settings == {"GCP_PROJECT": PROJECT}
    # cluster-autoscaler drives the size; no GCE autoscaler competes with it.
    assert not rec.of_type("Autoscaler") and not rec.of_type("RegionAutoscaler")


def test_instance_templates_carry_machine_gpus_spot_labels_and_user_data(ibis):
    _, rec, _ = ibis
    templates = {t.name: t.inputs for t in rec.of_type("InstanceTemplate")}
    a100 = templates["ibis-gpu-a100-a"]
    assert a100["machineType"] == "a2-highgpu-8g"
    assert "guestAccelerators" not in a100  # A2 brings its A100s
    assert a100["scheduling"]["provisioningModel"] == "SPOT"
    assert a100["scheduling"]["preemptible"] is True
    assert a100["scheduling"]["onHostMaintenance"] == "TERMINATE"
    assert a100["networkInterfaces"][0]["subnetwork"].endswith("/subnetworks/ibis-nodes-a")
    cpu = templates["ibis-cpu-n2-b"]
    assert cpu["scheduling"]["provisioningModel"] == "STANDARD"
    assert cpu["disks"][0]["diskSizeGb"] == 200
    assert cpu["tags"] == ["node"]
    assert cpu["labels"]["corral-pool"] == "cpu-n2"
    assert cpu["labels"]["cluster-autoscaler-name"] == "ibis"
    for name, t in templates.items():
        check_metadata_and_shielding(t, gpu=t["labels"]["corral-pool"].startswith("gpu"))
        metadata = plain(t["metadata"])
        assert metadata["user-data"].startswith("#cloud-config")
        assert "AUTOSCALER_ENV_VARS" in metadata["kube-env"]
    env = plain(templates["ibis-gpu-a100-c"]["metadata"])["kube-env"]
    assert "corral.dev/pool=gpu-a100" in env
    assert "nvidia.com/gpu=present:NoSchedule" in env
    assert "corral.dev/preemptible=true:NoSchedule" in env


def test_kube_env_is_what_cluster_autoscaler_parses():
    from ruamel.yaml import YAML as _Y

    from corral.infra.gcp.nodepools import kube_env

    cluster = load_cluster(IBIS)
    pool = cluster.pool("gpu-l4")
    parsed = _Y(typ="safe").load(kube_env(cluster, pool))
    fields = dict(item.split("=", 1) for item in parsed["AUTOSCALER_ENV_VARS"].split(";"))
    assert fields["os"] == "linux"
    labels = dict(kv.split("=", 1) for kv in fields["node_labels"].split(","))
    assert labels == cluster.node_labels(pool)
    taints = dict(kv.split("=", 1) for kv in fields["node_taints"].split(","))
    assert taints == {t.key: f"{t.value}:{t.effect}" for t in cluster.node_taints(pool)}
    # GPU pools: the GPU taint, and the preflight taint until the node's GPU check passes.
    assert taints["nvidia.com/gpu"] == "present:NoSchedule"
    assert taints["corral.dev/preflight"] == "pending:NoSchedule"


def test_n1_gpu_pools_attach_accelerators(tmp_path):
    def change(data):
        data["nodePools"].append({
            "name": "gpu-t4", "provider": "gcp", "machineType": "n1-standard-16",
            "zones": ["us-central1-b"], "gpu": {"model": "T4", "count": 2}, "minSize": 1, "maxSize": 1,
        })
        # T4 has no published all-reduce baseline: the file must say its burn-in floor.
        data["health"]["burnIn"]["ncclMinBusGBps"]["T4"] = 0

    rec, parts = run(full_program(load_variant(tmp_path, change)))
    t4 = rec.named("ibis-gpu-t4-b", "InstanceTemplate").inputs
    assert t4["guestAccelerators"] == [{"type": "nvidia-tesla-t4", "count": 2}]
    assert t4["scheduling"]["onHostMaintenance"] == "TERMINATE"
    assert "1:1:" in " ".join(resolve(parts["pools"].autoscaler_nodes))


def test_pool_sizes_do_not_change_the_resources(tmp_path):
    def bigger(data):
        for pool in data["nodePools"]:
            pool["maxSize"] = 5000 // 3
            pool["minSize"] = 2
        # A larger network to hold them; the events cluster (on by default
        # from 1,000 nodes) is the model's choice, kept as ibis has it.
        data["controlPlane"]["networkCIDR"] = "10.192.0.0/12"
        data["kubernetes"]["podCIDR"] = "10.160.0.0/11"
        data["controlPlane"]["etcd"]["dedicatedEventsCluster"] = False

    def shape(cluster):
        rec, _ = run(full_program(cluster))
        return sorted((r.type, r.name) for r in rec.registered)

    small = shape(load_cluster(IBIS))
    assert shape(load_variant(tmp_path, bigger)) == small


# --- Hybrid link ------------------------------------------------------------


def test_no_sites_no_vpn(ibis):
    _, rec, parts = ibis
    assert not rec.of_type("HaVpnGateway") and not rec.of_type("VPNTunnel")
    assert parts["link"].sites == {}


def test_a_site_gets_tunnels_and_bgp_peers_with_its_asn(tmp_path):
    cluster = load_variant(tmp_path, with_sites)
    rec, parts = run(full_program(cluster))
    (gateway,) = rec.of_type("HaVpnGateway")
    assert gateway.inputs["region"] == "us-central1"
    (router,) = [r for r in rec.of_type("Router") if "bgp" in r.inputs]
    assert router.inputs["bgp"]["asn"] == 64514

    tunnels = {t.inputs["name"]: t.inputs for t in rec.of_type("VPNTunnel")}
    peers = {p.inputs["name"]: p.inputs for p in rec.of_type("RouterPeer")}
    interfaces = {i.inputs["name"]: i.inputs for i in rec.of_type("RouterInterface")}
    externals = {e.inputs["name"]: e.inputs for e in rec.of_type("ExternalVpnGateway")}
    assert len(tunnels) == len(peers) == len(interfaces) == 4  # two sites with VPN, two tunnels each
    assert not any("lab" in name for name in tunnels)

    links = set()
    for site in (s for s in cluster.sites if s.vpn):
        ext = externals[f"ibis-{site.name}-gw"]
        assert ext["interfaces"] == [{"id": 0, "ipAddress": str(site.vpn.peer_address)}]
        for t in (0, 1):
            tunnel = tunnels[f"ibis-{site.name}-tunnel-{t}"]
            assert tunnel["vpnGatewayInterface"] == t
            assert tunnel["peerExternalGatewayInterface"] == 0
            assert tunnel["ikeVersion"] == 2
            assert rpc.is_rpc_secret(tunnel["sharedSecret"])
            assert plain(tunnel["sharedSecret"]) == f"psk-{site.name}"
            peer = peers[f"ibis-{site.name}-bgp-{t}"]
            assert peer["peerAsn"] == site.vpn.bgp_asn
            iface = interfaces[f"ibis-{site.name}-if-{t}"]
            assert peer["interface"] == iface["name"] and iface["vpnTunnel"] == tunnel["name"]
            net = ipaddress.ip_interface(iface["ipRange"]).network
            assert net.prefixlen == 30 and net.subnet_of(ipaddress.ip_network("169.254.0.0/16"))
            assert ipaddress.ip_address(peer["peerIpAddress"]) in net
            links.add(net)

        details = resolve(parts["link"].sites[site.name])
        assert details["peer_asn"] == site.vpn.bgp_asn and details["cloud_asn"] == 64514
        assert [t["cloud_address"] for t in details["tunnels"]] == list(HA_VPN_ADDRESSES)
        assert "psk" not in repr(details)
    assert len(links) == 4  # every BGP session on its own /30
    assert set(parts["link"].sites) == {"dc1", "dc2"}


def test_site_asn_must_differ_from_the_cloud_router(tmp_path):
    def clash(data):
        with_sites(data)
        data["sites"][0]["vpn"]["bgpASN"] = 64514

    with pytest.raises(ValueError, match="64514"):
        run(full_program(load_variant(tmp_path, clash)))


def test_node_image_setting_reaches_every_machine(tmp_path):
    image = "projects/corral-images/global/images/family/corral-node-bookworm"
    gpu_image = "projects/corral-images/global/images/family/corral-gpu-bookworm"
    rec, _ = run(full_program(load_cluster(IBIS)), {"corral:nodeImage": image, "corral:gpuNodeImage": gpu_image})
    for vm in rec.of_type("Instance"):
        assert vm.inputs["bootDisk"]["initializeParams"]["image"] == image
    templates = {t.name: t.inputs for t in rec.of_type("InstanceTemplate")}
    assert templates["ibis-cpu-n2-a"]["disks"][0]["sourceImage"] == image
    assert templates["ibis-gpu-l4-a"]["disks"][0]["sourceImage"] == gpu_image


def test_autoscaler_urls_come_from_the_migs_without_a_project(tmp_path):
    def program():
        from corral.infra import gcp

        ctx = ClusterContext.of(load_cluster(IBIS))
        network = gcp.Network("network", ctx)
        return gcp.NodePools("nodepools", ctx, network, {p.name: "#cloud-config" for p in ctx.cluster.cloud_pools})

    mocks = GcpMocks()
    recorder = Recorder(mocks)
    pulumi.runtime.set_mocks(mocks, project="corral", stack="test", preview=False, monitor=recorder)
    pulumi.runtime.set_all_config({})
    result = {}
    _sync_await(run_pulumi_func(lambda: result.setdefault("pools", program())))
    specs = resolve(result["pools"].autoscaler_nodes)
    assert f"0:50:https://www.googleapis.com/compute/v1/projects/{PROJECT}/zones/us-central1-a/instanceGroups/ibis-cpu-n2-a" in specs
    assert result["pools"].cloud_settings == {}


# --- Agreement with the core ------------------------------------------------


def test_bootstrap_mounts_etcd_from_the_device_the_disk_is_attached_as():
    from corral.infra.gcp import ETCD_DEVICE_NAME, ETCD_DEVICE_PATH

    assert GCP_ETCD_DEVICE_NAME == ETCD_DEVICE_NAME
    assert ETCD_DEVICE_PATH in ETCD_DISK_LOCATORS["gcp"]


def test_the_core_plan_of_ibis():
    plan = pytest.importorskip("corral.infra.plan")
    result = plan.plan_cluster(load_cluster(IBIS), stack_config={"gcp:project": PROJECT, "gcp:region": "us-central1"})
    resources = result.resources
    disks = [r for r in resources if r["type"] == "gcp:compute/disk:Disk"]
    assert len(disks) == 3 and all(d["protect"] and d["retainOnDelete"] for d in disks)
    for r in resources:
        if r["type"] in ("gcp:compute/instance:Instance", "gcp:compute/instanceTemplate:InstanceTemplate"):
            metadata = r["inputs"]["metadata"]  # shown: references to the secret store only
            assert metadata["user-data"].startswith("#cloud-config"), r["name"]
            assert "PRIVATE KEY" not in metadata["user-data"] and "corral-fetch-secrets" in metadata["user-data"]
        if r["type"] == "gcp:compute/firewall:Firewall":
            assert "0.0.0.0/0" not in (r["inputs"].get("sourceRanges") or [])
        if r["type"].startswith("gcp:"):
            assert r["component"] and r["component"].startswith("ibis-"), r["name"]
    components = {r["name"]: r["type"] for r in resources if r["type"].startswith("corral:gcp:")}
    assert set(components.values()) == {
        "corral:gcp:Network", "corral:gcp:Etcd", "corral:gcp:ApiServers", "corral:gcp:NodePools",
        "corral:gcp:SecretStore", "corral:gcp:SnapshotBucket",
    }
    # Warnings belong to each run: a second plan in the same process has them too.
    assert any("corral:nodeImage is not set" in d for d in result.diagnostics)
    assert not any("cannot attach" in d for d in result.diagnostics)
    again = plan.plan_cluster(load_cluster(IBIS), stack_config={"gcp:project": PROJECT, "gcp:region": "us-central1"})
    assert again.diagnostics == result.diagnostics
    assert again.resources == result.resources
