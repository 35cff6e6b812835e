"""Monitoring isolated by NetworkPolicy, and the engine that enforces it.

The rendered policies are evaluated with NetworkPolicy's own semantics
(tests/network_policy.py) against the rendered pods' labels: a team's pod -
even one that copies Prometheus' labels - reaches none of the monitoring
services, while every connection the scrape configs and Grafana's datasources
make inside corral-monitoring is admitted. Whether kube-network-policies
enforces them on a node is not tested here (no container runtime, no image
pulls from this machine): docs/addons.md, "NetworkPolicy", says what is taken
from its source and what is assumed.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
import yaml

from corral.manifests import monitoring, network_policy, policy, versions
from corral.manifests.render import all_objects, render
from corral.manifests.validate import validate_objects
from corral.model.loader import load_fleet
from corral.model.schema import TEAM_TAINT_KEY
from tests.network_policy import Pod, admits, isolating_policies, selects, selector_matches

from .test_monitoring import EXAMPLES

FLEET = load_fleet([EXAMPLES])
NAMES = sorted(FLEET.clusters)
NS = policy.MONITORING_NAMESPACE
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet")


class Rendered:
    """One cluster's monitoring add-on: its policies, pods (by workload) and Services."""

    def __init__(self, name: str):
        self.cluster = FLEET.clusters[name]
        self.addons = {a.name: a for a in render(self.cluster)}
        objects = self.addons["monitoring"].objects
        self.policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
        self.pods: dict[str, Pod] = {}
        for obj in objects:
            if obj["kind"] in WORKLOADS:
                spec = obj["spec"]["template"]["spec"]
                ports = {p["name"]: p["containerPort"] for c in spec["containers"] for p in c.get("ports", [])
                         if "name" in p}
                self.pods[obj["metadata"]["name"]] = Pod(
                    NS, dict(obj["spec"]["template"]["metadata"]["labels"]), named_ports=ports,
                    host_network=spec.get("hostNetwork", False))
        self.services = {o["metadata"]["name"]: o["spec"]["selector"] for o in objects if o["kind"] == "Service"}
        self.files = next(o for o in objects if o["kind"] == "ConfigMap"
                          and o["metadata"]["name"] == "prometheus-config")["data"]
        self.datasources = yaml.safe_load(next(
            o for o in objects if o["metadata"]["name"] == "grafana-datasources")["data"]["datasources.yaml"])

    def container_ports(self, workload: str) -> set[int]:
        return set(self.pods[workload].named_ports.values())

    def behind(self, service: str) -> list[str]:
        """The workloads whose pods a Service selects."""
        selector = self.services[service]
        return [w for w, pod in self.pods.items() if all(pod.labels.get(k) == v for k, v in selector.items())]

    def gpu(self) -> bool:
        return "dcgm-exporter" in self.pods


@pytest.fixture(scope="module", params=NAMES)
def rendered(request) -> Rendered:
    return Rendered(request.param)


def team_pods(rendered: Rendered) -> list[Pod]:
    """A team's pod as teams run them, and one that copies each monitoring pod's labels."""
    teams = rendered.cluster.scheduling.teams
    team, namespace = (teams[0].name, teams[0].namespaces[0]) if teams else ("a", "team-a")
    ns_labels = {TEAM_TAINT_KEY: team}
    pods = [Pod(namespace, {"app": "trainer"}, namespace_labels=ns_labels, node="node-b")]
    pods += [Pod(namespace, dict(p.labels), namespace_labels=ns_labels, node="node-b")
             for p in rendered.pods.values()]
    # A pod in a namespace without a team (default), on another node.
    pods.append(Pod("default", {"run": "curl"}, node="node-b"))
    return pods


def test_a_team_pod_reaches_no_monitoring_service(rendered):
    for workload, target in rendered.pods.items():
        if target.host_network:
            continue
        for port in rendered.container_ports(workload):
            for source in team_pods(rendered):
                assert not admits(rendered.policies, source, target, port), (
                    f"{source.namespace}/{source.labels} reaches {workload}:{port}")


