"""Rendering the add-ons of one cluster: templates + policy values -> Kubernetes objects.

Each add-on is one template in corral/templates/manifests/ rendered with the
values `policy.py` derives from the cluster, then parsed, so the rest of
corral (validation, ordering, output, Pulumi) works on plain dicts.
"""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass
from pathlib import Path

import jinja2
from ruamel.yaml import YAML
from ruamel.yaml.representer import SafeRepresenter

from corral.model.schema import LABEL_DOMAIN, PREFLIGHT_TAINT_KEY, UNHEALTHY_TAINT_KEY, Cluster

from . import flow_control, kueue, monitoring, network_policy, policy, repair, versions

TEMPLATES = Path(__file__).resolve().parent.parent / "templates" / "manifests"

# Apply order: what others refer to comes first (namespaces, CRDs, identities
# and their rights, configuration, policy), workloads last.
KIND_ORDER = (
    "Namespace",
    "CustomResourceDefinition",
    "PriorityClass",
    # API Priority and Fairness: the levels before the schemas that name them.
    "PriorityLevelConfiguration",
    "FlowSchema",
    "ServiceAccount",
    "ClusterRole",
    "Role",
    "ClusterRoleBinding",
    "RoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    # Before the pods they isolate, so none starts open.
    "NetworkPolicy",
    "ConfigMap",
    "Secret",
    "Service",
    "DaemonSet",
    "Deployment",
    "StatefulSet",
)


@dataclass(frozen=True)
class Addon:
    """One add-on (one file of `corral manifests --out`): a name and its objects.

    `patches` are fields of objects corral does not own: the labels of the
    namespaces Kubernetes creates itself (`default`, `kube-system`, ...).
    They are applied with server-side apply as patches, never created or
    deleted (`kubectl apply --server-side` does that with the file; Pulumi
    needs a NamespacePatch, not a Namespace, for them).
    """

    name: str
    objects: tuple[dict, ...]
    patches: tuple[dict, ...] = ()

    @property
    def every_object(self) -> tuple[dict, ...]:
        return self.objects + self.patches


def object_key(obj: dict) -> str:
    """`Kind/namespace/name` (cluster-scoped: `Kind/name`): unique in a cluster."""
    meta = obj["metadata"]
    return "/".join(p for p in (obj["kind"], meta.get("namespace"), meta["name"]) if p)


def kind_rank(obj: dict) -> int:
    try:
        return KIND_ORDER.index(obj["kind"])
    except ValueError:
        return len(KIND_ORDER)


def ordered(objects) -> list[dict]:
    """Apply order; stable, so objects of one kind keep their add-on's order."""
    return sorted(objects, key=kind_rank)


# --- templates ----------------------------------------------------------------

_env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(str(TEMPLATES)),
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True,
    autoescape=False,
)


def _load_all(text: str, template: str) -> list[dict]:
    yaml = YAML(typ="safe", pure=True)
    try:
        docs = [d for d in yaml.load_all(text) if d is not None]
    except Exception as err:  # a template bug: say which template
        raise policy.ManifestError(f"template {template} rendered invalid YAML: {err}") from err
    return docs


def _template(name: str, **context) -> list[dict]:
    template = f"{name}.yaml.j2"
    return _load_all(_env.get_template(template).render(**context), template)


def _hash(*texts: str) -> str:
    digest = hashlib.sha256()
    for text in texts:
        digest.update(text.encode())
    return digest.hexdigest()[:16]


def _files_hash(files: dict[str, str]) -> str:
    """One hash of a ConfigMap's files, names and contents (a pod annotation: restart on change)."""
    return _hash(*(f"{k}\0{v}" for k, v in sorted(files.items())))


# --- add-ons ------------------------------------------------------------------


