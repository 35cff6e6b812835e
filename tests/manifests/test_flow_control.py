"""API Priority and Fairness (issue 28, item 3): who lands in which priority level.

`classify` evaluates FlowSchemas as kube-apiserver does (the APF design,
kubernetes/enhancements keps/sig-api-machinery/1040-priority-and-fairness, and
staging/src/k8s.io/apiserver/pkg/util/flowcontrol/rule.go): a schema matches a
request when one of its rules has a matching subject and a matching resource
or non-resource rule; of the matching schemas the one with the lowest
matchingPrecedence wins, ties broken by name. The built-in schemas are
Kubernetes' own (BUILTIN below, from bootstrap/default.go), so the tests see
corral's schemas among everything the API server really has.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from corral.manifests import all_objects, policy, render
from corral.manifests import flow_control
from corral.manifests.validate import validate_objects
from corral.model import Cluster, load_fleet
from corral.model.control_plane_sizing import seats_for_share, size

ROOT = Path(__file__).resolve().parents[2]
FLEET = load_fleet([ROOT / "clusters"])
NAMES = sorted(FLEET.clusters)


@dataclass(frozen=True)
class Request:
    user: str
    groups: tuple[str, ...]
    verb: str
    api_group: str = ""
    resource: str = ""
    namespace: str = ""          # "" for cluster-scoped
    path: str = ""               # non-resource requests
    resource_request: bool = True


def service_account(namespace: str, name: str, verb: str, resource: str, api_group: str = "",
                    request_namespace: str = "") -> Request:
    return Request(
        f"system:serviceaccount:{namespace}:{name}",
        ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"),
        verb, api_group, resource, request_namespace,
    )


# --- Kubernetes' built-in FlowSchemas -----------------------------------------------

ALL_RESOURCES = {"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"], "namespaces": ["*"], "clusterScope": True}
ALL_NON_RESOURCES = {"verbs": ["*"], "nonResourceURLs": ["*"]}
KUBE_SYSTEM_ACCOUNTS = {"kind": "ServiceAccount", "serviceAccount": {"namespace": "kube-system", "name": "*"}}


def group(name: str) -> dict:
    return {"kind": "Group", "group": {"name": name}}


def user(name: str) -> dict:
    return {"kind": "User", "user": {"name": name}}


def schema(name: str, level: str, precedence: int, subjects: list[dict], resource_rules: list[dict],
           non_resource_rules: list[dict] | None = None) -> dict:
    rule = {"subjects": subjects, "resourceRules": resource_rules}
    if non_resource_rules:
        rule["nonResourceRules"] = non_resource_rules
    return {"kind": "FlowSchema", "metadata": {"name": name},
            "spec": {"matchingPrecedence": precedence, "priorityLevelConfiguration": {"name": level}, "rules": [rule]}}


def leader_election_rules(configmap_namespaces: list[str]) -> list[dict]:
    return [
        {"verbs": ["get", "create", "update"], "apiGroups": [""], "resources": ["endpoints", "configmaps"],
         "namespaces": configmap_namespaces},
        {"verbs": ["get", "create", "update"], "apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
         "namespaces": ["*"]},
    ]


# kubernetes/kubernetes staging/src/k8s.io/apiserver/pkg/apis/flowcontrol/bootstrap/default.go
# (the v1beta3 objects, which v1 keeps): name, level, matchingPrecedence, subjects, rules.
BUILTIN = [
    schema("exempt", "exempt", 1, [group("system:masters")], [ALL_RESOURCES], [ALL_NON_RESOURCES]),
    schema("probes", "exempt", 2, [group("system:unauthenticated"), group("system:authenticated")], [],
           [{"verbs": ["get"], "nonResourceURLs": ["/healthz", "/readyz", "/livez"]}]),
    schema("system-leader-election", "leader-election", 100,
           [user("system:kube-controller-manager"), user("system:kube-scheduler"), KUBE_SYSTEM_ACCOUNTS],
           [leader_election_rules(["kube-system"])[1]]),
    schema("endpoint-controller", "workload-high", 150,
           [user("system:kube-controller-manager"),
            {"kind": "ServiceAccount", "serviceAccount": {"namespace": "kube-system", "name": "endpoint-controller"}}],
           [{"verbs": ["get", "create", "update"], "apiGroups": [""], "resources": ["endpoints"], "namespaces": ["*"]}]),
    schema("workload-leader-election", "leader-election", 200, [KUBE_SYSTEM_ACCOUNTS], leader_election_rules(["*"])),
    schema("system-node-high", "node-high", 400, [group("system:nodes")], [
        {"verbs": ["*"], "apiGroups": [""], "resources": ["nodes", "nodes/status"], "namespaces": ["*"],
         "clusterScope": True},
        {"verbs": ["*"], "apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "namespaces": ["*"]},
    ]),
    schema("system-nodes", "system", 500, [group("system:nodes")], [ALL_RESOURCES], [ALL_NON_RESOURCES]),
    schema("kube-controller-manager", "workload-high", 800, [user("system:kube-controller-manager")],
           [ALL_RESOURCES], [ALL_NON_RESOURCES]),
    schema("kube-scheduler", "workload-high", 800, [user("system:kube-scheduler")], [ALL_RESOURCES],
           [ALL_NON_RESOURCES]),
    schema("kube-system-service-accounts", "workload-high", 900, [KUBE_SYSTEM_ACCOUNTS], [ALL_RESOURCES],
           [ALL_NON_RESOURCES]),
    schema("service-accounts", "workload-low", 9000, [group("system:serviceaccounts")], [ALL_RESOURCES],
           [ALL_NON_RESOURCES]),
    schema("global-default", "global-default", 9900, [group("system:unauthenticated"), group("system:authenticated")],
           [ALL_RESOURCES], [ALL_NON_RESOURCES]),
    schema("catch-all", "catch-all", 10000, [group("system:unauthenticated"), group("system:authenticated")],
           [ALL_RESOURCES], [ALL_NON_RESOURCES]),
]


# --- the matcher ----------------------------------------------------------------


def subject_matches(subject: dict, request: Request) -> bool:
    kind = subject["kind"]
    if kind == "User":
        return subject["user"]["name"] in ("*", request.user)
    if kind == "Group":
        return subject["group"]["name"] == "*" or subject["group"]["name"] in request.groups
    account = subject["serviceAccount"]
    prefix = f"system:serviceaccount:{account['namespace']}:"
    return request.user.startswith(prefix) and account["name"] in ("*", request.user[len(prefix):])


def resource_rule_matches(rule: dict, request: Request) -> bool:
    if not request.resource_request:
        return False
    if not (set(rule["verbs"]) & {"*", request.verb} and set(rule["apiGroups"]) & {"*", request.api_group}
            and set(rule["resources"]) & {"*", request.resource}):
        return False
    if request.namespace:
        return bool(set(rule.get("namespaces", [])) & {"*", request.namespace})
    return bool(rule.get("clusterScope", False))


def non_resource_rule_matches(rule: dict, request: Request) -> bool:
    if request.resource_request or not set(rule["verbs"]) & {"*", request.verb}:
        return False
    for url in rule["nonResourceURLs"]:
        if url == "*" or url == request.path or (url.endswith("/*") and request.path.startswith(url[:-1])):
            return True
    return False


def schema_matches(flow_schema: dict, request: Request) -> bool:
    for rule in flow_schema["spec"]["rules"]:
        if not any(subject_matches(s, request) for s in rule["subjects"]):
            continue
        if any(resource_rule_matches(r, request) for r in rule.get("resourceRules", [])):
            return True
        if any(non_resource_rule_matches(r, request) for r in rule.get("nonResourceRules", [])):
            return True
    return False


def classify(schemas: list[dict], request: Request) -> tuple[str, str]:
    """(FlowSchema, priority level) the API server puts `request` in."""
    matching = [s for s in schemas if schema_matches(s, request)]
    winner = min(matching, key=lambda s: (s["spec"]["matchingPrecedence"], s["metadata"]["name"]))
    return winner["metadata"]["name"], winner["spec"]["priorityLevelConfiguration"]["name"]


def corral_schemas(cluster: Cluster) -> list[dict]:
    return [o for o in all_objects(render(cluster)) if o["kind"] == "FlowSchema"]


def rendered_service_accounts(cluster: Cluster) -> list[tuple[str, str]]:
    return [(o["metadata"]["namespace"], o["metadata"]["name"])
            for o in all_objects(render(cluster)) if o["kind"] == "ServiceAccount"]


# What corral's service accounts do: read and watch nodes and pods, write node
# status and events, list CSRs. (Leader election is separate, below.)
TYPICAL = [
    ("list", "", "nodes", ""), ("watch", "", "pods", ""), ("get", "", "nodes", ""),
    ("patch", "", "nodes", ""), ("patch", "", "nodes/status", ""), ("create", "", "events", "kube-system"),
    ("list", "certificates.k8s.io", "certificatesigningrequests", ""), ("list", "", "pods", "corral-monitoring"),
]


# --- tests ------------------------------------------------------------------------


def test_the_matcher_reproduces_kubernetes_classification_without_corral():
    # Before corral's schemas: a kube-system agent shares workload-high with the
    # controllers, other service accounts fall to workload-low.
    agent = service_account("kube-system", "corral-gpu-health", "watch", "nodes")
    assert classify(BUILTIN, agent) == ("kube-system-service-accounts", "workload-high")
    assert classify(BUILTIN, service_account("corral-monitoring", "prometheus", "list", "nodes")) == \
        ("service-accounts", "workload-low")
    kubelet = Request("system:node:gpu-001", ("system:nodes", "system:authenticated"), "patch", "", "nodes/status")
    assert classify(BUILTIN, kubelet) == ("system-node-high", "node-high")
    probe = Request("x", ("system:authenticated",), "get", path="/readyz", resource_request=False)
    assert classify(BUILTIN, probe) == ("probes", "exempt")


@pytest.mark.parametrize("name", NAMES)
def test_every_service_account_corral_deploys_lands_in_a_corral_level(name):
    cluster = FLEET.clusters[name]
    schemas = BUILTIN + corral_schemas(cluster)
    corral_levels = {level.name for level in flow_control.levels(cluster)}
    accounts = rendered_service_accounts(cluster)
    assert ("kube-system", "corral-gpu-health") in accounts and ("kube-system", "corral-node-approver") in accounts
    for namespace, account in accounts:
        for verb, api_group, resource, request_namespace in TYPICAL:
            request = service_account(namespace, account, verb, resource, api_group, request_namespace)
            flow_schema, level = classify(schemas, request)
            assert level in corral_levels, f"{namespace}/{account} {verb} {resource} lands in {flow_schema} ({level})"


@pytest.mark.parametrize("name", NAMES)
def test_leader_election_and_the_control_plane_keep_their_builtin_levels(name):
    cluster = FLEET.clusters[name]
    schemas = BUILTIN + corral_schemas(cluster)
    for namespace, account in rendered_service_accounts(cluster):
        for verb in ("get", "update", "create"):
            lease = service_account(namespace, account, verb, "leases", "coordination.k8s.io", "kube-system")
            if namespace == "kube-system":
                # The autoscaler's and the approvers' leases renew in leader-election, flood or not.
                assert classify(schemas, lease)[1] == "leader-election", (namespace, account)
            else:
                assert classify(schemas, lease)[1].startswith("corral-")
    masters = Request("kubernetes-admin", ("system:masters", "system:authenticated"), "list", "", "nodes")
    assert classify(schemas, masters) == ("exempt", "exempt")
    for controller in ("system:kube-controller-manager", "system:kube-scheduler"):
        lease = Request(controller, ("system:authenticated",), "update", "coordination.k8s.io", "leases", "kube-system")
        assert classify(schemas, lease) == ("system-leader-election", "leader-election")
        work = Request(controller, ("system:authenticated",), "list", "", "pods")
        assert classify(schemas, work)[1] == "workload-high"
    other = service_account("kube-system", "replicaset-controller", "update", "replicasets", "apps", "team-a")
    assert classify(schemas, other) == ("kube-system-service-accounts", "workload-high")
    kubelet = Request("system:node:gpu-001", ("system:nodes", "system:authenticated"), "update",
                      "coordination.k8s.io", "leases", "kube-node-lease")
    assert classify(schemas, kubelet) == ("system-node-high", "node-high")


@pytest.mark.parametrize("name", NAMES)
def test_corral_schemas_name_only_service_accounts_and_sit_between_leader_election_and_the_catch_alls(name):
    for flow_schema in corral_schemas(FLEET.clusters[name]):
        precedence = flow_schema["spec"]["matchingPrecedence"]
        assert flow_control.LEADER_ELECTION_PRECEDENCE < precedence < flow_control.KUBE_SYSTEM_ACCOUNTS_PRECEDENCE
        for rule in flow_schema["spec"]["rules"]:
            for subject in rule["subjects"]:
                assert subject["kind"] == "ServiceAccount" and subject["serviceAccount"]["name"] != "*"


def big(tmp_path: Path, hosts: int) -> Cluster:
    text = (ROOT / "clusters" / "jaguar.yaml").read_text()
    text = text.replace('hosts: ["gpu-[001:064].sf1.internal"]', f'hosts: ["gpu-[00001:{hosts:05d}].sf1.internal"]')
    text = text.replace('\n    racks: ["sf1-r[01:08]"]', "")  # its 8 racks would not divide the grown pool
    text = text.replace("podCIDR: 10.128.0.0/14", "podCIDR: 10.128.0.0/11")
    (tmp_path / "jaguar.yaml").write_text(text)
    return load_fleet([tmp_path]).clusters["jaguar"]


def levels_of(cluster: Cluster) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in all_objects(render(cluster)) if o["kind"] == "PriorityLevelConfiguration"}


@pytest.mark.parametrize("hosts", [64, 7_300])
def test_each_level_gets_the_seats_it_needs_beside_the_builtin_levels_and_borrows_none(tmp_path, hosts):
    cluster = big(tmp_path, hosts)
    server = size(cluster).server_concurrency
    levels = levels_of(cluster)
    all_shares = sum(flow_control.BUILTIN_SHARES.values()) + sum(
        level["spec"]["limited"]["nominalConcurrencyShares"] for level in levels.values())
    for level in flow_control.levels(cluster):
        spec = levels[level.name]["spec"]["limited"]
        seats = seats_for_share(spec["nominalConcurrencyShares"], all_shares, server)
        # At least what it needs; at most one share's worth more (shares are whole numbers).
        assert level.seats <= seats <= level.seats + server / all_shares + 1, (level.name, level.seats, seats)
        assert spec["borrowingLimitPercent"] == 0
    nodes_level = next(level for level in flow_control.levels(cluster) if level.name == "corral-nodes")
    # One seat per 100 nodes (at least 10): 75 at 7,500 nodes hold the agent's 100 requests/s burst.
    assert nodes_level.seats == max(10, -(-cluster.node_capacity // 100))
    if hosts > 7_000:
        # 7,508 nodes: 76 seats of the 2,000 a 32-vCPU API server is capped at.
        assert nodes_level.seats == 76 and server == 2_000


def test_the_queue_holds_a_tenth_of_the_nodes_per_flow():
    assert flow_control.queue_length(300) == 50
    assert flow_control.queue_length(7_500) == 188
    assert flow_control.queue_length(100_000) == 1_000


@pytest.mark.parametrize("name", NAMES)
def test_the_levels_and_schemas_validate_against_the_cluster_kubernetes_schemas(name):
    cluster = FLEET.clusters[name]
    addon = next(a for a in render(cluster) if a.name == "flow-control")
    assert {o["kind"] for o in addon.objects} == {"FlowSchema", "PriorityLevelConfiguration"}
    version, problems = validate_objects(list(addon.objects), cluster.kubernetes.version)
    assert version.used == cluster.kubernetes.minor and problems == []


def test_a_kubernetes_without_flowcontrol_v1_is_refused_naming_the_field():
    cluster = FLEET.clusters["heron"].model_copy(deep=True)
    cluster.kubernetes.version = "1.28.9"
    with pytest.raises(policy.ManifestError, match=r"heron.yaml: kubernetes.version 1.28.9: .*flowcontrol.apiserver.k8s.io/v1.*1.29"):
        flow_control.context(cluster)


def test_more_seats_than_half_the_server_is_refused():
    with pytest.raises(policy.ManifestError, match="machineType"):
        flow_control.shares([200, 100, 10], 600)