def _target(url_or_address: str) -> tuple[str, int]:
    """(service, port) of `http://svc.ns.svc:port` or `svc.ns.svc:port`."""
    parts = urlsplit(url_or_address if "//" in url_or_address else f"//{url_or_address}")
    service, namespace = parts.hostname.split(".")[:2]
    assert namespace == NS
    return service, parts.port


def monitoring_connections(rendered: Rendered) -> list[tuple[str, str, int]]:
    """(source workload, destination workload, port): every connection the rendered
    configurations open inside corral-monitoring."""
    connections = []
    global_config = yaml.safe_load(rendered.files["prometheus.yml"])
    for job in global_config["scrape_configs"]:
        for static in job.get("static_configs", []):
            for address in static["targets"]:
                # Targets in other namespaces (Kueue's metrics in kueue-system) are not connections
                # inside corral-monitoring: its policies govern only what comes into its own pods.
                if ".svc:" in address and address.split(".")[1] == NS:
                    service, port = _target(address)
                    connections += [(monitoring.GLOBAL_NAME, w, port) for w in rendered.behind(service)]
    for i in range(monitoring.shard_count(rendered.cluster)):
        shard = yaml.safe_load(rendered.files[f"{monitoring.shard_name(i)}.yml"])
        for job in shard["scrape_configs"]:
            for sd in job.get("kubernetes_sd_configs", []):
                if sd["role"] != "pod":
                    continue
                (selector,) = sd["selectors"]
                app = selector["label"].split("=", 1)[1]
                port = int(job["relabel_configs"][-2]["replacement"].rsplit(":", 1)[1])
                connections += [(monitoring.shard_name(i), w, port) for w, p in rendered.pods.items()
                                if p.labels.get("app.kubernetes.io/name") == app]
    for source in rendered.datasources["datasources"]:
        service, port = _target(source["url"])
        connections += [("grafana", w, port) for w in rendered.behind(service)]
    return connections


def test_every_connection_inside_monitoring_is_admitted(rendered):
    connections = monitoring_connections(rendered)
    destinations = {d for _, d, _ in connections}
    # The cases that matter are all there: federation, kube-state-metrics, Grafana, dcgm-exporter.
    assert {monitoring.GLOBAL_NAME, "kube-state-metrics", monitoring.shard_name(0)} <= destinations
    assert ("dcgm-exporter" in destinations) == rendered.gpu()
    for source, destination, port in connections:
        target = rendered.pods[destination]
        if target.host_network:
            continue  # node-exporter: the node's own address, no policy applies
        assert admits(rendered.policies, rendered.pods[source], target, port), (source, destination, port)


def test_monitoring_pods_admit_only_their_own_clients(rendered):
    pods = rendered.pods
    ksm = monitoring.KSM_PORT
    # A shard never scrapes kube-state-metrics; Grafana and kube-state-metrics open nothing to Prometheus.
    assert not admits(rendered.policies, pods[monitoring.shard_name(0)], pods["kube-state-metrics"], ksm)
    assert not admits(rendered.policies, pods["grafana"], pods["kube-state-metrics"], ksm)
    assert not admits(rendered.policies, pods["kube-state-metrics"], pods[monitoring.GLOBAL_NAME], monitoring.PORT)
    # Only on the served port: the global pair reaches kube-state-metrics' metrics, not its telemetry.
    assert admits(rendered.policies, pods[monitoring.GLOBAL_NAME], pods["kube-state-metrics"], ksm)
    assert not admits(rendered.policies, pods[monitoring.GLOBAL_NAME], pods["kube-state-metrics"], 8081)
    # Grafana: nothing in the cluster (people reach it by port-forward, which crosses no policy).
    for source in pods.values():
        assert not admits(rendered.policies, source, pods["grafana"], 3000) or source.host_network


def test_every_pod_network_pod_is_isolated_and_no_host_network_pod_is_selected(rendered):
    for workload, pod in rendered.pods.items():
        selected = [p["metadata"]["name"] for p in rendered.policies if selects(p, pod)]
        if pod.host_network:
            assert not selected, f"{workload} (hostNetwork) is selected by {selected}"
        else:
            assert isolating_policies(rendered.policies, pod), f"{workload} is not isolated"
    # A pod someone adds later without labels is isolated too.
    assert isolating_policies(rendered.policies, Pod(NS, {}))