# flannel runs as one DaemonSet per kind of node, each with its own net-conf.json.
# DirectRouting is decided on the SENDING node: with it, flanneld installs a
# plain route to a peer's pod subnet whenever the peer is on a directly
# connected subnet, and VXLAN only otherwise. A plain route works only where
# the network itself delivers packets addressed to pod IPs between the hosts:
# an on-prem L2 segment (same rack/subnet) does; a cloud VPC/VNet does not
# (AWS source/destination checks, no GCE routes, no Azure route table), and
# corral adds no cloud routes. So cloud nodes (pool nodes and the API servers,
# which kubeadm registers as nodes) always encapsulate, and only on-prem nodes
# get `network.flannel.directRouting`. The split is by the provider label every
# node registers with (Cluster.node_labels); nodes without it (API servers)
# count as cloud nodes, the safe side.
PROVIDER_LABEL = f"{LABEL_DOMAIN}/provider"


@dataclass(frozen=True)
class FlannelVariant:
    """One flannel DaemonSet: the nodes it runs on and the net-conf.json they get."""

    suffix: str           # "" (kube-flannel-ds, every node not on-prem) or "-onprem"
    app: str              # pod label and DaemonSet selector (selectors must not overlap)
    node_affinity: dict | None
    direct_routing: bool


