"""The Azure components under Pulumi's mocks: what `pulumi up` would register.

Each test builds the components for the jaguar example (control plane in
Azure, GPUs on-prem over VPN) or a variant of it, records every resource
registration (type, name, parent, protect/retain, inputs with secrets
marked) and asserts on that record. Registrations are recorded before any
assertion runs (`record` waits for the whole program), so no assertion can
be skipped inside an unresolved Output.
"""

from __future__ import annotations

import base64
import inspect
import ipaddress
import re
from collections.abc import Callable

import pulumi
import pytest

from corral.infra import azure as az
from corral.infra import bootstrap, platform
from corral.infra.azure import common, hybridlink, nodepools
from corral.infra.azure import network as az_network
from corral.model.layout import node_group_name

from .azure_fixtures import Registration, Secret, context, load, record

REGION = "eastus2"
ETCD_PORTS = range(2379, 2381)
WORLD = {"*", "0.0.0.0/0", "internet", "any", "virtualnetwork", "0.0.0.0"}
PROVISIONED = {"PremiumV2_LRS", "UltraSSD_LRS"}


# --- Building --------------------------------------------------------------


class Plan:
    """Recorded registrations of one build, with lookups."""

    def __init__(self, records: list[Registration], outputs: dict, ctx: platform.ClusterContext):
        self.records = records
        self.outputs = outputs
        self.ctx = ctx

    def of(self, kind: str) -> list[Registration]:
        """Registrations of `azure-native:<kind>` (e.g. "compute:Disk")."""
        full = kind if ":" in kind and kind.count(":") == 2 else f"azure-native:{kind}"
        return [r for r in self.records if r.type == full]

    def one(self, kind: str, name: str) -> Registration:
        found = [r for r in self.of(kind) if r.name == name]
        assert len(found) == 1, f"{kind} {name}: {[r.name for r in self.of(kind)]}"
        return found[0]

    def by_urn(self, urn: str) -> Registration:
        return next(r for r in self.records if r.urn == urn)


def user_data_for(name: str) -> pulumi.Output[str]:
    """Stand-in user data: plain, as the program's (references to secrets, never secrets)."""
    return pulumi.Output.from_input(f"#cloud-config\n# {name}\n")


def build(ctx: platform.ClusterContext) -> dict:
    """All five components, as the core's program wires them."""
    lay = ctx.layout
    net = az.Network("network", ctx)
    etcd = az.Etcd("etcd", ctx, net, lay.etcd_members, [user_data_for(m.name) for m in lay.etcd_members])
    events = None
    if lay.events_members:
        events = az.Etcd("etcd-events", ctx, net, lay.events_members,
                         [user_data_for(m.name) for m in lay.events_members])
    api = az.ApiServers("apiservers", ctx, net, [user_data_for(m.name) for m in lay.api_servers])
    pools = az.NodePools("nodepools", ctx, net,
                         {p.name: user_data_for(p.name) for p in ctx.cluster.cloud_pools})
    link = az.HybridLink("hybrid", ctx, net,
                         {s.name: pulumi.Output.secret(f"psk-{s.name}") for s in ctx.cluster.sites if s.vpn})
    # The secret store as the program fills it: one secret per machine role, then the grants.
    store = az.SecretStore("secrets", ctx)
    keys = [bootstrap.etcd_secret_key(m.name) for m in (*lay.etcd_members, *lay.events_members)]
    keys += [bootstrap.APISERVER_SECRET, *(bootstrap.pool_secret_key(p.name) for p in ctx.cluster.cloud_pools)]
    for key in keys:
        store.put(key, pulumi.Output.secret(f"value of {key}"))
    bootstrap.grant_readers(store, etcd, events, api, pools)
    pools.allow_resize(api.identities)
    snapshots = az.SnapshotBucket("etcd-snapshots", ctx)
    for component in (etcd, events):
        for member, identity in (component.identities if component else {}).items():
            snapshots.grant_write(member, identity)
    return {
        "sites": link.sites,
        "control_subnet_ids": net.control_subnet_ids,
        "node_subnet_ids": net.node_subnet_ids,
        "gateway_subnet_id": net.gateway_subnet_id,
        "resource_group_name": net.resource_group_name,
        "subscription_id": net.subscription_id,
        "etcd_disks": [d.id for d in etcd.disks],
        "events_disks": [d.id for d in events.disks] if events else [],
        "api_endpoint": api.endpoint,
        "discovery": pools.autoscaler_discovery,
    }


def plan_of(cluster_name: str = "jaguar", **edits: Callable[[dict], None]) -> Plan:
    ctx = context(load(cluster_name, **edits))
    records, outputs = record(lambda: build(ctx))
    return Plan(records, outputs, ctx)


def set_disk(**disk) -> Callable[[dict], None]:
    def edit(data: dict) -> None:
        data["controlPlane"]["etcd"]["disk"] = disk
    return edit


def add_pools(*pools: dict) -> Callable[[dict], None]:
    def edit(data: dict) -> None:
        data["nodePools"].extend(pools)
    return edit


def set_sites(*sites: dict) -> Callable[[dict], None]:
    def edit(data: dict) -> None:
        data["sites"] = list(sites)
        data["nodePools"] = [p for p in data["nodePools"] if p["provider"] != "onprem"]
        data["scheduling"]["teams"] = []
    return edit


@pytest.fixture(scope="module")
def jaguar() -> Plan:
    return plan_of("jaguar")


@pytest.fixture(scope="module")
def ultra() -> Plan:
    return plan_of("jaguar", disk=set_disk(type="UltraSSD_LRS", sizeGiB=256, iops=25000, throughputMBps=600))


@pytest.fixture(scope="module")
def varied() -> Plan:
    """Spot and GPU pools with taints, a one-zone pool, a dedicated events cluster,
    two VPN sites and one without VPN."""
    def events(data: dict) -> None:
        data["controlPlane"]["etcd"]["dedicatedEventsCluster"] = True

    # A GPU pool needs an image with the NVIDIA driver (common.node_image refuses one without).
    pulumi.runtime.set_all_config({"corral:gpuNodeImage": GPU_IMAGE_ID})
    try:
        return _varied_plan(events)
    finally:
        pulumi.runtime.set_all_config({})