def test_policies_are_applied_before_the_pods_they_isolate(rendered):
    order = all_objects(list(rendered.addons.values()))
    kinds = [o["kind"] for o in order if o["metadata"].get("namespace") == NS]
    last_policy = max(i for i, k in enumerate(kinds) if k == "NetworkPolicy")
    first_workload = min(i for i, k in enumerate(kinds) if k in WORKLOADS)
    assert last_policy < first_workload


def test_the_engine_runs_privileged_on_every_node_in_kube_system(rendered):
    objects = rendered.addons["network-policy"].objects
    (daemonset,) = [o for o in objects if o["kind"] == "DaemonSet"]
    assert daemonset["metadata"]["namespace"] == "kube-system" and "kube-system" in policy.PRIVILEGED_NAMESPACES
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["tolerations"] == [{"operator": "Exists"}] and pod["hostNetwork"] is True
    (container,) = pod["containers"]
    assert container["image"] == versions.KUBE_NETWORK_POLICIES
    assert container["securityContext"]["privileged"] is True
    assert "--disable-nri" in container["args"] and not pod.get("volumes")
    assert "--metrics-bind-address=127.0.0.1:9080" in container["args"]
    # Read-only RBAC: exactly what its informers watch.
    (role,) = [o for o in objects if o["kind"] == "ClusterRole"]
    granted = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
               for v in rule["verbs"]}
    assert granted == {(g, r, v) for g, r in (("", "pods"), ("", "namespaces"), ("networking.k8s.io", "networkpolicies"))
                       for v in ("list", "watch")}
    (binding,) = [o for o in objects if o["kind"] == "ClusterRoleBinding"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": network_policy.ENGINE, "namespace": "kube-system"}]


def test_the_engine_and_the_policies_validate_against_the_api_schemas(rendered):
    objects = list(rendered.addons["network-policy"].objects) + rendered.policies
    _, problems = validate_objects(objects, rendered.cluster.kubernetes.version)
    assert problems == []
    assert {o["kind"] for o in objects} >= {"DaemonSet", "ClusterRole", "NetworkPolicy"}


def test_the_global_pair_runs_only_on_api_servers_and_the_shards_anywhere_off_gpu(rendered):
    objects = rendered.addons["monitoring"].objects
    for sts in (o for o in objects if o["kind"] == "StatefulSet"):
        required = sts["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        control_plane = all({"key": policy.CONTROL_PLANE_LABEL, "operator": "Exists"} in t["matchExpressions"]
                            for t in required)
        assert control_plane == (sts["metadata"]["name"] == monitoring.GLOBAL_NAME), sts["metadata"]["name"]


# --- the evaluator itself -------------------------------------------------------------


def test_the_evaluator_follows_networkpolicy_semantics():
    deny = {"metadata": {"namespace": "a"}, "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}}
    allow_b = {"metadata": {"namespace": "a"}, "spec": {
        "podSelector": {"matchLabels": {"app": "db"}},
        "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "b"}},
                               "podSelector": {"matchLabels": {"app": "web"}}}],
                     "ports": [{"port": "sql"}]}]}}
    db = Pod("a", {"app": "db"}, named_ports={"sql": 5432})
    web_b, web_c = Pod("b", {"app": "web"}, node="n2"), Pod("c", {"app": "web"}, node="n2")
    assert admits([], web_c, db, 5432)                     # nothing selects it: open
    assert not admits([deny], web_b, db, 5432)             # isolated, no rule
    assert admits([deny, allow_b], web_b, db, 5432)        # policies add up
    assert not admits([deny, allow_b], web_c, db, 5432)    # other namespace
    assert not admits([deny, allow_b], web_b, db, 5433)    # other port
    assert admits([deny], Pod("x", {}, host_network=True, node="node-a"), db, 5432)  # its own node
    not_in = {"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["x"]}]}
    assert selector_matches(not_in, {}) and not selector_matches(not_in, {"app": "x"})