def flannel_variants(cluster: Cluster) -> list[FlannelVariant]:
    spec = cluster.network.flannel
    takes_direct_routing = spec.backend in ("vxlan", "ipip")
    if not cluster.onprem_pools:
        return [FlannelVariant("", "flannel", None, False)]

    def provider(operator: str) -> dict:
        return {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": PROVIDER_LABEL, "operator": operator, "values": ["onprem"]}]}]}}

    return [
        # The existing DaemonSet keeps its name and (immutable) selector.
        FlannelVariant("", "flannel", provider("NotIn"), False),
        FlannelVariant("-onprem", "flannel-onprem", provider("In"), takes_direct_routing and spec.direct_routing),
    ]


def flannel(cluster: Cluster) -> list[dict]:
    spec = cluster.network.flannel
    cni_conf = {
        "name": "cbr0",
        "cniVersion": "0.3.1",
        "plugins": [
            {
                "type": "flannel",
                "delegate": {
                    "hairpinMode": True,
                    "isDefaultGateway": True,
                    # Pods get the declared MTU (network.flannel.mtu) on every
                    # node instead of each node's interface MTU minus the
                    # encapsulation: one MTU across cloud and data centre. It
                    # must fit the smallest path VXLAN crosses (see docs/addons.md).
                    "mtu": spec.mtu,
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }
    cni_conf_json = json.dumps(cni_conf, indent=2) + "\n"
    variants = []
    for variant in flannel_variants(cluster):
        backend: dict[str, object] = {"Type": spec.backend}
        if spec.backend == "vxlan":
            # VNI and port are the same in every variant: encapsulated packets
            # between nodes of different variants must decapsulate.
            backend.update({"VNI": spec.vni, "Port": spec.port, "DirectRouting": variant.direct_routing})
        elif spec.backend == "ipip":
            backend["DirectRouting"] = variant.direct_routing
        net_conf = {"Network": cluster.kubernetes.pod_cidr, "EnableIPv4": True, "Backend": backend}
        net_conf_json = json.dumps(net_conf, indent=2) + "\n"
        variants.append({
            "suffix": variant.suffix,
            "app": variant.app,
            "node_affinity": variant.node_affinity,
            "net_conf_json": net_conf_json,
            "net_conf_hash": _hash(net_conf_json, cni_conf_json),
        })
    return _template(
        "flannel",
        namespace=policy.FLANNEL_NAMESPACE,
        pod_security=policy.pod_security_labels(cluster, "privileged"),
        cni_conf_json=cni_conf_json,
        variants=variants,
        images={"flannel": versions.FLANNEL, "cni_plugin": versions.FLANNEL_CNI_PLUGIN},
    )


def nvidia_device_plugin(cluster: Cluster) -> list[dict]:
    return _template(
        "nvidia-device-plugin",
        gpu_node_selector=policy.gpu_node_selector(),
        gpu_tolerations=policy.gpu_tolerations(cluster),
        device_list_strategy=policy.DEVICE_LIST_STRATEGY,
        all_gpus_volume=policy.all_gpus_volume(),
        all_gpus_mount=policy.all_gpus_mount(),
        images={"device_plugin": versions.NVIDIA_DEVICE_PLUGIN},
    )


def rdma_shared_device_plugin(cluster: Cluster) -> list[dict]:
    resources = []
    for resource in policy.rdma_resources(cluster):
        config_json = json.dumps(policy.rdma_plugin_config(resource), indent=2) + "\n"
        resources.append({
            "daemonset": resource.daemonset,
            "config_key": resource.config_key,
            "config_json": config_json,
            "config_hash": _hash(config_json),
            "affinity": policy.pool_affinity(resource.pools),
            "tolerations": policy.pool_tolerations(cluster, resource.pools),
        })
    return _template(
        "rdma-shared-device-plugin",
        namespace=policy.RDMA_NAMESPACE,
        configmap=policy.RDMA_CONFIGMAP,
        resources=resources,
        image=versions.RDMA_SHARED_DEVICE_PLUGIN,
        policy=policy.rdma_traffic_class_policy(cluster),
    )


def cluster_autoscaler(cluster: Cluster) -> list[dict]:
    try:
        image = versions.cluster_autoscaler(cluster.kubernetes.minor)
    except versions.NoPinnedVersion as err:
        raise policy.ManifestError(str(err)) from None
    return _template(
        "cluster-autoscaler",
        image=image,
        args=policy.autoscaler_args(cluster),
        env=policy.autoscaler_env(cluster),
        affinity=policy.autoscaler_affinity(),
        host_network=policy.autoscaler_host_network(cluster),
    )


def scheduler_config_text(cluster: Cluster) -> str:
    """The KubeSchedulerConfiguration the control plane runs, from the core's renderer."""
    from corral.machine.scheduler import render_scheduler_config

    rendered = render_scheduler_config(cluster)
    return rendered if isinstance(rendered, str) else _dump([rendered], header=None)


def scheduling(cluster: Cluster) -> list[dict]:
    objects = _template("scheduling", scheduler_config=scheduler_config_text(cluster))
    if cluster.scheduling.coscheduling:
        objects += _template("coscheduling")
    return objects


def teams(cluster: Cluster) -> list[dict]:
    return _template("teams", teams=policy.team_namespaces(cluster))


def pod_security(cluster: Cluster) -> list[dict]:
    return _template(
        "pod-security",
        namespaces=policy.kubernetes_namespaces(cluster),
        policy=policy.placement_policy(cluster),
    )


def kubelet_csr_approver(cluster: Cluster) -> list[dict]:
    return _template(
        "kubelet-csr-approver",
        image=versions.KUBELET_CSR_APPROVER,
        args=policy.csr_approver_args(cluster),
        affinity=policy.autoscaler_affinity(),
    )


def node_approver(cluster: Cluster) -> list[dict]:
    from corral.certs.node_approver import SIGNER

    from . import node_approver as approver

    files = approver.files(cluster)
    return _template(
        "node-approver",
        approver=approver.NAME,
        namespace=approver.NAMESPACE,
        image=approver.IMAGE,
        files=files,
        config_hash=_files_hash(files),
        signer=SIGNER,
        pool_groups=approver.pool_groups(cluster),
        join_cluster_roles=approver.JOIN_CLUSTER_ROLES,
        join_kube_system_roles=approver.JOIN_KUBE_SYSTEM_ROLES,
        affinity=policy.autoscaler_affinity(),
        scope=approver.label_scope_policy(),
    )


def monitoring_stack(cluster: Cluster) -> list[dict]:
    gpu = bool(policy.gpu_pools(cluster))
    try:
        ksm_image = versions.kube_state_metrics(cluster.kubernetes.minor)
    except versions.NoPinnedVersion as err:
        raise policy.ManifestError(str(err)) from None
    dcgm_counters = monitoring.dcgm_counters_csv()
    files = monitoring.config_files(cluster, gpu)
    servers = monitoring.servers(cluster)
    rules = {"global": "corral-rules.yml", "shard": "corral-shard-rules.yml"}
    remote_write = cluster.monitoring.remote_write
    return _template(
        "monitoring",
        namespace=policy.MONITORING_NAMESPACE,
        prometheus_files=files,
        servers=servers,
        config_hashes={s.name: _hash(files[s.config_key], files[rules[s.role]]) for s in servers},
        replicas=monitoring.REPLICAS,
        port=monitoring.PORT,
        retention_days=cluster.monitoring.retention_days,
        storage_class=cluster.monitoring.storage_class,
        remote_write_secret=remote_write.secret if remote_write else None,
        remote_write_dir=monitoring.REMOTE_WRITE_SECRET_DIR,
        ksm_label_allowlist=monitoring.ksm_label_allowlist(),
        ksm_resources=monitoring.ksm_resources(),
        ksm_shards=monitoring.ksm_shard_count(cluster),
        pod_security=policy.pod_security_labels(cluster, "privileged"),
        off_gpu_affinity=policy.off_gpu_affinity(),
        gpu=gpu,
        gpu_node_selector=policy.gpu_node_selector(),
        gpu_tolerations=policy.gpu_tolerations(cluster),
        textfile_dir=monitoring.node_textfile_dir(),
        dcgm_counters={
            "configmap": monitoring.DCGM_COUNTERS_CONFIGMAP,
            "dir": monitoring.DCGM_COUNTERS_DIR,
            "file": monitoring.DCGM_COUNTERS_FILE,
            "text": dcgm_counters,
            "hash": _hash(dcgm_counters),
        },
        all_gpus_volume=policy.all_gpus_volume(),
        all_gpus_mount=policy.all_gpus_mount(),
        global_node_affinity=monitoring.global_node_affinity(),
        images={
            "prometheus": versions.PROMETHEUS,
            "node_exporter": versions.NODE_EXPORTER,
            "kube_state_metrics": ksm_image,
            "dcgm_exporter": versions.DCGM_EXPORTER,
        },
    ) + grafana(cluster, gpu) + network_policy.monitoring_policies(gpu)


def flow_control_levels(cluster: Cluster) -> list[dict]:
    return _template("flow-control", **flow_control.context(cluster))


def network_policy_engine(cluster: Cluster) -> list[dict]:
    return _template("network-policy", **network_policy.engine_context())


def grafana(cluster: Cluster, gpu: bool) -> list[dict]:
    from . import dashboards

    sources = monitoring.dump_yaml(dashboards.datasources(monitoring.shard_count(cluster)))
    provider = monitoring.dump_yaml({"apiVersion": 1, "providers": [{
        "name": "corral", "type": "file", "disableDeletion": True, "allowUiUpdates": False,
        "options": {"path": "/var/lib/grafana-dashboards", "foldersFromFilesStructure": False},
    }]})
    boards = dashboards.dashboards(gpu)
    return _template(
        "grafana",
        namespace=policy.MONITORING_NAMESPACE,
        image=versions.GRAFANA,
        datasources=sources,
        provider=provider,
        dashboards=boards,
        config_hash=_hash(sources, provider, *(boards[k] for k in sorted(boards))),
        off_gpu_affinity=policy.off_gpu_affinity(),
        admin_secret={
            "name": monitoring.GRAFANA_ADMIN_SECRET,
            "user_key": monitoring.GRAFANA_ADMIN_USER_KEY,
            "password_key": monitoring.GRAFANA_ADMIN_PASSWORD_KEY,
            "dir": monitoring.GRAFANA_ADMIN_DIR,
        },
    )


def gpu_health(cluster: Cluster) -> list[dict]:
    from corral.health import addon

    files = addon.config_files(cluster)
    return _template(
        "gpu-health",
        agent=addon.NAME,
        namespace=addon.NAMESPACE,
        image=addon.IMAGE,
        files=files,
        config_hash=_files_hash(files),
        gpu_node_selector=policy.gpu_node_selector(),
        sa_user=f"system:serviceaccount:{addon.NAMESPACE}:{addon.NAME}",
        agent_taints=addon.AGENT_TAINTS,
        agent_annotations=addon.AGENT_ANNOTATIONS,
        all_gpus_volume=policy.all_gpus_volume(),
        all_gpus_mount=policy.all_gpus_mount(),
    )


# Every add-on corral knows, in apply order, with when it applies.
ADDON_NAMES = (
    "flow-control", "flannel", "network-policy", "pod-security", "teams", "scheduling", "nvidia-device-plugin", "rdma-shared-device-plugin",
    "gpu-health", "repair", "cluster-autoscaler", "kubelet-csr-approver", "node-approver", "monitoring", "kueue", "kueue-queues",
)


def render(cluster: Cluster) -> list[Addon]:
    """The cluster's add-ons; those that do not apply (no GPU pool, no RoCE pool,
    no cloud pool, no team, default scheduling) are left out."""
    sched = cluster.scheduling
    parts: list[tuple[str, bool, object]] = [
        # Before the agents it classifies start.
        ("flow-control", True, flow_control_levels),
        ("flannel", True, flannel),
        ("network-policy", True, network_policy_engine),
        ("pod-security", True, pod_security),
        ("teams", bool(sched.teams), teams),
        ("scheduling", sched.bin_packing or sched.coscheduling, scheduling),
        ("nvidia-device-plugin", bool(policy.gpu_pools(cluster)), nvidia_device_plugin),
        ("rdma-shared-device-plugin", bool(policy.rdma_resources(cluster)), rdma_shared_device_plugin),
        ("gpu-health", bool(policy.gpu_pools(cluster)), gpu_health),
        ("repair", repair.wanted(cluster), lambda c: repair.objects(c, _files_hash)),
        ("cluster-autoscaler", bool(cluster.cloud_pools), cluster_autoscaler),
        ("kubelet-csr-approver", True, kubelet_csr_approver),
        ("node-approver", True, node_approver),
        ("monitoring", True, monitoring_stack),
        # Kueue's chart (corral/infra/addons.py) goes between the two: its namespace first, its CRDs' kinds after.
        ("kueue", sched.kueue.enabled, kueue.before_chart),
        ("kueue-queues", sched.kueue.enabled, kueue.after_chart),
    ]
    addons = [_split_patches(name, build(cluster)) for name, wanted, build in parts if wanted]
    _check_unique(addons)
    return addons


def _split_patches(name: str, objects: list[dict]) -> Addon:
    """The add-on, with the namespaces Kubernetes creates itself as patches."""
    def is_patch(obj: dict) -> bool:
        return obj["kind"] == "Namespace" and obj["metadata"]["name"] in policy.KUBERNETES_NAMESPACES

    return Addon(
        name,
        tuple(o for o in objects if not is_patch(o)),
        tuple(o for o in objects if is_patch(o)),
    )


def _check_unique(addons: list[Addon]) -> None:
    seen: dict[str, str] = {}
    for addon in addons:
        for obj in addon.every_object:
            key = object_key(obj)
            if key in seen:
                raise policy.ManifestError(f"{key} is rendered twice (add-ons {seen[key]} and {addon.name})")
            seen[key] = addon.name


def all_objects(addons: list[Addon]) -> list[dict]:
    """Every object and patch of the add-ons, in apply order."""
    return ordered(obj for addon in addons for obj in addon.every_object)


# --- YAML out -------------------------------------------------------------------


class _Representer(SafeRepresenter):
    """Multi-line strings (config files in ConfigMaps) as literal blocks, readable in review."""


def _represent_str(representer: SafeRepresenter, value: str):
    style = "|" if "\n" in value else None
    return representer.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Representer.add_representer(str, _represent_str)


def _yaml() -> YAML:
    yaml = YAML(typ="safe", pure=True)
    yaml.Representer = _Representer
    yaml.default_flow_style = False
    yaml.sort_base_mapping_type_on_output = False
    yaml.indent(mapping=2, sequence=4, offset=2)  # kubectl's layout
    yaml.width = 4096  # long CEL expressions and flags stay on one line
    yaml.explicit_start = True
    return yaml


def _dump(objects: list[dict], header: str | None) -> str:
    stream = io.StringIO()
    if header:
        stream.write(header)
    _yaml().dump_all(objects, stream)
    return stream.getvalue()


def header(cluster: Cluster, what: str) -> str:
    return (
        f"# {what} of cluster {cluster.name} (Kubernetes {cluster.kubernetes.version}).\n"
        f"# Rendered by `corral manifests {cluster.name}` from clusters/{cluster.name}.yaml: "
        "edit the cluster file, not this.\n"
    )


def to_yaml(cluster: Cluster, objects: list[dict], what: str = "Add-on manifests") -> str:
    """One multi-document YAML stream, `objects` in the order given."""
    return _dump(list(objects), header(cluster, what))