GPU_IMAGE_ID = "/subscriptions/0/resourceGroups/corral-images/providers/Microsoft.Compute/images/corral-gpu-node"


def _varied_plan(events: Callable[[dict], None]) -> Plan:
    return plan_of(
        "jaguar",
        events=events,
        pools=add_pools(
            {"name": "gpu-a100-spot", "provider": "azure", "machineType": "Standard_NC24ads_A100_v4",
             "zones": ["2"], "minSize": 1, "maxSize": 16, "spot": True,
             "gpu": {"model": "A100", "count": 1},
             "labels": {"example.com/tier": "batch"},
             "taints": ["example.com/spot=true:NoSchedule"]},
        ),
        sites=lambda data: data["sites"].extend([
            {"name": "ny2", "cidrs": ["10.60.0.0/16", "10.61.0.0/16"],
             "vpn": {"peerAddress": "198.51.100.20", "bgpASN": 65020}},
            {"name": "lab", "cidrs": ["10.70.0.0/16"]},
        ]),
    )


# --- Contract ----------------------------------------------------------------


def test_components_have_the_platform_signatures():
    expected = {
        "Network": ["name", "ctx", "opts"],
        "Etcd": ["name", "ctx", "network", "members", "user_data", "opts"],
        "ApiServers": ["name", "ctx", "network", "user_data", "opts"],
        "NodePools": ["name", "ctx", "network", "user_data", "opts"],
        "HybridLink": ["name", "ctx", "network", "shared_keys", "opts"],
        "SecretStore": ["name", "ctx", "opts"],
        "SnapshotBucket": ["name", "ctx", "opts"],
    }
    assert set(expected) == set(platform.COMPONENTS)
    for name, params in expected.items():
        cls = getattr(az, name)
        assert issubclass(cls, pulumi.ComponentResource)
        assert list(inspect.signature(cls.__init__).parameters)[1:] == params, name


def test_component_type_tokens_and_parents(jaguar: Plan):
    components = {r.type: r for r in jaguar.records if r.type.startswith("corral:azure:")}
    assert set(components) == {f"corral:azure:{c}" for c in platform.COMPONENTS}
    component_urns = {r.urn for r in components.values()}
    for r in jaguar.records:
        if r.type.startswith("corral:"):
            continue
        assert r.parent in component_urns, f"{r.type} {r.name} is not inside a component"


def test_names_location_and_tags(jaguar: Plan):
    for r in jaguar.records:
        if r.type.startswith("corral:"):
            continue
        assert r.name.startswith("jaguar-"), r.name
        if r.type.startswith("azure-native:") and r.type not in (
                "azure-native:network:Subnet", "azure-native:authorization:RoleAssignment",
                "azure-native:keyvault:Secret",  # a vault's child: the vault's location
                # the snapshot account's children and its custom role: no location or tags of their own
                "azure-native:storage:BlobServiceProperties", "azure-native:storage:BlobContainer",
                "azure-native:storage:ManagementPolicy", "azure-native:authorization:RoleDefinition"):
            assert r.inputs.get("location") == REGION, r.name
            tags = r.inputs.get("tags")
            assert tags["corral-cluster"] == "jaguar" and tags["managed-by"] == "corral", r.name
            assert len(tags) <= common.MAX_TAGS
            for key in tags:
                assert not set(key) & set("<>%&\\?/"), f"{r.name}: tag name {key!r}"


# --- Network -------------------------------------------------------------------


def _rules(plan: Plan) -> dict[str, list[dict]]:
    return {r.inputs["networkSecurityGroupName"]: r.inputs["securityRules"]
            for r in plan.of("network:NetworkSecurityGroup")}


def _prefixes(rule: dict, side: str) -> list[str]:
    one = rule.get(f"{side}AddressPrefix")
    return [one] if one is not None else list(rule.get(f"{side}AddressPrefixes") or [])


def _ports(rule: dict) -> set[int] | None:
    """The destination ports of a rule; None means all."""
    specs = [rule["destinationPortRange"]] if "destinationPortRange" in rule else rule["destinationPortRanges"]
    ports: set[int] = set()
    for spec in specs:
        if spec == "*":
            return None
        low, _, high = spec.partition("-")
        ports.update(range(int(low), int(high or low) + 1))
    return ports


def _covers(prefix: str, ip: str) -> bool:
    if prefix.lower() in WORLD:
        return True
    try:
        return ipaddress.ip_address(ip) in ipaddress.ip_network(prefix)
    except ValueError:  # another service tag
        return False


def test_subnets_per_zone_and_gateway_subnet(jaguar: Plan):
    lay = jaguar.ctx.layout
    subnets = {r.inputs["subnetName"]: r for r in jaguar.of("network:Subnet")}
    for z in lay.zones:
        control = subnets[f"jaguar-control-{z.zone}"]
        nodes = subnets[f"jaguar-nodes-{z.zone}"]
        assert control.inputs["addressPrefix"] == z.control_subnet
        assert nodes.inputs["addressPrefix"] == z.node_subnet
        for s in (control, nodes):
            assert s.inputs["natGateway"]["id"].endswith(f"jaguar-nat-{z.zone}")
            assert s.inputs["defaultOutboundAccess"] is False
        assert control.inputs["networkSecurityGroup"]["id"].endswith("jaguar-control-nsg")
        assert nodes.inputs["networkSecurityGroup"]["id"].endswith("jaguar-nodes-nsg")
    gateway = subnets["GatewaySubnet"]
    assert gateway.inputs["addressPrefix"] == lay.gateway_subnet
    # Azure rejects NSGs and NAT gateways on the VPN gateway's subnet.
    assert "networkSecurityGroup" not in gateway.inputs and "natGateway" not in gateway.inputs
    # No public subnets on Azure: control + node per zone, and GatewaySubnet.
    assert len(subnets) == 2 * len(lay.zones) + 1


