"""What a pod may do and where it may run, and who may read what, in the add-ons.

- The pod placement ValidatingAdmissionPolicy, its real CEL evaluated with a
  CEL interpreter (cel-python) against the pods the API server would see:
  every known bypass (nodeName onto a reserved or control-plane node, the
  control-plane toleration, wildcard tolerations, another team's taint) and
  the pods that must still pass (corral's own workloads among them).
- Pod Security Admission labels on every namespace corral manages or patches.
- Least privilege of the monitoring and kubelet-csr-approver identities.
- kubelet serving certificates: requested from the cluster CA, verified by
  the API server, approved only for this cluster's node names and addresses.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path

import pytest

from corral.manifests import all_objects, object_key, policy, render
from corral.manifests.monitoring import KSM_RESOURCES
from corral.model import Cluster, load_fleet
from corral.model.layout import layout
from corral.model.schema import TEAM_TAINT_KEY
from tests.admission import evaluate_policy

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "clusters"
FLEET = load_fleet([EXAMPLES])
NAMES = sorted(FLEET.clusters)
WORKLOAD_KINDS = ("DaemonSet", "Deployment", "StatefulSet")
CONTROL_PLANE = "node-role.kubernetes.io/control-plane"


def objects_of(cluster: Cluster) -> dict[str, dict]:
    return {object_key(o): o for o in all_objects(render(cluster))}


def placement_policy(cluster: Cluster) -> dict:
    objects = objects_of(cluster)
    key = f"ValidatingAdmissionPolicy/{policy.PLACEMENT_POLICY_NAME}"
    assert key in objects, sorted(objects)
    return objects[key]


# --- the placement policy, evaluated ---------------------------------------------


def admit(cluster: Cluster, namespace: str, spec: dict, operation: str = "CREATE") -> tuple[bool, list[str]]:
    """(allowed, denial messages) of the placement policy for a pod with `spec` in `namespace`."""
    return evaluate_pod_policy(placement_policy(cluster)["spec"], namespace, spec, operation)


def evaluate_pod_policy(vap: dict, namespace: str, spec: dict, operation: str = "CREATE") -> tuple[bool, list[str]]:
    """(allowed, denial messages) of a pod ValidatingAdmissionPolicy (its `spec`) for a
    pod with `spec` in `namespace`, as the API server decides.

    The namespace selector is matched as the API server does (the
    kubernetes.io/metadata.name label is the namespace's name); then the
    variables and every validation are evaluated, and the message
    expression of each failing validation.
    """
    for expression in vap["matchConstraints"]["namespaceSelector"]["matchExpressions"]:
        assert expression["key"] == "kubernetes.io/metadata.name" and expression["operator"] == "NotIn"
        if namespace in expression["values"]:
            return True, []  # the policy does not apply there
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": namespace}, "spec": spec}
    return evaluate_policy(vap, object=pod, request={"namespace": namespace, "operation": operation})


def pod(*tolerations: dict, node_name: str | None = None) -> dict:
    spec: dict = {"containers": [{"name": "c", "image": "registry.example/job:1"}]}
    if tolerations:
        spec["tolerations"] = list(tolerations)
    if node_name is not None:
        spec["nodeName"] = node_name
    return spec


def team(value: str, **extra) -> dict:
    return {"key": TEAM_TAINT_KEY, "operator": "Equal", "value": value, "effect": "NoSchedule", **extra}


JAGUAR = FLEET.clusters["jaguar"]
ROBOTICS_NODE = JAGUAR.pool("gpu-h100-robotics").host_names[0]  # reserved for robotics
SHARED_GPU_NODE = JAGUAR.pool("gpu-h100-sf1").host_names[0]
API_SERVER = layout(JAGUAR).api_servers[0].name

DENIED = [
    # nodeName skips the scheduler and with it every NoSchedule taint.
    ("nodeName onto another team's reserved node", "default", pod(node_name=ROBOTICS_NODE)),
    ("nodeName onto an API server", "default", pod(node_name=API_SERVER)),
    ("nodeName onto an API server from a team", "robotics", pod(node_name=API_SERVER)),
    ("nodeName even onto the team's own node", "robotics", pod(team("robotics"), node_name=ROBOTICS_NODE)),
    ("nodeName onto a shared node", "default", pod(node_name=SHARED_GPU_NODE)),
    # The control plane's taint, from anywhere but kube-system and the add-ons.
    ("control-plane toleration", "default", pod({"key": CONTROL_PLANE, "operator": "Exists", "effect": "NoSchedule"})),
    ("control-plane toleration, any effect", "robotics", pod({"key": CONTROL_PLANE, "operator": "Exists"})),
    ("control-plane toleration, Equal", "robotics", pod({"key": CONTROL_PLANE, "operator": "Equal", "value": ""})),
    # The wildcard tolerates every taint.
    ("wildcard", "default", pod({"operator": "Exists"})),
    ("wildcard from a team", "robotics", pod(team("robotics"), {"operator": "Exists"})),
    ("wildcard NoSchedule", "robotics", pod({"operator": "Exists", "effect": "NoSchedule"})),
    ("wildcard with an empty key", "default", pod({"key": "", "operator": "Exists", "effect": "NoSchedule"})),
    # Team taints stay the team's.
    ("another team's taint", "robotics", pod(team("vision"))),
    ("a team's taint outside the team", "default", pod(team("robotics"))),
    ("every team's taint", "robotics", pod({"key": TEAM_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"})),
    ("every team's taint, any effect", "default", pod({"key": TEAM_TAINT_KEY, "operator": "Exists"})),
]

# Rule 5 (issue 25, item 9): no node selection by labels a node's kubelet sets on itself.
def selecting(node_selector: dict | None = None, required: list | None = None, preferred: list | None = None) -> dict:
    spec = pod()
    if node_selector is not None:
        spec["nodeSelector"] = node_selector
    affinity: dict = {}
    if required is not None:
        affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": required}
    if preferred is not None:
        affinity["preferredDuringSchedulingIgnoredDuringExecution"] = preferred
    if affinity:
        spec["affinity"] = {"nodeAffinity": affinity}
    return spec


def expression(key: str, value: str) -> dict:
    return {"matchExpressions": [{"key": key, "operator": "In", "values": [value]}]}


DENIED += [
    ("nodeSelector on the kubelet-set team label", "robotics", selecting({TEAM_TAINT_KEY: "robotics"})),
    ("nodeSelector on the kubelet-set pool label", "default", selecting({policy.POOL_LABEL: "gpu-h100-robotics"})),
    ("required affinity on the kubelet-set team label", "robotics",
     selecting(required=[expression("kubernetes.io/arch", "amd64"), expression(TEAM_TAINT_KEY, "robotics")])),
    ("preferred affinity on the kubelet-set pool label", "robotics",
     selecting(preferred=[{"weight": 1, "preference": expression(policy.POOL_LABEL, "gpu-h100-robotics")}])),
]

ALLOWED = [
    ("no tolerations", "default", pod(), "CREATE"),
    ("nodeSelector on the approver's team label", "robotics",
     selecting({policy.TEAM_NODE_LABEL: "robotics"}), "CREATE"),
    ("affinity on the approver's labels and a host name", "robotics",
     selecting({"kubernetes.io/hostname": ROBOTICS_NODE},
               required=[expression(policy.POOL_NODE_LABEL, "gpu-h100-robotics")],
               preferred=[{"weight": 1, "preference": expression(policy.TEAM_NODE_LABEL, "robotics")}]), "CREATE"),
    ("a node affinity term of fields only", "default",
     selecting(required=[{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["x"]}]}]), "CREATE"),
    ("the team's own taint", "robotics", pod(team("robotics")), "CREATE"),
    ("the team's own taint, operator defaulted", "robotics",
     pod({"key": TEAM_TAINT_KEY, "value": "robotics"}), "CREATE"),
    ("GPU taint", "default", pod({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}), "CREATE"),
    ("what Kubernetes adds to every pod", "robotics",
     pod({"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
         {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
          "tolerationSeconds": 300}), "CREATE"),
    ("wildcard of NoExecute taints only", "default", pod({"operator": "Exists", "effect": "NoExecute"}), "CREATE"),
    # A pod the scheduler bound has nodeName; updating it (a new toleration,
    # an image) is fine: nodeName itself is immutable on UPDATE.
    ("update of a bound pod", "robotics", pod(team("robotics"), node_name=ROBOTICS_NODE), "UPDATE"),
    ("an empty nodeName", "default", pod(node_name=""), "CREATE"),
    # Node agents and the kubelet's mirror pods.
    ("node agents in kube-system", "kube-system", pod({"operator": "Exists"}, node_name=ROBOTICS_NODE), "CREATE"),
    ("control-plane toleration in kube-system", "kube-system",
     pod({"key": CONTROL_PLANE, "operator": "Exists", "effect": "NoSchedule"}), "CREATE"),
    ("exporters in corral-monitoring", "corral-monitoring", pod({"operator": "Exists"}), "CREATE"),
    ("flannel", "kube-flannel", pod({"operator": "Exists"}), "CREATE"),
]


@pytest.mark.parametrize(("why", "namespace", "spec"), DENIED, ids=[c[0] for c in DENIED])
def test_placement_policy_closes_every_bypass(why, namespace, spec):
    allowed, messages = admit(JAGUAR, namespace, spec)
    assert not allowed, why
    assert all(namespace in m for m in messages), messages


@pytest.mark.parametrize(("why", "namespace", "spec", "operation"), ALLOWED, ids=[c[0] for c in ALLOWED])
def test_placement_policy_admits_what_must_run(why, namespace, spec, operation):
    allowed, messages = admit(JAGUAR, namespace, spec, operation)
    assert allowed, (why, messages)


def test_tolerations_added_by_an_update_are_checked_too():
    # Kubernetes lets an UPDATE add tolerations to a running pod.
    for toleration in ({"key": CONTROL_PLANE, "operator": "Exists"}, {"operator": "Exists"}, team("vision")):
        allowed, _ = admit(JAGUAR, "robotics", pod(team("robotics"), toleration, node_name=ROBOTICS_NODE), "UPDATE")
        assert not allowed, toleration


def test_denials_say_what_to_do_instead():
    _, messages = admit(JAGUAR, "default", pod(node_name=API_SERVER))
    assert messages == [
        f"pods in namespace default may not set spec.nodeName ({API_SERVER}): it skips the scheduler and "
        "every NoSchedule taint; select nodes with a nodeSelector or node affinity"
    ]
    _, messages = admit(JAGUAR, "robotics", pod(team("vision")))
    assert messages == [f"namespace robotics may not tolerate a taint of another team: only {TEAM_TAINT_KEY}=robotics:NoSchedule"]
    _, messages = admit(JAGUAR, "robotics", selecting({TEAM_TAINT_KEY: "robotics"}))
    assert messages == [
        f"pods in namespace robotics may not select nodes by {TEAM_TAINT_KEY} or {policy.POOL_LABEL}: the kubelet "
        f"of a node can set those on it; select {policy.TEAM_NODE_LABEL} or {policy.POOL_NODE_LABEL}, which only "
        "corral-node-approver sets"]


@pytest.mark.parametrize("name", NAMES)
def test_every_cluster_has_the_placement_policy_bound_with_deny(name):
    cluster = FLEET.clusters[name]
    objects = objects_of(cluster)
    vap = placement_policy(cluster)
    binding = objects[f"ValidatingAdmissionPolicyBinding/{policy.PLACEMENT_POLICY_NAME}"]
    assert binding["spec"] == {"policyName": policy.PLACEMENT_POLICY_NAME, "validationActions": ["Deny"]}
    assert vap["spec"]["failurePolicy"] == "Fail"
    rules = vap["spec"]["matchConstraints"]["resourceRules"]
    assert rules == [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": ["pods"]}]
    # Without teams too (ibis): nodeName and the control plane are closed.
    assert not admit(cluster, "default", pod(node_name=layout(cluster).api_servers[0].name))[0]
    assert not admit(cluster, "default", pod({"key": CONTROL_PLANE, "operator": "Exists"}))[0]
    assert not admit(cluster, "default", pod(team("robotics")))[0]
    assert admit(cluster, "default", pod())[0]


@pytest.mark.parametrize("name", NAMES)
def test_corrals_own_workloads_pass_the_placement_policy(name):
    cluster = FLEET.clusters[name]
    for obj in all_objects(render(cluster)):
        if obj["kind"] in WORKLOAD_KINDS:
            allowed, messages = admit(cluster, obj["metadata"]["namespace"], obj["spec"]["template"]["spec"])
            assert allowed, (object_key(obj), messages)


def test_exempt_namespaces_are_only_the_node_agent_namespaces():
    selector = placement_policy(JAGUAR)["spec"]["matchConstraints"]["namespaceSelector"]["matchExpressions"]
    assert selector == [{"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                         "values": ["kube-system", "kube-flannel", "corral-monitoring"]}]


# --- Pod Security Admission ------------------------------------------------------

PSA = "pod-security.kubernetes.io"
# What `baseline` forbids of a pod (the checks corral's workloads could hit).
BASELINE_CAPABILITIES = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                         "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}


def baseline_violations(spec: dict) -> list[str]:
    found = [f for f in ("hostNetwork", "hostPID", "hostIPC") if spec.get(f)]
    found += [f"hostPath {v['name']}" for v in spec.get("volumes", []) if "hostPath" in v]
    for container in spec.get("initContainers", []) + spec["containers"]:
        context = container.get("securityContext", {})
        if context.get("privileged"):
            found.append(f"{container['name']} privileged")
        added = set(context.get("capabilities", {}).get("add", [])) - BASELINE_CAPABILITIES
        found += [f"{container['name']} adds {cap}" for cap in sorted(added)]
        found += [f"{container['name']} hostPort" for p in container.get("ports", []) if p.get("hostPort")]
    return found


def namespaces(cluster: Cluster) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in all_objects(render(cluster)) if o["kind"] == "Namespace"}


@pytest.mark.parametrize("name", NAMES)
def test_default_and_team_namespaces_enforce_pod_security(name):
    cluster = FLEET.clusters[name]
    rendered = namespaces(cluster)
    version = f"v{cluster.kubernetes.minor}"
    wanted = {"default": "restricted", "kube-public": "restricted", "kube-node-lease": "restricted"}
    for team in cluster.scheduling.teams:
        wanted.update({ns: "baseline" for ns in team.namespaces})
    for ns, level in wanted.items():
        labels = rendered[ns]["metadata"]["labels"]
        assert labels[f"{PSA}/enforce"] == level, ns
        assert labels[f"{PSA}/enforce-version"] == version, ns
        # Users and the audit log see what keeps a pod from `restricted`.
        for mode in ("audit", "warn"):
            assert labels[f"{PSA}/{mode}"] == "restricted", (ns, mode)
            assert labels[f"{PSA}/{mode}-version"] == version, (ns, mode)


@pytest.mark.parametrize("name", NAMES)
def test_every_namespace_has_a_level_and_privileged_only_where_node_agents_need_it(name):
    cluster = FLEET.clusters[name]
    rendered = namespaces(cluster)
    assert set(policy.KUBERNETES_NAMESPACES) <= set(rendered)
    workloads = [o for o in all_objects(render(cluster)) if o["kind"] in WORKLOAD_KINDS]
    for ns, obj in rendered.items():
        labels = obj["metadata"]["labels"]
        level = labels[f"{PSA}/enforce"]
        if f"{PSA}/enforce-version" in labels or ns != policy.FLANNEL_NAMESPACE:
            assert labels[f"{PSA}/enforce-version"] == f"v{cluster.kubernetes.minor}", ns
        assert (level == "privileged") == (ns in policy.privileged_namespaces(cluster)), ns
        if level == "privileged" and ns != "kube-system":  # kube-system: kube-proxy, static pods
            needing = [object_key(w) for w in workloads if w["metadata"]["namespace"] == ns
                       and baseline_violations(w["spec"]["template"]["spec"])]
            assert needing, f"{ns} is privileged but none of its workloads needs more than baseline"
        for workload in (w for w in workloads if w["metadata"]["namespace"] == ns and level != "privileged"):
            assert baseline_violations(workload["spec"]["template"]["spec"]) == [], object_key(workload)


def test_kubernetes_own_namespaces_are_patched_never_owned():
    for addon in render(JAGUAR):
        for obj in addon.objects:
            assert not (obj["kind"] == "Namespace" and obj["metadata"]["name"] in policy.KUBERNETES_NAMESPACES)
    patches = {o["metadata"]["name"] for a in render(JAGUAR) for o in a.patches}
    assert patches == set(policy.KUBERNETES_NAMESPACES)


def test_a_team_may_not_claim_the_default_namespace(tmp_path):
    text = (EXAMPLES / "jaguar.yaml").read_text().replace("namespaces: [robotics]", "namespaces: [robotics, default]", 1)
    (tmp_path / "jaguar.yaml").write_text(text)
    # Refused at load now, with file, line and field (rules._teams, corral/model/namespaces.py); the
    # policy's own refusal: tests/manifests/test_team_namespaces.py.
    from corral.model import ValidationFailed

    with pytest.raises(ValidationFailed, match=r"scheduling\.teams\[0\]\.namespaces\[1\]: namespace 'default'"):
        load_fleet([tmp_path])


# --- least privilege of corral's identities ---------------------------------------


def cluster_roles(cluster: Cluster) -> dict[str, list[dict]]:
    return {o["metadata"]["name"]: o["rules"] for o in all_objects(render(cluster)) if o["kind"] == "ClusterRole"}


def grants(rules: list[dict], resource: str, verb: str) -> bool:
    return any(resource in r.get("resources", []) and (verb in r["verbs"] or "*" in r["verbs"]) for r in rules)


@pytest.mark.parametrize("name", NAMES)
def test_no_addon_can_read_secrets_or_use_the_kubelet_api(name):
    for role, rules in cluster_roles(FLEET.clusters[name]).items():
        for verb in ("get", "list", "watch"):
            assert not grants(rules, "secrets", verb), (role, verb)
        for verb in ("get", "create"):
            assert not grants(rules, "nodes/proxy", verb), (role, verb)
        assert not any("*" in r.get("resources", []) for r in rules), role


def ksm_args(cluster: Cluster) -> list[str]:
    deployment = objects_of(cluster)["Deployment/corral-monitoring/kube-state-metrics"]
    return deployment["spec"]["template"]["spec"]["containers"][0]["args"]


@pytest.mark.parametrize("name", NAMES)
def test_kube_state_metrics_watches_exactly_what_its_role_allows_and_no_secrets(name):
    cluster = FLEET.clusters[name]
    rules = cluster_roles(cluster)["corral-kube-state-metrics"]
    allowed = {(group, res) for r in rules for group in r["apiGroups"] for res in r["resources"]}
    assert all(r["verbs"] == ["list", "watch"] for r in rules)
    assert allowed == {(g, res) for g, names in KSM_RESOURCES.items() for res in names}
    resources = next(a for a in ksm_args(cluster) if a.startswith("--resources=")).removeprefix("--resources=")
    assert sorted(resources.split(",")) == sorted(res for _, res in allowed)
    assert "secrets" not in resources.split(",")
    # Billing needs pods and namespaces (requests, the team label) and nodes.
    assert {"pods", "namespaces", "nodes"} <= set(resources.split(","))


@pytest.mark.parametrize("name", NAMES)
def test_prometheus_scrapes_kubelets_directly_with_the_cluster_ca(name):
    from ruamel.yaml import YAML

    cluster = FLEET.clusters[name]
    objects = objects_of(cluster)
    rules = cluster_roles(cluster)["corral-prometheus"]
    assert grants(rules, "nodes/metrics", "get") and grants(rules, "nodes", "list")
    files = objects["ConfigMap/corral-monitoring/prometheus-config"]["data"]
    config = YAML(typ="safe", pure=True).load(files["prometheus-shard-0.yml"])
    kubelet = next(j for j in config["scrape_configs"] if j["job_name"] == "kubelet-cadvisor")
    assert kubelet["scheme"] == "https" and kubelet["metrics_path"] == "/metrics/cadvisor"
    # Its node watch's selector (the shard's own nodes): tests/manifests/test_monitoring_discovery.py.
    assert [sd["role"] for sd in kubelet["kubernetes_sd_configs"]] == ["node"]
    # The node's own address and kubelet port, verified against the cluster CA.
    assert kubelet["tls_config"] == {"ca_file": "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"}
    assert not any(r.get("target_label") in ("__address__", "__metrics_path__") for r in kubelet["relabel_configs"])
    assert not any("/proxy" in text for text in files.values())


# --- kubelet serving certificates ---------------------------------------------------


def kubeadm_init_documents(cluster: Cluster) -> dict[str, dict]:
    from ruamel.yaml import YAML

    from corral.machine.api_server import render_kubeadm_init_config
    from corral.machine.kubeadm import JoinToken

    token = "abcdef.0123456789abcdef"
    text = render_kubeadm_init_config(cluster, layout(cluster), [JoinToken(token, "test")])
    return {d["kind"]: d for d in YAML(typ="safe", pure=True).load_all(text) if d}


@pytest.mark.parametrize("name", NAMES)
def test_kubelets_get_serving_certificates_the_api_server_verifies(name):
    docs = kubeadm_init_documents(FLEET.clusters[name])
    # Every node gets this KubeletConfiguration (kubeadm's kubelet-config ConfigMap).
    assert docs["KubeletConfiguration"]["serverTLSBootstrap"] is True
    extra = docs["ClusterConfiguration"]["apiServer"]["extraArgs"]
    flags = {a["name"]: a["value"] for a in extra} if isinstance(extra, list) else extra  # v1beta4 / v1beta3
    assert flags["kubelet-certificate-authority"] == "/etc/kubernetes/pki/ca.crt"


def approver(cluster: Cluster) -> tuple[dict, dict[str, str]]:
    deployment = objects_of(cluster)["Deployment/kube-system/kubelet-csr-approver"]
    spec = deployment["spec"]["template"]["spec"]
    args = dict(a.removeprefix("--").split("=", 1) for a in spec["containers"][0]["args"])
    return spec, args


@pytest.mark.parametrize("name", NAMES)
def test_the_csr_approver_may_approve_only_kubelet_serving_certificates(name):
    cluster = FLEET.clusters[name]
    rules = cluster_roles(cluster)["corral:kubelet-csr-approver"]
    assert rules == [
        {"apiGroups": ["certificates.k8s.io"], "resources": ["certificatesigningrequests"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["certificates.k8s.io"], "resources": ["certificatesigningrequests/approval"], "verbs": ["update"]},
        {"apiGroups": ["certificates.k8s.io"], "resources": ["signers"], "resourceNames": ["kubernetes.io/kubelet-serving"],
         "verbs": ["approve"]},
    ]
    spec, _ = approver(cluster)
    assert baseline_violations(spec) == []
    container = spec["containers"][0]
    # It would pass `restricted`, though kube-system does not ask for it.
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}}
    assert ":" in container["image"].rsplit("/", 1)[-1]


def node_names(cluster: Cluster) -> list[str]:
    """Names the approver's nodes of `cluster` register with, one or more per kind of node
    (not the API servers: each approves its own, tests/certs/test_own_serving_csr.py)."""
    names: list[str] = []
    for pool in cluster.onprem_pools:
        names += pool.host_names + [h.split(".")[0] for h in pool.host_names]
    groups = policy.autoscaler_node_groups(cluster)
    for pool in cluster.cloud_pools:
        mine = [g.name for g in groups if g.pool == pool.name]
        if pool.provider == "azure":  # scale set computer names
            names += [f"{group}-00003f" for group in mine]
        elif pool.provider == "gcp":  # MIG instance names
            names += [f"{group}-x7k2" for group in mine]
        else:
            names += ["ip-10-201-8-4", f"ip-10-201-8-4.{cluster.control_plane.region}.compute.internal"]
    return names


@pytest.mark.parametrize("name", NAMES)
def test_the_csr_approver_accepts_this_clusters_node_names_only(name):
    cluster = FLEET.clusters[name]
    _, args = approver(cluster)
    regex = re.compile(args["provider-regex"])  # RE2 syntax, the subset Python shares
    for node in node_names(cluster):
        assert regex.match(node), node
    others = [n for other in NAMES if other != name for n in node_names(FLEET.clusters[other])]
    strangers = [
        "kubernetes", "kubernetes.default.svc", "localhost", layout(cluster).api_servers[0].name,
        f"{layout(cluster).api_servers[0].name}.attacker.example", f"x{layout(cluster).api_servers[0].name}",
        f"{cluster.name}-apiserver-99x", f"{cluster.name}-etcd-0", "gpu-001.attacker.internal", "ip-10-0-0-1.attacker.example",
    ]
    for stranger in strangers + [n for n in others if not n.startswith("ip-")]:
        assert not regex.match(stranger), stranger
    assert args["bypass-dns-resolution"] == "true" and args["allowed-dns-names"] == "1"


@pytest.mark.parametrize("name", NAMES)
def test_the_csr_approver_signs_node_addresses_only_never_the_api_servers_or_etcd(name):
    cluster = FLEET.clusters[name]
    _, args = approver(cluster)
    prefixes = [ipaddress.ip_network(p) for p in args["provider-ip-prefixes"].split(",")]

    def allowed(ip: str) -> bool:
        return any(ipaddress.ip_address(ip) in p for p in prefixes)

    lay = layout(cluster)
    # An API server's address in any node's request would be a certificate
    # for the API server (issue 25, item 12): each API server approves its own.
    for server in lay.api_servers:
        assert not allowed(server.ip), server.name
    if cluster.cloud_pools:
        for zone in lay.zones:
            assert allowed(str(next(ipaddress.ip_network(zone.node_subnet).hosts()))), zone.zone
    for site in cluster.sites:
        if any(p.site == site.name for p in cluster.onprem_pools):
            assert allowed(str(next(ipaddress.ip_network(str(site.cidrs[0])).hosts()))), site.name
    for member in lay.etcd_members + lay.events_members:
        assert not allowed(member.ip), member.name
    assert not allowed(lay.api_vip)
    assert not allowed("8.8.8.8") and not allowed(str(ipaddress.ip_network(cluster.kubernetes.service_cidr)[1]))


@pytest.mark.parametrize(("pattern", "matches", "refused"), [
    ("r[1:2]-gpu[01:16].dc[1:3].internal",
     ["r2-gpu07.dc3.internal", "r1-gpu16", "r2-gpu99.dc1.internal"],  # the regex knows widths, not bounds
     ["r2-gpu7.dc3.internal", "r2-gpu07.dc3.internal.attacker.example", "r2-gpu07.dcx.internal", "r2-gpu07.", "gpu07"]),
    ("cpu[1:20]", ["cpu1", "cpu20", "cpu007"], ["cpu", "cpu1.anything", "xcpu1"]),
])
def test_host_patterns_become_anchored_name_patterns(pattern, matches, refused):
    regex = re.compile("^(" + policy._host_pattern_regex(pattern) + ")$")
    for name in matches:
        assert regex.match(name), name
    for name in refused:
        assert not regex.match(name), name


# --- node identity: pool tokens and corral-node-approver (issue 25, items 4 and 9) ----------------

KUBEADM_DEFAULT_GROUP = "system:bootstrappers:kubeadm:default-node-token"
# The ClusterRole kubeadm's `kubeadm:node-autoapprove-bootstrap` binds: with it,
# kube-controller-manager approves a kubelet client request for any node name.
AUTO_APPROVE_ROLE = "system:certificates.k8s.io:certificatesigningrequests:nodeclient"


def subjects_of(obj: dict) -> set[str]:
    return {s["name"] for s in obj.get("subjects") or []}


@pytest.mark.parametrize("name", NAMES)
def test_pool_groups_get_kubeadm_joins_rights_and_never_auto_approval(name):
    from corral.nodes.join import pool_token_group

    cluster = FLEET.clusters[name]
    groups = {pool_token_group(p.name) for p in cluster.node_pools}
    assert KUBEADM_DEFAULT_GROUP not in groups
    bindings = {o["roleRef"]["name"]: o for o in objects_of(cluster).values()
                if o["kind"] in ("ClusterRoleBinding", "RoleBinding") and subjects_of(o) & groups}
    # Exactly what `kubeadm join` uses: post and read its CSR, look for a node of its name,
    # read kubeadm-config and kubelet-config (kube-system Roles kubeadm creates).
    assert sorted(bindings) == ["kubeadm:get-nodes", "kubeadm:kubelet-config", "kubeadm:nodes-kubeadm-config",
                                "system:node-bootstrapper"]
    for role, binding in bindings.items():
        assert subjects_of(binding) == groups, role
        assert binding["kind"] == ("RoleBinding" if role.startswith("kubeadm:n") or role == "kubeadm:kubelet-config"
                                   else "ClusterRoleBinding")
    for obj in objects_of(cluster).values():
        if obj["kind"] in ("ClusterRoleBinding", "RoleBinding") and obj["roleRef"]["name"] in (AUTO_APPROVE_ROLE,
                                                                                              "cluster-admin"):
            assert not subjects_of(obj) & groups, object_key(obj)


def test_pool_tokens_are_never_in_kubeadms_default_group():
    from datetime import timedelta

    from corral.infra.addons import bootstrap_token_secret, token_group
    from corral.nodes.join import new_bootstrap_token, onprem_token_groups

    assert token_group("apiservers") == KUBEADM_DEFAULT_GROUP   # the API servers join as control plane
    secret = bootstrap_token_secret("abcdef.0123456789abcdef", "d", "2026-11-25T00:00:00Z", token_group("pool-gpu-a10g"))
    assert secret["string_data"]["auth-extra-groups"] == "system:bootstrappers:corral:pool:gpu-a10g"
    with pytest.raises(ValueError, match="expected 'apiservers' or 'pool-<pool>'"):
        token_group("gpu-a10g")
    hosts = [JAGUAR.pool("gpu-h100-sf1").host_names[0], JAGUAR.pool("gpu-h100-robotics").host_names[0]]
    groups = onprem_token_groups(JAGUAR, hosts)
    assert groups == ("system:bootstrappers:corral:pool:gpu-h100-robotics", "system:bootstrappers:corral:pool:gpu-h100-sf1")
    manifest = new_bootstrap_token(timedelta(hours=1)).manifest("corral join jaguar", groups)
    assert manifest["stringData"]["auth-extra-groups"] == ",".join(groups)
    # Every group fits the bootstrap token authenticator's pattern (k8s.io/cluster-bootstrap
    # token/api/types.go BootstrapGroupPattern); a group that does not invalidates the token.
    pattern = re.compile(r"system:bootstrappers:[a-z0-9:-]{0,255}[a-z0-9]\Z")
    for cluster in FLEET.clusters.values():
        for pool in cluster.node_pools:
            assert pattern.match(token_group(f"pool-{pool.name}")), pool.name


@pytest.mark.parametrize("name", NAMES)
def test_the_node_approver_may_approve_only_kubelet_client_certificates(name):
    objects = objects_of(FLEET.clusters[name])
    role = objects["ClusterRole/corral:corral-node-approver"]
    assert role["rules"] == [
        {"apiGroups": ["certificates.k8s.io"], "resources": ["certificatesigningrequests"],
         "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["certificates.k8s.io"], "resources": ["certificatesigningrequests/approval"],
         "verbs": ["update"]},
        {"apiGroups": ["certificates.k8s.io"], "resources": ["signers"],
         "resourceNames": ["kubernetes.io/kube-apiserver-client-kubelet"], "verbs": ["approve"]},
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]},
    ]
    deployment = objects["Deployment/kube-system/corral-node-approver"]
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"] == {"type": "Recreate"}
    pod_spec = deployment["spec"]["template"]["spec"]
    assert pod_spec["affinity"] == policy.autoscaler_affinity()   # the API servers only
    assert pod_spec["securityContext"]["runAsNonRoot"] is True
    container = pod_spec["containers"][0]["securityContext"]
    assert container == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                         "capabilities": {"drop": ["ALL"]}}
    # The host's network, for the API servers' metadata service (their cloud identity asks
    # the cloud about a cloud pool's instance: issue 25, item 4); it listens on no port.
    assert pod_spec["hostNetwork"] is True and pod_spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert "ports" not in pod_spec["containers"][0] and "automountServiceAccountToken" not in pod_spec


def approver_admits(old: dict, new: dict, username: str = "system:serviceaccount:kube-system:corral-node-approver"):
    vap = objects_of(JAGUAR)["ValidatingAdmissionPolicy/corral-node-approver"]["spec"]
    assert vap["failurePolicy"] == "Fail"
    assert objects_of(JAGUAR)["ValidatingAdmissionPolicyBinding/corral-node-approver"]["spec"] == {
        "policyName": "corral-node-approver", "validationActions": ["Deny"]}
    return evaluate_policy(vap, object=new, oldObject=old,
                           request={"operation": "UPDATE", "userInfo": {"username": username}})


NODE = {"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": ROBOTICS_NODE, "labels": {"corral.dev/pool": "gpu-h100-robotics"},
                     "annotations": {"a": "b"}},
        "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]}}


def node_with(labels: dict | None = None, annotations: dict | None = None, **spec) -> dict:
    """NODE with labels added, annotations replaced, spec fields set."""
    import copy

    node = copy.deepcopy(NODE)
    node["metadata"]["labels"].update(labels or {})
    if annotations is not None:
        node["metadata"]["annotations"] = annotations
    node["spec"].update(spec)
    return node


def test_the_node_approver_may_change_only_its_three_labels():
    from corral.manifests.monitoring import SHARD_NODE_LABEL

    labelled = node_with(labels={policy.POOL_NODE_LABEL: "gpu-h100-robotics", policy.TEAM_NODE_LABEL: "robotics",
                                 SHARD_NODE_LABEL: "3"})
    assert approver_admits(NODE, labelled) == (True, [])
    assert approver_admits(labelled, NODE) == (True, [])   # and remove them
    # The monitoring shard alone (an API server's, a node of no pool), and moved to another shard.
    assert approver_admits(NODE, node_with(labels={SHARD_NODE_LABEL: "0"})) == (True, [])
    assert approver_admits(labelled, node_with(labels={**labelled["metadata"]["labels"], SHARD_NODE_LABEL: "1"})) \
        == (True, [])
    for edit in ({"labels": {"corral.dev/pool": "other"}}, {"labels": {"kubernetes.io/hostname": "x"}},
                 {"labels": {SHARD_NODE_LABEL: "1", "corral.dev/monitoring-shard": "1"}},
                 {"labels": {"node-restriction.kubernetes.io/corral-other": "1"}},
                 {"annotations": {}}, {"taints": []}, {"unschedulable": True},
                 {"providerID": "aws:///us-east-1a/i-0"}):
        allowed, messages = approver_admits(NODE, node_with(**edit))
        assert not allowed and all("corral-node-approver may" in m for m in messages), (edit, messages)
    # Nobody else is held by it.
    assert approver_admits(NODE, node_with(taints=[]), username="kubernetes-admin") == (True, [])
