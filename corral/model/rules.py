"""Rules that relate one field to others, in a cluster or across the fleet.

Each rule yields `(path, message)` with the path in the file's own key names,
so the loader can point at the line a reviewer must change.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterator, Mapping

from . import versions
from .containerd import containerd_error, pause_error
from .hosts import RACK_LABEL, HostPatternError, assign_racks, expand, expand_addresses, expand_racks
from .layout import MAX_ZONES, layout, network_too_small
from .disks import DISK_TYPES, attach_floor_error, disk_types_for, etcd_iops_floor, machine_series
from .gpu_catalog import (
    CLOUD_NAMES, GCP_ATTACHABLE, GPU_FAMILIES, closest_machine_type, gpu_machine, looks_like_gpu_machine,
)
from .mtu import flannel_mtu_limit
from .namespaces import reserved_namespace
from .nccl_baselines import pool_baseline
from .regions import region_error, zone_error
from .vm_disk_limits import vm_disk_caps
from .schema import (
    LABEL_DOMAIN, PODS_PER_NODE, PRIVATE_NETWORKS, ArpCache, CloudPool, Cluster, OnPremPool, is_private_network,
)

Finding = tuple[tuple, str]

# The kernel's own gc_thresh1 (ip-sysctl.rst): never refused.
KERNEL_GC_THRESH1 = 128

# Machine type shapes per cloud: a type copied from another cloud's file is a
# common slip, and the cloud would only reject it at `pulumi up` time.
MACHINE_TYPE_SHAPES = {
    "azure": (re.compile(r"Standard_[A-Za-z0-9_]+\Z"), "Standard_D32s_v5"),
    "aws": (re.compile(r"[a-z][a-z0-9-]*\.[a-z0-9]+\Z"), "m7i.8xlarge"),
    "gcp": (re.compile(r"[a-z][a-z0-9]*-[a-z0-9-]+\Z"), "n2-standard-32"),
}


def machine_type_error(cloud: str, machine_type: str) -> str | None:
    shape, example = MACHINE_TYPE_SHAPES[cloud]
    if not shape.match(machine_type):
        return f"'{machine_type}' is not a {cloud} machine type (like {example})"
    return None


# Labels corral derives for every node (Cluster.node_labels): a pool that set
# them itself could claim to be another pool, site or GPU model.
RESERVED_LABELS = frozenset(
    {f"{LABEL_DOMAIN}/{name}" for name in
     ("cluster", "pool", "provider", "location", "site", "roce", "gpu-model", "gpu-count", "team")}
    | {"nvidia.com/gpu.present"}
)


def check_cluster(cluster: Cluster, data: Mapping | None = None) -> list[Finding]:
    """Every finding of one cluster. `data` is the file's own data (what the
    YAML says, before defaults), so findings about a value the file left out
    point at the line that writes the value it inherits."""
    return [
        *_control_plane(cluster),
        *_pool_zones(cluster, data),
        *_containerd(cluster),
        *_per_minor_releases(cluster),
        *_etcd_disk(cluster),
        *_etcd_disk_shape(cluster),
        *_etcd_disk_vm_caps(cluster),
        *_networks(cluster),
        *_pod_network_size(cluster),
        *_sites(cluster),
        *_pools(cluster),
        *_network_settings(cluster),
        *_pod_network_backend(cluster),
        *_teams(cluster),
        *_rdma_resources(cluster),
        *_host_addresses(cluster),
        *_host_racks(cluster),
        *_burn_in_baselines(cluster),
    ]


def _control_plane(cluster: Cluster) -> Iterator[Finding]:
    cp = cluster.control_plane
    if message := region_error(cp.cloud, cp.region):
        # One finding for a wrong region: its zones cannot be judged until it is right.
        yield ("controlPlane", "region"), message
    else:
        for i, zone in enumerate(cp.zones):
            if message := zone_error(cp.cloud, cp.region, zone):
                yield ("controlPlane", "zones", i), message
    if len(set(cp.zones)) != len(cp.zones):
        yield ("controlPlane", "zones"), "a zone is listed twice"
    if len(cp.zones) > MAX_ZONES:
        yield ("controlPlane", "zones", MAX_ZONES), f"at most {MAX_ZONES} zones"
    if message := network_too_small(cp.network_cidr):
        yield ("controlPlane", "networkCIDR"), message
    elif cluster.cloud_pools:
        usable = sum(ipaddress.ip_network(z.node_subnet).num_addresses - 5 for z in layout(cluster).zones)
        wanted = sum(p.max_size for p in cluster.cloud_pools if p.provider == cp.cloud)
        if wanted > usable:
            yield ("controlPlane", "networkCIDR"), (
                f"the node subnets of {cp.network_cidr} hold {usable:,} machines, "
                f"but the cloud pools may grow to {wanted:,}; use a larger network"
            )
    members = cp.etcd.members
    if members % 2 == 0 or not 3 <= members <= 7:
        why = " (an even count adds no fault tolerance)" if members % 2 == 0 else ""
        yield ("controlPlane", "etcd", "members"), (
            f"etcd needs an odd number of members from 3 to 7, not {members}{why}"
        )
    for path, machine_type in (
        (("controlPlane", "apiServers", "machineType"), cp.api_servers.machine_type),
        (("controlPlane", "etcd", "machineType"), cp.etcd.machine_type),
    ):
        if message := machine_type_error(cp.cloud, machine_type):
            yield path, message


def _containerd(cluster: Cluster) -> Iterator[Finding]:
    kubernetes = cluster.kubernetes
    if message := containerd_error(kubernetes.version, kubernetes.containerd):
        yield ("kubernetes", "containerd"), message
    if message := pause_error(kubernetes.version):
        yield ("kubernetes", "version"), message


def _per_minor_releases(cluster: Cluster) -> Iterator[Finding]:
    """What the cluster uses that upstream has not released for its minor (the catalog row says
    which and where that was checked): refused here, where the file's line can be shown, rather
    than when the manifests or the machines are rendered."""
    row = versions.MINORS.get(cluster.kubernetes.minor)
    if row is None:
        return  # _containerd reports the unknown minor
    minor = row.minor
    plugins = row.scheduler_plugins
    if cluster.scheduling.coscheduling and plugins is not None and plugins.value is None:
        yield ("scheduling", "coscheduling"), (
            f"Coscheduling runs scheduler-plugins' kube-scheduler build, and {plugins.missing}, so it cannot "
            f"run on Kubernetes {minor}; gang-schedule with Kueue "
            "instead, which corral installs (scheduling.kueue): waitForPodsReady admits a job's pods all or "
            "nothing (docs/scheduling.md); remove coscheduling: true"
        )
    autoscaler = row.cluster_autoscaler
    if cluster.cloud_pools and autoscaler is not None and autoscaler.value is None:
        names = [pool.name for pool in cluster.cloud_pools]
        pools = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
        yield ("kubernetes", "version"), (
            f"cloud pools ({pools}) are scaled by the cluster-autoscaler of the cluster's minor, and there is "
            f"{autoscaler.missing}; run the newest minor that has one "
            f"({max(versions.per_minor('cluster_autoscaler'), key=versions.key)}) until it is released"
        )


def _etcd_disk(cluster: Cluster) -> Iterator[Finding]:
    cloud = cluster.control_plane.cloud
    disk = cluster.control_plane.etcd.disk
    here = ("controlPlane", "etcd", "disk")
    kind = DISK_TYPES.get(disk.type)
    if kind is None or kind.cloud != cloud:
        yield (*here, "type"), (
            f"'{disk.type}' is not a provisioned-IOPS disk type on {cloud}; "
            f"use one of {', '.join(disk_types_for(cloud))}"
        )
        return
    etcd_type = cluster.control_plane.etcd.machine_type
    if kind.attach_series is not None and machine_series(etcd_type) not in kind.attach_series:
        yield ("controlPlane", "etcd", "machineType"), (
            f"{etcd_type} ({machine_series(etcd_type).upper()} series) cannot attach {kind.name} disks; "
            f"use a machine of series {', '.join(sorted(kind.attach_series))}"
        )
    low, high = kind.size_gib
    if not low <= disk.size_gib <= high:
        yield (*here, "sizeGiB"), f"{kind.name} disks are {low} to {high} GiB, not {disk.size_gib}"
    low, high = kind.iops
    if not low <= disk.iops <= high:
        yield (*here, "iops"), f"{kind.name} takes {low:,} to {high:,} IOPS, not {disk.iops:,}"
    elif kind.max_iops_per_gib and disk.iops > kind.max_iops_per_gib * disk.size_gib:
        yield (*here, "iops"), (
            f"{kind.name} allows at most {kind.max_iops_per_gib} IOPS per GiB: "
            f"{disk.iops:,} IOPS needs at least {-(-disk.iops // kind.max_iops_per_gib)} GiB"
        )
    floor = etcd_iops_floor(cluster.node_capacity)
    if disk.iops < floor:
        yield (*here, "iops"), (
            f"{disk.iops:,} IOPS is too few for etcd in a cluster of up to "
            f"{cluster.node_capacity:,} nodes; provision at least {floor:,}"
        )
    if not kind.takes_throughput:
        if disk.throughput_mbps is not None:
            yield (*here, "throughputMBps"), (
                f"{kind.name} takes no throughput setting (it follows from IOPS); remove it"
            )
        return
    low, high = kind.throughput_mbps
    if not low <= disk.throughput_mbps <= high:
        yield (*here, "throughputMBps"), (
            f"{kind.name} takes {low:,} to {high:,} MB/s, not {disk.throughput_mbps:,}"
        )
    elif kind.max_mbps_per_iops and disk.throughput_mbps > kind.max_mbps_per_iops * disk.iops:
        yield (*here, "throughputMBps"), (
            f"{kind.name} allows at most {kind.max_mbps_per_iops} MB/s per IOPS: "
            f"{disk.throughput_mbps} MB/s needs at least {int(disk.throughput_mbps / kind.max_mbps_per_iops):,} IOPS"
        )


def _etcd_disk_shape(cluster: Cluster) -> Iterator[Finding]:
    """GCE disk types that attach only to large shapes of a series (disks.ATTACH_FLOORS)."""
    cp = cluster.control_plane
    kind = DISK_TYPES.get(cp.etcd.disk.type)
    if kind is None or kind.cloud != cp.cloud:
        return  # _etcd_disk reports the type
    if kind.attach_series is not None and machine_series(cp.etcd.machine_type) not in kind.attach_series:
        return  # _etcd_disk reports the series
    if message := attach_floor_error(kind.name, cp.etcd.machine_type):
        yield ("controlPlane", "etcd", "machineType"), f"{message}; use a larger machine type or another disk type"


def _etcd_disk_vm_caps(cluster: Cluster) -> Iterator[Finding]:
    """A disk provisioned above what its VM sustains is paid for and never used
    (vm_disk_limits: sustained per-VM caps; machine types not tabled pass)."""
    cp = cluster.control_plane
    disk, machine = cp.etcd.disk, cp.etcd.machine_type
    kind = DISK_TYPES.get(disk.type)
    if kind is None or kind.cloud != cp.cloud:
        return
    caps = vm_disk_caps(cp.cloud, kind.name, machine)
    if caps is None:
        return
    here = ("controlPlane", "etcd", "disk")
    flagged = {path for path, _ in _etcd_disk(cluster)}  # one problem per field
    iops, mbps, burst_iops, burst_mbps = caps
    if (*here, "iops") not in flagged and disk.iops > iops:
        burst = f" (bursts to {burst_iops:,} for at most 30 minutes)" if burst_iops > iops else ""
        yield (*here, "iops"), (
            f"{disk.iops:,} IOPS is more than {machine} can use: it sustains {iops:,} IOPS "
            f"across its disks{burst}; provision at most {iops:,} or use a larger machine type"
        )
    if (kind.takes_throughput and disk.throughput_mbps is not None
            and (*here, "throughputMBps") not in flagged and disk.throughput_mbps > mbps):
        burst = f" (bursts to {burst_mbps:,g} for at most 30 minutes)" if burst_mbps > mbps else ""
        yield (*here, "throughputMBps"), (
            f"{disk.throughput_mbps:,} MB/s is more than {machine} can use: it sustains {mbps:,g} MB/s "
            f"across its disks{burst}; provision at most {int(mbps):,} or use a larger machine type"
        )


def _networks(cluster: Cluster) -> Iterator[Finding]:
    named = [
        (("kubernetes", "podCIDR"), "the pod network", cluster.kubernetes.pod_cidr),
        (("kubernetes", "serviceCIDR"), "the service network", cluster.kubernetes.service_cidr),
        (("controlPlane", "networkCIDR"), "the control plane's network", cluster.control_plane.network_cidr),
    ]
    for i, site in enumerate(cluster.sites):
        for j, cidr in enumerate(site.cidrs):
            named.append((("sites", i, "cidrs", j), f"site {site.name}'s network", cidr))
    nets = [(path, what, ipaddress.ip_network(cidr)) for path, what, cidr in named]
    for a in range(len(nets)):
        for b in range(a + 1, len(nets)):
            path_a, what_a, net_a = nets[a]
            path_b, what_b, net_b = nets[b]
            if net_a.version == net_b.version and net_a.overlaps(net_b):
                yield path_b, f"{net_b} overlaps {what_a} {net_a}"


# Each node gets a /24 of the pod network (flannel's SubnetLen and the
# controller manager's --node-cidr-mask-size default): 254 pods per node.
NODE_POD_PREFIX = 24


def _pod_network_size(cluster: Cluster) -> Iterator[Finding]:
    pods = ipaddress.ip_network(cluster.kubernetes.pod_cidr)
    room = 2 ** max(0, NODE_POD_PREFIX - pods.prefixlen) if pods.version == 4 else None
    if room is not None and cluster.node_capacity > room:
        wanted = NODE_POD_PREFIX - max(1, (cluster.node_capacity - 1).bit_length())
        yield ("kubernetes", "podCIDR"), (
            f"{pods} gives {room:,} nodes a /{NODE_POD_PREFIX} each, but the cluster may have "
            f"{cluster.node_capacity:,} nodes; use a /{wanted} or larger"
        )


def _sites(cluster: Cluster) -> Iterator[Finding]:
    seen: set[str] = set()
    for i, site in enumerate(cluster.sites):
        if site.name in seen:
            yield ("sites", i, "name"), f"site '{site.name}' is defined twice"
        seen.add(site.name)
        if site.allow_public_cidrs:
            continue
        for j, cidr in enumerate(site.cidrs):
            if not is_private_network(cidr):
                yield ("sites", i, "cidrs", j), (
                    f"{cidr} is not a private network ({', '.join(map(str, PRIVATE_NETWORKS))}); "
                    "set allowPublicCIDRs: true on the site if it really routes public addresses of its own"
                )


def _pools(cluster: Cluster) -> Iterator[Finding]:
    names: set[str] = set()
    host_owner: dict[str, str] = {}
    for i, pool in enumerate(cluster.node_pools):
        here = ("nodePools", i)
        if pool.name in names:
            yield (*here, "name"), f"pool '{pool.name}' is defined twice"
        names.add(pool.name)
        for key in pool.labels:
            if key in RESERVED_LABELS:
                yield (*here, "labels", key), (
                    f"'{key}' is set by corral from the pool's definition; remove it"
                )
            elif pool.gpu is None and key.startswith("nvidia.com/"):
                yield (*here, "labels", key), "nvidia.com/ labels belong to GPU pools; declare gpu: instead"
        if isinstance(pool, OnPremPool):
            yield from _onprem_pool(cluster, pool, here, host_owner)
        else:
            yield from _cloud_pool(cluster, pool, here)


def _onprem_pool(cluster: Cluster, pool: OnPremPool, here: tuple, host_owner: dict) -> Iterator[Finding]:
    site = cluster.site(pool.site)
    if site is None:
        known = ", ".join(s.name for s in cluster.sites) or "none defined"
        yield (*here, "site"), f"unknown site '{pool.site}' (sites: {known})"
    elif site.vpn is None:
        yield (*here, "site"), (
            f"site '{pool.site}' has no vpn: its nodes could not reach the control plane"
        )
    for j, pattern in enumerate(pool.hosts):
        for host in expand(pattern):
            owner = host_owner.get(host)
            if owner is not None:
                yield (*here, "hosts", j), f"host '{host}' is already in pool '{owner}'"
                break
            host_owner[host] = pool.name
    if pool.gpu and pool.gpu.driver is None:
        yield (*here, "gpu", "driver"), "on-prem GPU pools must pin an NVIDIA driver version"


def _cloud_pool(cluster: Cluster, pool: CloudPool, here: tuple) -> Iterator[Finding]:
    cp = cluster.control_plane
    if pool.provider != cp.cloud:
        yield (*here, "provider"), (
            f"pool on {pool.provider}, but the control plane is on {cp.cloud}: "
            "cloud pools live in the control plane's cloud and region"
        )
        return
    if message := machine_type_error(pool.provider, pool.machine_type):
        yield (*here, "machineType"), message
    else:
        yield from _cloud_gpu(pool, here)
    if pool.min_size > pool.max_size:
        yield (*here, "minSize"), f"minSize {pool.min_size} is larger than maxSize {pool.max_size}"


def _pool_zones(cluster: Cluster, data: Mapping | None) -> Iterator[Finding]:
    """Cloud pools' own zone lists: zones of the region, and among the control plane's.

    A pool that writes no zones takes the control plane's (schema), which
    `_control_plane` checks at the line that writes them; checking the copy
    again would repeat each finding at the pool. Without the file's data
    (`check_cluster(cluster)`), a list equal to the control plane's counts as
    inherited. A wrong region is reported once, by `_control_plane`.
    """
    cp = cluster.control_plane
    if region_error(cp.cloud, cp.region):
        return
    pools_data = data.get("nodePools") if isinstance(data, Mapping) else None
    for i, pool in enumerate(cluster.node_pools):
        if not isinstance(pool, CloudPool) or pool.provider != cp.cloud:
            continue  # _cloud_pool reports a pool on another cloud
        if isinstance(pools_data, list) and i < len(pools_data) and isinstance(pools_data[i], Mapping):
            inherited = "zones" not in pools_data[i]
        else:
            inherited = pool.zones == cp.zones
        if inherited:
            continue
        for j, zone in enumerate(pool.zones or []):
            if message := zone_error(cp.cloud, cp.region, zone):
                yield ("nodePools", i, "zones", j), message
            elif zone not in cp.zones:
                # Node subnets exist only in the control plane's zones (layout.py).
                yield ("nodePools", i, "zones", j), (
                    f"zone '{zone}' is not one of the control plane's zones ({', '.join(cp.zones)})"
                )


def _cloud_gpu(pool: CloudPool, here: tuple) -> Iterator[Finding]:
    """A cloud pool's GPUs are its machine type's (gpu_catalog, docs/gpu-machines.md).

    Catalogued machine types: a declared gpu block must name their model and
    count, and fabricManager must fit their NVSwitch (the schema fills a block
    left out). Other types that look like GPU machines of the cloud must
    declare their block, which is trusted; any other type has no GPUs.
    """
    cloud, machine_type, gpu = pool.provider, pool.machine_type, pool.gpu
    machine = gpu_machine(cloud, machine_type)
    if machine is not None:
        has = f"{machine_type} has {machine.describe()}"
        if gpu.model != machine.gpu_model:
            yield (*here, "gpu", "model"), (
                f"{has}, not {gpu.model}; use model: {machine.gpu_model}, or leave gpu out to take the machine's"
            )
        if gpu.count != machine.gpu_count:
            yield (*here, "gpu", "count"), (
                f"{has}, not {gpu.count} GPUs: a machine always brings all of them; use count: "
                f"{machine.gpu_count}, or leave gpu out to take the machine's"
            )
        explicit = "fabric_manager" in gpu.model_fields_set
        if machine.nvswitch is False and gpu.fabric_manager:
            yield (*here, "gpu", "fabricManager"), (
                f"{has}: no NVSwitch, so NVIDIA's fabric manager has nothing to manage and fails to start; "
                "remove fabricManager"
            )
        elif machine.nvswitch and explicit and not gpu.fabric_manager:
            yield (*here, "gpu", "fabricManager"), (
                f"{has}: CUDA cannot use GPUs joined by NVSwitch until NVIDIA's fabric manager has set "
                "the switches up; set fabricManager: true, or leave it out"
            )
        return
    families = GPU_FAMILIES[cloud][1]
    if looks_like_gpu_machine(cloud, machine_type):
        if gpu is None:
            guess = closest_machine_type(cloud, machine_type)
            hint = f" (did you mean {guess}?)" if guess else ""
            yield (*here, "machineType"), (
                f"'{machine_type}' looks like a GPU machine type of {CLOUD_NAMES[cloud]}, but corral's catalog "
                f"(docs/gpu-machines.md) does not list it{hint}; fix the name, or declare the pool's "
                "gpu (model and count) if it is a GPU machine the catalog lacks"
            )
        return
    if gpu is None:
        return
    if cloud == "gcp" and machine_type.startswith("n1-"):
        if gpu.model not in GCP_ATTACHABLE:
            yield (*here, "gpu", "model"), (
                f"GCP attaches only {', '.join(GCP_ATTACHABLE)} to N1 machines, not {gpu.model}; "
                f"{gpu.model} comes with the A and G series machine types"
            )
        return
    yield (*here, "gpu"), (
        f"{machine_type} has no GPUs ({CLOUD_NAMES[cloud]} GPU machines are {families}); "
        "remove gpu, or use a GPU machine type"
    )


def _network_settings(cluster: Cluster) -> Iterator[Finding]:
    flannel = cluster.network.flannel
    if flannel.direct_routing and flannel.backend != "vxlan":
        yield ("network", "flannel", "directRouting"), (
            f"directRouting is a vxlan option; backend is {flannel.backend}"
        )
    arp = cluster.network.arp_cache
    if not arp.gc_thresh1 < arp.gc_thresh2 < arp.gc_thresh3:
        yield ("network", "arpCache", "gcThresh2"), (
            f"ARP thresholds must ascend: gcThresh1 {arp.gc_thresh1} < gcThresh2 "
            f"{arp.gc_thresh2} < gcThresh3 {arp.gc_thresh3}"
        )
    # Below gc_thresh1 the kernel purges nothing, stale entries included.
    working_set = ArpCache.working_set(cluster.node_capacity)
    if arp.gc_thresh1 > max(2 * working_set, KERNEL_GC_THRESH1):
        yield ("network", "arpCache", "gcThresh1"), (
            f"gcThresh1 {arp.gc_thresh1:,} is the number of neighbour entries the kernel never purges, "
            f"stale ones included; a node of this cluster uses about {working_set:,} "
            f"({cluster.node_capacity:,} nodes and {PODS_PER_NODE} pods); use at most {2 * working_set:,}, "
            "or leave arpCache out to have it sized for the cluster"
        )
    # One MTU for the whole pod network, no larger than its smallest path
    # (mtu.py). The RoCE NICs are no such path: flanneld sends from the
    # interface of the default route, never the RoCE fabric.
    if flannel.backend != "host-gw":  # refused by _pod_network_backend
        limit, why = flannel_mtu_limit(cluster.control_plane.cloud, cluster.vpn_site_names, flannel.backend)
        if flannel.mtu > limit:
            yield ("network", "flannel", "mtu"), (
                f"flannel's MTU {flannel.mtu} is more than the pod network's paths carry: {why}; "
                f"use at most {limit}"
            )


def _pod_network_backend(cluster: Cluster) -> Iterator[Finding]:
    # host-gw routes every pod packet unencapsulated to the peer host, and only
    # an on-prem L2 segment delivers those. Every corral cluster has cloud
    # nodes (its API servers run kubelet and flannel), whose networks do not
    # (see docs/addons.md, flannel).
    if cluster.network.flannel.backend == "host-gw":
        yield ("network", "flannel", "backend"), (
            "host-gw sends pod traffic unencapsulated, which cloud networks drop, and the API servers "
            "are cloud nodes; use vxlan (with directRouting, on-prem nodes still route directly within a subnet)"
        )


def _teams(cluster: Cluster) -> Iterator[Finding]:
    reserved_by: dict[str, str] = {}
    namespace_owner: dict[str, str] = {}
    for i, team in enumerate(cluster.scheduling.teams):
        here = ("scheduling", "teams", i)
        for j, pool_name in enumerate(team.reserved_pools):
            if cluster.pool(pool_name) is None:
                known = ", ".join(p.name for p in cluster.node_pools) or "none defined"
                yield (*here, "reservedPools", j), f"no pool named '{pool_name}' (pools: {known})"
            elif pool_name in reserved_by:
                yield (*here, "reservedPools", j), (
                    f"pool '{pool_name}' is already reserved by team '{reserved_by[pool_name]}'"
                )
            reserved_by.setdefault(pool_name, team.name)
        for j, namespace in enumerate(team.namespaces):
            # A team's namespace gets the team's Pod Security labels and tolerations; an add-on's
            # (or Kubernetes') would lose its own, or its pods' exemptions (namespaces.py).
            why = reserved_namespace(namespace)
            if why:
                yield (*here, "namespaces", j), (
                    f"namespace '{namespace}' is {why}; a team's namespaces must be its own"
                )
            if namespace in namespace_owner:
                yield (*here, "namespaces", j), (
                    f"namespace '{namespace}' already belongs to team '{namespace_owner[namespace]}'"
                )
            namespace_owner.setdefault(namespace, team.name)


def _rdma_resources(cluster: Cluster) -> Iterator[Finding]:
    """Pools that share an RDMA resource share its traffic class.

    A pod asks for the resource, not a pool, and the admission policy holds
    its NCCL_IB_TC to the one traffic class of that resource
    (corral/manifests/policy.py, docs/addons.md "RDMA for pods"): two pools
    behind one name with different DSCP or ECN would leave a pod's traffic in
    the wrong class on one of them.
    """
    first: dict[str, OnPremPool] = {}
    for i, pool in enumerate(cluster.node_pools):
        if not isinstance(pool, OnPremPool) or pool.roce is None:
            continue
        roce = pool.roce
        other = first.setdefault(roce.rdma_resource, pool)
        if other is not pool and (other.roce.dscp, other.roce.ecn) != (roce.dscp, roce.ecn):
            yield ("nodePools", i, "roce", "rdmaResource"), (
                f"{roce.rdma_resource} is also pool '{other.name}'s resource, whose RoCE traffic is DSCP "
                f"{other.roce.dscp} with ECN {'on' if other.roce.ecn else 'off'} (traffic class "
                f"{other.roce.traffic_class}), but this pool's is DSCP {roce.dscp} with ECN "
                f"{'on' if roce.ecn else 'off'} ({roce.traffic_class}): pods request the resource, not the pool, "
                "so give this pool its own rdmaResource or the same dscp and ecn"
            )


def check_fleet(clusters: Mapping[str, Cluster]) -> Iterator[tuple[str, tuple, str]]:
    """Rules across clusters: no host in two clusters."""
    owner: dict[str, str] = {}
    for name, cluster in clusters.items():
        for i, pool in enumerate(cluster.node_pools):
            if not isinstance(pool, OnPremPool):
                continue
            for j, pattern in enumerate(pool.hosts):
                for host in expand(pattern):
                    other = owner.get(host)
                    if other is not None and other != name:
                        yield name, ("nodePools", i, "hosts", j), f"host '{host}' is also in cluster '{other}'"
                        break
                    owner[host] = name
    yield from _fleet_host_addresses(clusters)


def _host_addresses(cluster: Cluster) -> Iterator[Finding]:
    """A pool's addresses: one entry per hosts entry, expanding to as many
    addresses as it has names, each inside the pool's site's networks and
    given to one host only. The first problem of an entry is reported."""
    owner: dict[str, str] = {}
    for i, pool in enumerate(cluster.node_pools):
        if not isinstance(pool, OnPremPool) or pool.addresses is None:
            continue
        here = ("nodePools", i, "addresses")
        if len(pool.addresses) != len(pool.hosts):
            yield here, (
                f"{len(pool.addresses)} addresses entries for {len(pool.hosts)} hosts entries: "
                "give one per hosts entry, in the same order (null for hosts reached by name)"
            )
            continue
        site = cluster.site(pool.site)
        networks = [ipaddress.ip_network(cidr) for cidr in site.cidrs] if site else []
        for j, (names_pattern, pattern) in enumerate(zip(pool.hosts, pool.addresses)):
            if pattern is None:
                continue
            names, addresses = expand(names_pattern), expand_addresses(pattern)
            if len(names) != len(addresses):
                yield (*here, j), (
                    f"'{pattern}' expands to {len(addresses):,} addresses but hosts entry '{names_pattern}' to "
                    f"{len(names):,} hosts: the ranges must expand to the same count "
                    "(the n-th address is the n-th host's)"
                )
                continue
            for name, address in zip(names, addresses):
                if networks and not any(ipaddress.ip_address(address) in network for network in networks):
                    yield (*here, j), (
                        f"{address} ({name}) is not in site {site.name}'s networks ({', '.join(site.cidrs)})"
                    )
                    break
                other = owner.get(address)
                if other is not None:
                    yield (*here, j), f"{address} ({name}) is already the address of {other}"
                    break
                owner[address] = name


def _host_racks(cluster: Cluster) -> Iterator[Finding]:
    """A pool's racks: one entry per hosts entry, each dividing its hosts
    evenly (an equal run of hosts per rack, in order: OnPremPool.host_racks)."""
    for i, pool in enumerate(cluster.node_pools):
        if not isinstance(pool, OnPremPool) or pool.racks is None:
            continue
        here = ("nodePools", i, "racks")
        if RACK_LABEL in pool.labels:
            # A pool label puts every host in one rack (a pool without racks
            # may say so); beside racks it would contradict them.
            yield ("nodePools", i, "labels", RACK_LABEL), (
                f"'{RACK_LABEL}' comes from the pool's racks; remove the label (or the racks)"
            )
        if len(pool.racks) != len(pool.hosts):
            yield here, (
                f"{len(pool.racks)} racks entries for {len(pool.hosts)} hosts entries: "
                "give one per hosts entry, in the same order"
            )
            continue
        for j, (names_pattern, pattern) in enumerate(zip(pool.hosts, pool.racks)):
            try:
                assign_racks(expand(names_pattern), expand_racks(pattern))
            except HostPatternError as err:
                yield (*here, j), f"'{pattern}' beside hosts entry '{names_pattern}': {err}"


def _fleet_host_addresses(clusters: Mapping[str, Cluster]) -> Iterator[tuple[str, tuple, str]]:
    """No address given to hosts of two clusters."""
    owner: dict[str, tuple[str, str]] = {}
    for name, cluster in clusters.items():
        for i, pool in enumerate(cluster.node_pools):
            if not isinstance(pool, OnPremPool):
                continue
            for j, (names_pattern, pattern) in enumerate(zip(pool.hosts, pool.addresses or [])):
                if pattern is None:
                    continue
                for host, address in zip(expand(names_pattern), expand_addresses(pattern)):
                    other = owner.get(address)
                    if other is not None and other[0] != name:
                        yield name, ("nodePools", i, "addresses", j), (
                            f"{address} ({host}) is also the address of {other[1]} in cluster '{other[0]}'"
                        )
                        break
                    owner[address] = (name, host)


def _burn_in_baselines(cluster: Cluster) -> Iterator[Finding]:
    """health.burnIn holds a multi-GPU node's all-reduce to its GPU model's published baseline
    (nccl_baselines.py) or to the file's ncclMinBusGBps: a pool with neither could never pass a burn-in,
    so its nodes would never be admitted. Said here, before a node boots, once per GPU model."""
    burn_in = cluster.health.burn_in
    if not burn_in.enabled:
        if cluster.health.auto_repair.enabled:
            # The repair controller readmits a node only after a passed burn-in of its repair: without
            # burn-ins every repaired node would wait, escalate and end in RMA.
            yield ("health", "burnIn", "enabled"), (
                "automatic repair (health.autoRepair.enabled, on by default) readmits a repaired node only "
                "after its burn-in passes: keep burnIn enabled, or set health.autoRepair.enabled: false")
        return
    lacking: dict[str, list[str]] = {}
    for i, pool in enumerate(cluster.node_pools):
        gpu = pool.gpu
        # One GPU: no all-reduce to measure (busbw = algbw * 2(n-1)/n).
        if gpu is None or gpu.count < 2 or gpu.model in burn_in.nccl_min_bus_gbps or pool_baseline(pool):
            continue
        if isinstance(pool, CloudPool) and next(_cloud_gpu(pool, ("nodePools", i)), None):
            continue    # its gpu block is refused already (_cloud_gpu): the baseline waits for the real model and count
        lacking.setdefault(gpu.model, []).append(f"{gpu.count} x {gpu.model} (pool {pool.name})")
    for model, pools in lacking.items():
        yield ("health", "burnIn", "ncclMinBusGBps", model), (
            f"no published all-reduce baseline for {' or '.join(pools)}: run all_reduce_perf on a known-good "
            f"node and set {burn_in.nccl_min_percent_of_baseline:g}% of its bus bandwidth here, or 0 to require "
            "only that the run completes")