def test_nat_gateway_per_zone_with_zonal_public_ip(jaguar: Plan):
    for z in jaguar.ctx.layout.zones:
        nat = jaguar.one("network:NatGateway", f"jaguar-nat-{z.zone}")
        ip = jaguar.one("network:PublicIPAddress", f"jaguar-nat-ip-{z.zone}")
        assert nat.inputs["zones"] == [z.zone] == ip.inputs["zones"]
        assert nat.inputs["publicIpAddresses"] == [{"id": f"/mock/azure-native:network:PublicIPAddress/jaguar-nat-ip-{z.zone}"}]
        assert ip.inputs["sku"]["name"] == "Standard" and ip.inputs["publicIPAllocationMethod"] == "Static"


@pytest.mark.parametrize("variant", ["jaguar", "ultra", "varied"])
def test_etcd_ports_only_from_members_and_api_servers(variant: str, request):
    plan: Plan = request.getfixturevalue(variant)
    lay = plan.ctx.layout
    members = [m.ip for m in (*lay.etcd_members, *lay.events_members)]
    allowed = {f"{ip}/32" for ip in members + [m.ip for m in lay.api_servers]}
    opened = 0
    for nsg, rules in _rules(plan).items():
        for rule in rules:
            ports = _ports(rule)
            if rule["access"] != "Allow" or (ports is not None and not ports & set(ETCD_PORTS)):
                continue
            if rule["protocol"] == "Icmp":
                continue
            destinations = _prefixes(rule, "destination")
            if not any(_covers(d, ip) for d in destinations for ip in members):
                continue
            sources = _prefixes(rule, "source")
            assert not {s.lower() for s in sources} & WORLD, f"{nsg}/{rule['name']} opens etcd to {sources}"
            assert set(sources) <= allowed, f"{nsg}/{rule['name']}: {sources}"
            assert ports == set(ETCD_PORTS)
            assert set(destinations) == {f"{ip}/32" for ip in members}
            opened += 1
    assert opened == 1


@pytest.mark.parametrize("variant", ["jaguar", "varied"])
def test_etcd_members_node_exporter_only_from_the_api_servers(variant: str, request):
    """9100/tcp to the etcd members (their node-exporter, for the global
    Prometheus, which runs only on the API servers; the events cluster's too):
    one rule, from the API servers' addresses, no node subnet, no site."""
    plan: Plan = request.getfixturevalue(variant)
    cluster, lay = plan.ctx.cluster, plan.ctx.layout
    members = [m.ip for m in (*lay.etcd_members, *lay.events_members)]
    assert (len(lay.events_members) > 0) == (variant == "varied")
    opened = []
    for nsg, rules in _rules(plan).items():
        for rule in rules:
            ports = _ports(rule)
            if rule["access"] != "Allow" or rule["protocol"] == "Icmp" or (ports is not None and 9100 not in ports):
                continue
            if any(_covers(d, ip) for d in _prefixes(rule, "destination") for ip in members):
                opened.append((nsg, rule))
    assert [(nsg, rule["name"]) for nsg, rule in opened] == [("jaguar-control-nsg", "allow-etcd-node-exporter")]
    (_, rule), = opened
    assert (rule["protocol"], _ports(rule)) == ("Tcp", {9100})
    assert set(_prefixes(rule, "destination")) == {f"{ip}/32" for ip in members}
    site_cidrs = {c for s in cluster.sites for c in s.cidrs}
    assert site_cidrs
    api_hosts = {f"{m.ip}/32" for m in lay.api_servers}
    assert set(_prefixes(rule, "source")) == api_hosts


def test_api_port_open_to_vnet_and_sites(jaguar: Plan):
    cluster, lay = jaguar.ctx.cluster, jaguar.ctx.layout
    rules = [r for r in _rules(jaguar)["jaguar-control-nsg"] if r["access"] == "Allow" and _ports(r) == {6443}]
    sources = {s for r in rules if r["protocol"] == "Tcp" for s in _prefixes(r, "source")}
    for site in cluster.sites:
        assert set(site.cidrs) <= sources
    assert cluster.control_plane.network_cidr in sources  # node subnets included
    assert "AzureLoadBalancer" in sources  # health probes
    destinations = {d for r in rules for d in _prefixes(r, "destination")}
    assert f"{lay.api_vip}/32" in destinations
    assert {f"{m.ip}/32" for m in lay.api_servers} <= destinations


def test_kubelet_and_flannel_between_nodes_and_sites(jaguar: Plan):
    cluster, lay = jaguar.ctx.cluster, jaguar.ctx.layout
    rules = {r["name"]: r for r in _rules(jaguar)["jaguar-nodes-nsg"]}
    node_subnets = {z.node_subnet for z in lay.zones}
    site_cidrs = {c for s in cluster.sites for c in s.cidrs}
    kubelet, flannel = rules["allow-kubelet"], rules["allow-flannel"]
    assert (kubelet["protocol"], _ports(kubelet)) == ("Tcp", {10250, 9100})
    assert (flannel["protocol"], _ports(flannel)) == ("Udp", {cluster.network.flannel.port})
    api_hosts = {f"{m.ip}/32" for m in lay.api_servers}
    for rule in (kubelet, flannel):
        assert node_subnets | site_cidrs | api_hosts == set(_prefixes(rule, "source"))
        assert set(_prefixes(rule, "destination")) == node_subnets
    # The API servers are kubeadm nodes running flannel: the same ports reach them.
    control = {r["name"]: r for r in _rules(jaguar)["jaguar-control-nsg"]}
    for name in ("allow-kubelet", "allow-flannel"):
        assert set(_prefixes(control[name], "destination")) == api_hosts
        assert _ports(control[name]) == _ports(rules[name])
    pods = cluster.kubernetes.pod_cidr
    for nsg in (rules, control):  # direct routing: pod to pod, nothing else
        assert _prefixes(nsg["allow-pod-network"], "source") == [pods]
        assert _prefixes(nsg["allow-pod-network"], "destination") == [pods]


def test_deny_by_default(jaguar: Plan):
    for nsg, rules in _rules(jaguar).items():
        denies = {r["name"]: r for r in rules if r["access"] == "Deny"}
        assert denies["deny-vnet-inbound"]["sourceAddressPrefix"] == "VirtualNetwork", nsg
        assert denies["deny-all-inbound"]["sourceAddressPrefix"] == "*", nsg
        top = max(r["priority"] for r in rules if r["access"] == "Allow")
        assert all(d["priority"] > top for d in denies.values())
        priorities = [r["priority"] for r in rules]
        assert len(priorities) == len(set(priorities)) and all(100 <= p <= 4096 for p in priorities)
        for rule in rules:  # Azure takes one prefix in the singular field, several in the plural
            for side in ("source", "destination"):
                assert (f"{side}AddressPrefix" in rule) != (f"{side}AddressPrefixes" in rule)
                if f"{side}AddressPrefixes" in rule:
                    assert len(rule[f"{side}AddressPrefixes"]) > 1


# --- etcd ----------------------------------------------------------------------


def _members(plan: Plan):
    lay = plan.ctx.layout
    return [*lay.etcd_members, *lay.events_members]


@pytest.mark.parametrize("variant", ["jaguar", "ultra", "varied"])
def test_every_member_has_a_zonal_vm_and_disk_in_the_same_zone(variant: str, request):
    plan: Plan = request.getfixturevalue(variant)
    spec = plan.ctx.cluster.control_plane.etcd.disk
    members = _members(plan)
    assert len(plan.of("compute:Disk")) == len(members)
    for m in members:
        disk = plan.one("compute:Disk", f"{m.name}-data")
        vm = plan.one("compute:VirtualMachine", m.name)
        assert vm.inputs["zones"] == [m.zone] == disk.inputs["zones"]
        assert disk.inputs["sku"] == {"name": spec.type}
        assert disk.inputs["diskSizeGB"] == spec.size_gib
        assert disk.inputs["diskIOPSReadWrite"] == spec.iops
        assert disk.inputs["diskMBpsReadWrite"] == spec.throughput_mbps
        assert disk.inputs["creationData"] == {"createOption": "Empty", "logicalSectorSize": 4096}
        (attached,) = vm.inputs["storageProfile"]["dataDisks"]
        assert attached["managedDisk"]["id"] == f"/mock/azure-native:compute:Disk/{m.name}-data"
        assert attached["lun"] == common.ETCD_DISK_LUN == 0
        assert attached["caching"] == "None"
        assert attached["createOption"] == "Attach" and attached["deleteOption"] == "Detach"
        assert vm.inputs["storageProfile"]["osDisk"]["managedDisk"]["storageAccountType"] == "Premium_LRS"
        assert vm.inputs["hardwareProfile"]["vmSize"] == plan.ctx.cluster.control_plane.etcd.machine_type
        nic = plan.one("network:NetworkInterface", f"{m.name}-nic")
        (ipconf,) = nic.inputs["ipConfigurations"]
        assert ipconf["privateIPAddress"] == m.ip and ipconf["privateIPAllocationMethod"] == "Static"
        assert ipconf["subnet"]["id"].endswith(f"jaguar-control-{m.zone}")
        assert ipaddress.ip_address(m.ip) in ipaddress.ip_network(plan.ctx.layout.zone(m.zone).control_subnet)


@pytest.mark.parametrize("variant", ["jaguar", "ultra", "varied"])
def test_etcd_disks_are_protected_and_retained(variant: str, request):
    plan: Plan = request.getfixturevalue(variant)
    for disk in plan.of("compute:Disk"):
        assert disk.protect and disk.retain_on_delete, disk.name
    # Nothing else is protected: VMs can be replaced, their disks stay.
    # ... and the etcd snapshots' storage account (corral/infra/azure/backup.py).
    assert all(not r.protect for r in plan.records
               if r.type not in ("azure-native:compute:Disk", "azure-native:storage:StorageAccount"))


def test_ultra_enables_the_capability_and_premium_v2_does_not(jaguar: Plan, ultra: Plan):
    for m in ultra.ctx.layout.etcd_members:
        vm = ultra.one("compute:VirtualMachine", m.name)
        assert vm.inputs["additionalCapabilities"] == {"ultraSSDEnabled": True}
        assert ultra.one("compute:Disk", f"{m.name}-data").inputs["sku"]["name"] == "UltraSSD_LRS"
    for m in jaguar.ctx.layout.etcd_members:
        vm = jaguar.one("compute:VirtualMachine", m.name)
        assert "additionalCapabilities" not in vm.inputs
    for api in ultra.ctx.layout.api_servers:  # only etcd members carry Ultra disks
        assert "additionalCapabilities" not in ultra.one("compute:VirtualMachine", api.name).inputs


@pytest.mark.parametrize("variant", ["jaguar", "ultra", "varied"])
def test_nothing_a_provider_would_reject_on_disks(variant: str, request):
    plan: Plan = request.getfixturevalue(variant)
    disks = {f"/mock/azure-native:compute:Disk/{d.name}": d for d in plan.of("compute:Disk")}
    for disk in disks.values():
        sku = disk.inputs["sku"]["name"]
        assert sku in PROVISIONED
        if sku not in PROVISIONED:  # throughput and IOPS only on the provisioned types
            assert "diskMBpsReadWrite" not in disk.inputs and "diskIOPSReadWrite" not in disk.inputs
        assert "burstingEnabled" not in disk.inputs
    for vm in plan.of("compute:VirtualMachine"):
        for data in vm.inputs["storageProfile"].get("dataDisks", []):
            disk = disks[data["managedDisk"]["id"]]
            # Premium SSD v2 and Ultra: zonal VMs in the disk's zone, no host caching.
            assert vm.inputs.get("zones") and vm.inputs["zones"] == disk.inputs["zones"]
            assert data["caching"] == "None"
            ultra = disk.inputs["sku"]["name"] == "UltraSSD_LRS"
            assert vm.inputs.get("additionalCapabilities", {}).get("ultraSSDEnabled", False) == ultra


def test_dedicated_events_cluster_gets_its_own_members(varied: Plan):
    lay = varied.ctx.layout
    assert lay.events_members
    names = [r.name for r in varied.records]
    assert len(names) == len(set(names))
    for m in lay.events_members:
        assert varied.one("compute:VirtualMachine", m.name).parent.endswith("corral:azure:Etcd::etcd-events")
    assert len(varied.outputs["events_disks"]) == len(lay.events_members)


def test_custom_data_is_base64_of_user_data_and_not_secret(jaguar: Plan):
    """customData holds references to the secret store, never a secret: shown in plans."""
    for m in jaguar.ctx.layout.etcd_members:
        vm = jaguar.one("compute:VirtualMachine", m.name)
        profile = vm.inputs["osProfile"]
        assert not isinstance(profile, Secret)
        decoded = base64.b64decode(profile["customData"]).decode()
        assert decoded == f"#cloud-config\n# {m.name}\n"
        assert profile["linuxConfiguration"]["disablePasswordAuthentication"] is True


def test_custom_data_is_gzipped_only_when_too_large():
    small = "#cloud-config\n"
    assert base64.b64decode(common.encode_custom_data(small)).decode() == small
    big = "#cloud-config\n" + "x" * 70_000
    encoded = common.encode_custom_data(big)
    assert len(encoded) <= common.CUSTOM_DATA_LIMIT
    assert base64.b64decode(encoded)[:2] == b"\x1f\x8b"
    with pytest.raises(ValueError, match="64"):
        common.encode_custom_data("".join(chr(0x4E00 + (i * 7919) % 20000) for i in range(60_000)))


# --- API servers ---------------------------------------------------------------


def test_api_servers_behind_internal_standard_lb(jaguar: Plan):
    lay = jaguar.ctx.layout
    lb = jaguar.one("network:LoadBalancer", "jaguar-apiserver-lb")
    assert lb.inputs["sku"]["name"] == "Standard"
    (frontend,) = lb.inputs["frontendIPConfigurations"]
    assert frontend["privateIPAddress"] == lay.api_vip
    assert frontend["privateIPAllocationMethod"] == "Static"
    assert frontend["zones"] == ["1", "2", "3"]  # zone-redundant
    assert "publicIPAddress" not in frontend  # internal
    assert frontend["subnet"]["id"].endswith(f"jaguar-control-{lay.zones[0].zone}")
    (probe,) = lb.inputs["probes"]
    assert (probe["protocol"], probe["port"], probe["requestPath"]) == ("Https", 6443, "/readyz")
    (rule,) = lb.inputs["loadBalancingRules"]
    assert (rule["protocol"], rule["frontendPort"], rule["backendPort"]) == ("Tcp", 6443, 6443)
    lb_id = ("/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/jaguar-rg"
             "/providers/Microsoft.Network/loadBalancers/jaguar-apiserver-lb")
    assert rule["frontendIPConfiguration"]["id"] == f"{lb_id}/frontendIPConfigurations/{frontend['name']}"
    assert rule["backendAddressPool"]["id"] == f"{lb_id}/backendAddressPools/{lb.inputs['backendAddressPools'][0]['name']}"
    assert rule["probe"]["id"] == f"{lb_id}/probes/{probe['name']}"
    assert len(lay.api_servers) == 5
    for m in lay.api_servers:
        vm = jaguar.one("compute:VirtualMachine", m.name)
        assert vm.inputs["zones"] == [m.zone]
        assert vm.inputs["hardwareProfile"]["vmSize"] == "Standard_D32s_v5"
        assert "dataDisks" not in vm.inputs["storageProfile"]
        (ipconf,) = jaguar.one("network:NetworkInterface", f"{m.name}-nic").inputs["ipConfigurations"]
        assert ipconf["privateIPAddress"] == m.ip
        (pool,) = ipconf["loadBalancerBackendAddressPools"]
        assert pool["id"].endswith("/backendAddressPools/apiservers")
    assert jaguar.outputs["api_endpoint"] == f"{lay.api_vip}:6443"


SUBSCRIPTION = "/subscriptions/00000000-0000-0000-0000-000000000000"
# The custom role the API servers drive the scale sets with (tests/infra/test_azure_role.py).
SCALE_SET_OPERATOR = "/mock/azure-native:authorization:RoleDefinition/jaguar-scale-set-operator"
SECRETS_USER = f"{SUBSCRIPTION}/providers/Microsoft.Authorization/roleDefinitions/4633458b-17de-408a-b874-0445c86b69e6"


def test_api_servers_may_drive_the_scale_sets_and_nothing_else(jaguar: Plan):
    """cluster-autoscaler runs on the control plane with the VM's managed identity:
    the scale-set operator role on each scale set, never on the resource group
    that holds etcd's VMs and disks."""
    roles = jaguar.of("authorization:RoleAssignment")
    resize = [r for r in roles if r.inputs["roleDefinitionId"] == SCALE_SET_OPERATOR]
    scale_sets = jaguar.of("compute:VirtualMachineScaleSet")
    api = jaguar.ctx.layout.api_servers
    assert len(resize) == len(scale_sets) * len(api)
    api_principals = {f"principal-{m.name}" for m in api}
    for m in api:
        vm = jaguar.one("compute:VirtualMachine", m.name)
        assert vm.inputs["identity"] == {"type": "SystemAssigned"}
    set_ids = {f"/mock/azure-native:compute:VirtualMachineScaleSet/{s.name}" for s in scale_sets}
    assert {(r.inputs["scope"], r.inputs["principalId"]) for r in resize} == {
        (scope, principal) for scope in set_ids for principal in api_principals
    }
    # Only these roles exist (and the etcd members' snapshot writer role, on the snapshot
    # container), and none is assigned on a resource group or wider.
    snapshot_writer = "/mock/azure-native:authorization:RoleDefinition/jaguar-etcd-snapshot-writer"
    assert {r.inputs["roleDefinitionId"] for r in roles} == {SCALE_SET_OPERATOR, SECRETS_USER, snapshot_writer}
    writers = [r for r in roles if r.inputs["roleDefinitionId"] == snapshot_writer]
    assert {r.inputs["principalId"] for r in writers} == {f"principal-{m.name}" for m in jaguar.ctx.layout.etcd_members}
    assert {r.inputs["scope"] for r in writers} == {"/mock/azure-native:storage:BlobContainer/jaguar-etcd-snapshots-container"}
    assert not [r for r in roles if "/resourceGroups/" in r.inputs["scope"] and "/providers/" not in r.inputs["scope"]]
    for r in roles:
        assert re.fullmatch(r"[0-9a-f-]{36}", r.inputs["roleAssignmentName"])
    assert len({r.inputs["roleAssignmentName"] for r in roles}) == len(roles)
    for m in jaguar.ctx.layout.etcd_members:  # etcd members: an identity of their own, no resize right
        assert jaguar.one("compute:VirtualMachine", m.name).inputs["identity"] == {"type": "SystemAssigned"}
        assert f"principal-{m.name}" not in {r.inputs["principalId"] for r in resize}
    assert jaguar.outputs["subscription_id"] == "00000000-0000-0000-0000-000000000000"


def test_key_vault_secret_per_role_readable_by_that_role_only(jaguar: Plan):
    """Key Vault with RBAC; each secret's one read grant ("Key Vault Secrets User",
    on the secret itself) names exactly the identity of the machines of that role."""
    (vault,) = jaguar.of("keyvault:Vault")
    assert vault.inputs["properties"]["enableRbacAuthorization"] is True
    assert vault.inputs["vaultName"] == az.secrets.vault_name(jaguar.ctx)
    assert 3 <= len(vault.inputs["vaultName"]) <= 24
    (group,) = [g for g in jaguar.of("resources:ResourceGroup") if g.name == "jaguar-secrets-rg"]
    assert vault.inputs["resourceGroupName"] == group.inputs["resourceGroupName"]
    secrets = {s.inputs["secretName"]: s for s in jaguar.of("keyvault:Secret")}
    lay = jaguar.ctx.layout
    pool_identity = {p.name: f"principal-jaguar-{p.name}-identity" for p in jaguar.ctx.cluster.cloud_pools}
    expected = {f"jaguar-{bootstrap.etcd_secret_key(m.name)}": {f"principal-{m.name}"} for m in lay.etcd_members}
    expected["jaguar-apiserver"] = {f"principal-{m.name}" for m in lay.api_servers}
    expected.update({f"jaguar-pool-{pool}": {principal} for pool, principal in pool_identity.items()})
    assert set(secrets) == set(expected)
    assert all(isinstance(s.inputs["properties"], Secret) for s in secrets.values())  # the value inside
    grants = [r for r in jaguar.of("authorization:RoleAssignment") if r.inputs["roleDefinitionId"] == SECRETS_USER]
    readers: dict[str, set[str]] = {}
    for grant in grants:
        secret_name = grant.inputs["scope"].rsplit("/", 1)[-1]
        readers.setdefault(f"jaguar-{secret_name.removeprefix('jaguar-secret-')}", set()).add(grant.inputs["principalId"])
    assert readers == expected


def test_no_public_address_on_any_machine(jaguar: Plan):
    for nic in jaguar.of("network:NetworkInterface"):
        assert all("publicIPAddress" not in c for c in nic.inputs["ipConfigurations"])
    users = {r.name for r in jaguar.of("network:PublicIPAddress")}
    assert users == {"jaguar-nat-ip-1", "jaguar-nat-ip-2", "jaguar-nat-ip-3", "jaguar-vpngw-ip"}


# --- Node pools ----------------------------------------------------------------


def _vmss_profile(vmss: Registration) -> dict:
    profile = vmss.inputs["virtualMachineProfile"]
    return profile.value if isinstance(profile, Secret) else profile


def test_scale_set_per_cloud_pool_and_zone_with_autoscaler_tags(jaguar: Plan):
    cluster = jaguar.ctx.cluster
    scale_sets = jaguar.of("compute:VirtualMachineScaleSet")
    (pool,) = cluster.cloud_pools
    assert sorted(s.name for s in scale_sets) == [f"{node_group_name(cluster, pool)}-{z}" for z in ("1", "2", "3")]
    vmss = jaguar.one("compute:VirtualMachineScaleSet", "jaguar-cpu-d64-1")
    assert vmss.inputs["vmScaleSetName"] == "jaguar-cpu-d64-1"
    assert vmss.inputs["sku"] == {"name": "Standard_D64s_v5", "tier": "Standard", "capacity": pool.min_size}
    assert vmss.inputs["zones"] == ["1"]
    assert vmss.ignore_changes == ["sku.capacity"]
    tags = vmss.inputs["tags"]
    assert tags["cluster-autoscaler-enabled"] == "true" and tags["cluster-autoscaler-name"] == "jaguar"
    assert tags["k8s.io_cluster-autoscaler_enabled"] == "true"
    assert "k8s.io_cluster-autoscaler_jaguar" in tags
    assert (tags["min"], tags["max"]) == ("0", "67")  # zone 1's share of 0..200
    assert tags["corral-zone"] == "1"
    assert tags["k8s.io_cluster-autoscaler_node-template_label_corral.dev_pool"] == "cpu-d64"
    assert jaguar.outputs["discovery"] == "label:cluster-autoscaler-enabled=true,cluster-autoscaler-name=jaguar"
    profile = _vmss_profile(vmss)
    assert profile["priority"] == "Regular" and "evictionPolicy" not in profile
    assert not isinstance(vmss.inputs["virtualMachineProfile"], Secret)  # no secret inside
    assert base64.b64decode(profile["osProfile"]["customData"]).decode() == "#cloud-config\n# cpu-d64\n"
    (nic,) = profile["networkProfile"]["networkInterfaceConfigurations"]
    assert nic["enableIPForwarding"] is True
    assert nic["ipConfigurations"][0]["subnet"]["id"].endswith("jaguar-nodes-1")


def test_autoscale_setting_holds_bounds_without_rules(jaguar: Plan):
    settings = jaguar.of("monitor:AutoscaleSetting")
    assert sorted(s.name for s in settings) == [f"jaguar-cpu-d64-{z}-bounds" for z in ("1", "2", "3")]
    maxima = []
    for zone in ("1", "2", "3"):
        setting = jaguar.one("monitor:AutoscaleSetting", f"jaguar-cpu-d64-{zone}-bounds")
        assert setting.inputs["targetResourceUri"] == f"/mock/azure-native:compute:VirtualMachineScaleSet/jaguar-cpu-d64-{zone}"
        assert setting.inputs["enabled"] is True
        (profile,) = setting.inputs["profiles"]
        assert profile["capacity"]["minimum"] == profile["capacity"]["default"] == "0"
        assert profile["rules"] == []
        maxima.append(int(profile["capacity"]["maximum"]))
    assert maxima == [67, 67, 66]  # the pool's 200, split over its zones


def test_spot_gpu_pool_in_one_zone_with_taints(varied: Plan):
    vmss = varied.one("compute:VirtualMachineScaleSet", "jaguar-gpu-a100-spot-2")  # its one zone
    profile = _vmss_profile(vmss)
    assert profile["priority"] == "Spot" and profile["evictionPolicy"] == "Delete"
    assert profile["billingProfile"] == {"maxPrice": -1}
    assert vmss.inputs["zones"] == ["2"]
    assert profile["networkProfile"]["networkInterfaceConfigurations"][0]["ipConfigurations"][0]["subnet"]["id"] \
        .endswith("jaguar-nodes-2")
    assert vmss.inputs["sku"]["capacity"] == 1
    tags = vmss.inputs["tags"]
    assert (tags["min"], tags["max"]) == ("1", "16")
    assert tags["k8s.io_cluster-autoscaler_node-template_label_example.com_tier"] == "batch"
    assert tags["k8s.io_cluster-autoscaler_node-template_label_nvidia.com_gpu.present"] == "true"
    assert tags["k8s.io_cluster-autoscaler_node-template_taint_example.com_spot"] == "true:NoSchedule"
    assert tags["k8s.io_cluster-autoscaler_node-template_taint_nvidia.com_gpu"] == "present:NoSchedule"
    setting = varied.one("monitor:AutoscaleSetting", "jaguar-gpu-a100-spot-2-bounds")
    assert setting.inputs["profiles"][0]["capacity"] == {"minimum": "1", "maximum": "16", "default": "1"}


def test_sizes_do_not_change_the_resource_count(jaguar: Plan):
    def grow(data: dict) -> None:
        for pool in data["nodePools"]:
            if pool["provider"] == "onprem":
                pool["hosts"] = ["gpu-[0001:2000].sf1.internal"] if pool["name"] == "gpu-h100-sf1" else pool["hosts"]
            else:
                pool["minSize"], pool["maxSize"] = 3, 900

    def big_network(data: dict) -> None:
        data["controlPlane"]["networkCIDR"] = "10.200.0.0/16"
        data["kubernetes"]["podCIDR"] = "10.128.0.0/11"
        data["controlPlane"]["etcd"]["dedicatedEventsCluster"] = False

    grown = plan_of("jaguar", net=big_network, grow=grow)
    assert grown.ctx.cluster.node_capacity > jaguar.ctx.cluster.node_capacity
    assert sorted(r.name for r in grown.records) == sorted(r.name for r in jaguar.records)
    vmss = grown.one("compute:VirtualMachineScaleSet", "jaguar-cpu-d64-1")
    assert vmss.inputs["tags"]["max"] == "300"  # a third of 900


def test_pool_beyond_a_scale_set_is_capped_with_a_warning():
    def huge(data: dict) -> None:
        data["controlPlane"]["networkCIDR"] = "10.200.0.0/16"
        data["kubernetes"]["podCIDR"] = "10.128.0.0/11"
        for pool in data["nodePools"]:
            if pool["provider"] == "azure":
                pool["maxSize"] = 5000

    plan = plan_of("jaguar", huge=huge)  # 5,000 over three zones: 1,667 + 1,667 + 1,666
    for zone in ("1", "2", "3"):
        vmss = plan.one("compute:VirtualMachineScaleSet", f"jaguar-cpu-d64-{zone}")
        assert vmss.inputs["tags"]["max"] == str(nodepools.VMSS_MAX_INSTANCES)
        setting = plan.one("monitor:AutoscaleSetting", f"jaguar-cpu-d64-{zone}-bounds")
        assert setting.inputs["profiles"][0]["capacity"]["maximum"] == str(nodepools.VMSS_MAX_INSTANCES)


# --- Hybrid link ---------------------------------------------------------------


def test_vpn_per_site_with_the_site_asn(varied: Plan):
    cluster = varied.ctx.cluster
    vpn_sites = [s for s in cluster.sites if s.vpn]
    assert [s.name for s in vpn_sites] == ["sf1", "ny2"]
    gateway = varied.one("network:VirtualNetworkGateway", "jaguar-vpngw")
    assert gateway.inputs["sku"] == {"name": "VpnGw2AZ", "tier": "VpnGw2AZ"}
    assert (gateway.inputs["vpnType"], gateway.inputs["gatewayType"]) == ("RouteBased", "Vpn")
    assert gateway.inputs["enableBgp"] is True and gateway.inputs["bgpSettings"]["asn"] == 65515
    (ipconf,) = gateway.inputs["ipConfigurations"]
    assert ipconf["subnet"]["id"].endswith("jaguar-gateway-subnet")
    ip = varied.one("network:PublicIPAddress", "jaguar-vpngw-ip")
    assert ip.inputs["zones"] == ["1", "2", "3"] and ip.inputs["sku"]["name"] == "Standard"
    custom = gateway.inputs["bgpSettings"]["bgpPeeringAddresses"][0]["customBgpIpAddresses"]
    assert len(custom) == len(vpn_sites)
    assert len(varied.of("network:LocalNetworkGateway")) == len(vpn_sites)
    assert len(varied.of("network:VirtualNetworkGatewayConnection")) == len(vpn_sites)
    for site in vpn_sites:
        lng = varied.one("network:LocalNetworkGateway", f"jaguar-{site.name}-lng")
        assert lng.inputs["gatewayIpAddress"] == str(site.vpn.peer_address)
        assert lng.inputs["localNetworkAddressSpace"]["addressPrefixes"] == site.cidrs
        assert lng.inputs["bgpSettings"]["asn"] == site.vpn.bgp_asn
        conn = varied.one("network:VirtualNetworkGatewayConnection", f"jaguar-{site.name}-vpn")
        assert conn.inputs["connectionType"] == "IPsec" and conn.inputs["enableBgp"] is True
        assert conn.inputs["sharedKey"] == Secret(f"psk-{site.name}")
        assert conn.inputs["localNetworkGateway2"]["id"].endswith(f"jaguar-{site.name}-lng")
        assert conn.inputs["virtualNetworkGateway1"]["id"].endswith("jaguar-vpngw")
        details = varied.outputs["sites"][site.name]
        assert details["site_bgp_asn"] == site.vpn.bgp_asn and details["cloud_bgp_asn"] == 65515
        assert details["gateway_public_ip"] == "198.51.100.7"
        assert details["site_peer_address"] == str(site.vpn.peer_address)
        (tunnel,) = details["tunnels"]
        assert tunnel["site_inside_address"] == lng.inputs["bgpSettings"]["bgpPeeringAddress"]
        assert conn.inputs["gatewayCustomBgpIpAddresses"][0]["customBgpIpAddress"] == tunnel["cloud_inside_address"]
        assert tunnel["cloud_inside_address"] in custom
        inside = ipaddress.ip_network(tunnel["inside_cidr"])
        assert ipaddress.ip_address(tunnel["site_inside_address"]) in inside
        assert ipaddress.ip_address(tunnel["cloud_inside_address"]) in inside
        # Azure's custom APIPA range for BGP.
        cloud_ip = ipaddress.ip_address(tunnel["cloud_inside_address"])
        assert ipaddress.ip_address("169.254.21.0") <= cloud_ip <= ipaddress.ip_address("169.254.22.255")
    assert "lab" not in varied.outputs["sites"]
    assert not [r for r in varied.records if "lab" in r.name]


def test_no_vpn_sites_no_gateway():
    plan = plan_of("jaguar", sites=set_sites({"name": "lab", "cidrs": ["10.70.0.0/16"]}))
    assert plan.outputs["sites"] == {}
    for kind in ("VirtualNetworkGateway", "LocalNetworkGateway", "VirtualNetworkGatewayConnection"):
        assert not plan.of(f"network:{kind}")
    # The site's CIDRs are still let in on 6443 (reachable some other way).
    rules = _rules(plan)["jaguar-control-nsg"]
    assert "10.70.0.0/16" in _prefixes(next(r for r in rules if r["name"] == "allow-apiserver"), "source")


def test_stack_location_must_match_the_region():
    ctx = context(load("jaguar"))
    pulumi.runtime.set_all_config({"azure-native:location": "westeurope"})
    try:
        with pytest.raises(ValueError, match="azure-native:location is westeurope"):
            record(lambda: az.Network("network", ctx))
        pulumi.runtime.set_all_config({"azure-native:location": "East US 2"})
        records, _ = record(lambda: az.Network("network", ctx))
        assert records
    finally:
        pulumi.runtime.set_all_config({})


def test_reserved_site_asn_is_refused():
    ctx = context(load("jaguar", asn=lambda d: d["sites"][0]["vpn"].update(bgpASN=65515)))
    with pytest.raises(ValueError, match="reserved by Azure"):
        record(lambda: build(ctx))


# --- Helpers ---------------------------------------------------------------------


@pytest.mark.parametrize(("size", "accelerated"), [
    ("Standard_D64s_v5", True), ("Standard_E16s_v5", True), ("Standard_NC24ads_A100_v4", True),
    ("Standard_B2s", False), ("Standard_A1_v2", False), ("Standard_D1_v2", False), ("custom", False),
])
def test_accelerated_networking(size: str, accelerated: bool):
    assert common.accelerated_networking(size) is accelerated


def test_tunnel_addresses_do_not_overlap():
    seen = set()
    for i in range(64):
        inside, cloud, site = hybridlink.tunnel_addresses(i)
        net = ipaddress.ip_network(inside)
        assert net.prefixlen == 30 and net not in seen
        assert ipaddress.ip_address(cloud) in net and ipaddress.ip_address(site) in net
        seen.add(net)


def test_module_constants():
    assert az_network.GATEWAY_SUBNET == "GatewaySubnet"
    assert common.ETCD_DISK_DEVICE == "/dev/disk/azure/scsi1/lun0"
    assert re.fullmatch(r"\d+-\d+", az_network.ETCD_PORTS)


# --- Through the core's program and plan runner --------------------------------


@pytest.fixture(scope="module")
def jaguar_plan():
    """`corral plan jaguar`: the real program (PKI, bootstrap, this package) under the core's mocks."""
    plan_module = pytest.importorskip("corral.infra.plan")
    from corral.model import load_cluster

    from .azure_fixtures import ROOT

    return plan_module.plan_stack(load_cluster(ROOT / "clusters" / "jaguar.yaml"))


def test_program_plan_of_jaguar(jaguar_plan):
    resources = jaguar_plan.resources
    assert not [d for d in jaguar_plan.diagnostics if d.startswith("error")]
    by_type: dict[str, list[dict]] = {}
    for res in resources:
        by_type.setdefault(res["type"], []).append(res)
    for component in platform.COMPONENTS:
        assert len(by_type[f"corral:azure:{component}"]) == 1
    cluster = load("jaguar")
    lay = context(cluster).layout
    assert len(by_type["azure-native:compute:Disk"]) == len(lay.etcd_members)
    assert all(d["protect"] and d["retainOnDelete"] for d in by_type["azure-native:compute:Disk"])
    assert len(by_type["azure-native:compute:VirtualMachine"]) == len(lay.etcd_members) + len(lay.api_servers)
    assert sorted(v["name"] for v in by_type["azure-native:compute:VirtualMachineScaleSet"]) == [
        "jaguar-cpu-d64-1", "jaguar-cpu-d64-2", "jaguar-cpu-d64-3"]
    assert len(by_type["azure-native:network:VirtualNetworkGatewayConnection"]) == 1
    # The cloud-init holds references to the secret store, never a key: shown in the plan.
    for vm in by_type["azure-native:compute:VirtualMachine"]:
        text = base64.b64decode(vm["inputs"]["osProfile"]["customData"]).decode()
        assert text.startswith("#cloud-config") and "corral-fetch-secrets" in text and "PRIVATE KEY" not in text
    text = jaguar_plan.to_json()
    assert "PRIVATE KEY" not in text
