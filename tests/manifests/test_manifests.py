"""The add-on manifests: goldens, API schema validity, the policy they encode, and
which objects change when the cluster file changes.

Regenerate the goldens after an intended change with
    CORRAL_UPDATE_GOLDEN=1 pytest tests/manifests
and review the diff of tests/golden/manifests/.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from corral.manifests import all_objects, object_key, render, to_yaml
from corral.manifests import policy
from corral.manifests.validate import schema_version, validate_objects
from corral.model import Cluster, load_fleet
from corral.model.layout import node_group_name
from corral.model.schema import TEAM_TAINT_KEY, Taint

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "clusters"
GOLDEN = ROOT / "tests" / "golden" / "manifests"
UPDATE_GOLDEN = os.environ.get("CORRAL_UPDATE_GOLDEN") == "1"
FLEET = load_fleet([EXAMPLES])
NAMES = sorted(FLEET.clusters)


def objects_of(cluster: Cluster) -> dict[str, dict]:
    return {object_key(o): o for o in all_objects(render(cluster))}


def find(objects: dict[str, dict], key: str) -> dict:
    assert key in objects, f"{key} not rendered; have {sorted(objects)}"
    return objects[key]


def pod_spec(obj: dict) -> dict:
    return obj["spec"]["template"]["spec"]


def variant(tmp_path: Path, name: str, *edits: tuple[str, str]) -> Cluster:
    """Example `name` with each (old, new) text edit applied, loaded as a fleet of one."""
    text = (EXAMPLES / f"{name}.yaml").read_text()
    for old, new in edits:
        assert old in text, f"{old!r} not in {name}.yaml"
        text = text.replace(old, new, 1)
    folder = tmp_path / f"variant-{len(list(tmp_path.iterdir()))}"
    folder.mkdir()
    (folder / f"{name}.yaml").write_text(text)
    return load_fleet([folder]).clusters[name]


def changed(before: Cluster, after: Cluster) -> set[str]:
    """Objects added, removed or different between two renders."""
    a, b = objects_of(before), objects_of(after)
    return {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)}


# --- goldens and schemas -------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_golden(name):
    from corral.manifests.fleet_addons import cluster_addons, load_fleet_beside, manager_kueue_settings
    from corral.manifests.kueue import chart_comment

    # What `corral manifests` prints and `pulumi up` applies: with the example fleet's MultiKueue objects,
    # and the Kueue chart it installs shown as comments.
    cluster = FLEET.clusters[name]
    fleet = load_fleet_beside(EXAMPLES)
    addons = cluster_addons(cluster, fleet)
    text = chart_comment(cluster, addons, manager_kueue_settings(cluster, fleet)) + to_yaml(cluster, all_objects(addons))
    path = GOLDEN / f"{name}.yaml"
    if UPDATE_GOLDEN:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} missing: run CORRAL_UPDATE_GOLDEN=1 pytest tests/manifests"
    assert text == path.read_text(), f"{path} differs: review, then CORRAL_UPDATE_GOLDEN=1 pytest tests/manifests"


@pytest.mark.parametrize("name", NAMES)
def test_every_object_is_valid_for_the_clusters_kubernetes_version(name):
    cluster = FLEET.clusters[name]
    version, problems = validate_objects(all_objects(render(cluster)), cluster.kubernetes.version)
    assert version.used == cluster.kubernetes.minor, version.note
    assert problems == []


def test_validation_catches_what_the_api_server_would_reject():
    cluster = FLEET.clusters["jaguar"]
    objects = all_objects(render(cluster))
    daemonset = next(o for o in objects if o["kind"] == "DaemonSet")
    broken = json.loads(json.dumps(daemonset))
    pod_spec(broken)["tolerations"][0]["operatr"] = "Exists"  # a typo: unknown field
    _, problems = validate_objects([broken], cluster.kubernetes.version)
    assert len(problems) == 1 and "operatr" in problems[0]


def test_schema_version_falls_back_to_the_nearest_older_one_and_says_so():
    assert schema_version("1.31.4").note is None
    old = schema_version("1.9.0")
    assert old.used == "1.25" or old.used < "1.3"  # the oldest shipped
    assert "nearest" in old.note
    future = schema_version("1.99.0")
    assert future.used != "1.99" and "1.99" in future.note


@pytest.mark.parametrize("name", NAMES)
def test_apply_order_puts_namespaces_crds_and_rbac_before_workloads(name):
    kinds = [o["kind"] for o in all_objects(render(FLEET.clusters[name]))]
    first_workload = min(i for i, k in enumerate(kinds) if k in ("DaemonSet", "Deployment", "StatefulSet"))
    for early in ("Namespace", "CustomResourceDefinition", "ServiceAccount", "ClusterRole", "ClusterRoleBinding"):
        assert all(i < first_workload for i, k in enumerate(kinds) if k == early), early
    assert kinds[0] == "Namespace"


@pytest.mark.parametrize("name", NAMES)
def test_every_image_is_pinned(name):
    for obj in all_objects(render(FLEET.clusters[name])):
        if obj["kind"] in ("DaemonSet", "Deployment", "StatefulSet"):
            spec = pod_spec(obj)
            for container in spec.get("initContainers", []) + spec["containers"]:
                image = container["image"]
                assert ":" in image.rsplit("/", 1)[-1] and not image.endswith(":latest"), image


# --- flannel -------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_flannel_net_conf_follows_the_cluster(name):
    cluster = FLEET.clusters[name]
    objects = objects_of(cluster)
    spec = cluster.network.flannel
    # Cloud nodes (and API servers) never route directly: their networks do
    # not deliver pod addresses. On-prem nodes get directRouting as declared
    # (tests/manifests/test_pod_network.py checks every pair of nodes).
    wanted = {"kube-flannel-cfg": False}
    if cluster.onprem_pools:
        wanted["kube-flannel-cfg-onprem"] = spec.direct_routing
    rendered = {o["metadata"]["name"] for o in objects.values()
                if o["kind"] == "ConfigMap" and o["metadata"]["namespace"] == "kube-flannel"}
    assert rendered == set(wanted)
    for name, direct_routing in wanted.items():
        config = find(objects, f"ConfigMap/kube-flannel/{name}")["data"]
        net = json.loads(config["net-conf.json"])
        assert net["Network"] == cluster.kubernetes.pod_cidr
        assert net["Backend"] == {"Type": "vxlan", "VNI": spec.vni, "Port": spec.port, "DirectRouting": direct_routing}
        cni = json.loads(config["cni-conf.json"])
        assert cni["plugins"][0]["delegate"]["mtu"] == spec.mtu


def test_flannel_runs_on_every_node_whatever_its_taints():
    objects = objects_of(FLEET.clusters["jaguar"])
    for name in ("kube-flannel-ds", "kube-flannel-ds-onprem"):
        spec = pod_spec(find(objects, f"DaemonSet/kube-flannel/{name}"))
        for pool in FLEET.clusters["jaguar"].node_pools:
            for taint in FLEET.clusters["jaguar"].node_taints(pool):
                assert policy.tolerates(spec["tolerations"], taint)
        assert spec["priorityClassName"] == "system-node-critical"


# --- GPU node agents -----------------------------------------------------------


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


GPU_AGENTS = ("DaemonSet/kube-system/nvidia-device-plugin", "DaemonSet/corral-monitoring/dcgm-exporter")


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("agent", GPU_AGENTS)
def test_gpu_agents_select_every_gpu_pool_and_no_other(name, agent):
    cluster = FLEET.clusters[name]
    spec = pod_spec(find(objects_of(cluster), agent))
    for pool in cluster.node_pools:
        runs_there = selects(spec["nodeSelector"], cluster.node_labels(pool)) and all(
            policy.tolerates(spec["tolerations"], taint) for taint in cluster.node_taints(pool)
        )
        assert runs_there == bool(pool.gpu), f"{agent} on pool {pool.name}"


def test_device_plugin_shape():
    spec = pod_spec(find(objects_of(FLEET.clusters["jaguar"]), GPU_AGENTS[0]))
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": TEAM_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert spec["volumes"] == [{"name": "device-plugin", "hostPath": {"path": "/var/lib/kubelet/device-plugins"}},
                               {"name": "nvidia-all-gpus", "hostPath": {"path": "/dev/null", "type": "CharDevice"}}]


def test_gpu_agents_tolerate_a_gpu_pools_own_taints():
    # ibis' spot A100 pool carries corral.dev/preemptible=true:NoSchedule.
    cluster = FLEET.clusters["ibis"]
    spec = pod_spec(find(objects_of(cluster), GPU_AGENTS[0]))
    assert policy.tolerates(spec["tolerations"], Taint(key="corral.dev/preemptible", value="true", effect="NoSchedule"))


def test_no_gpu_pools_no_gpu_agents(tmp_path):
    cluster = variant(tmp_path, "heron",
                      ("    gpu: {model: A10G, count: 4}\n", ""),
                      ("    gpu: {model: A10G, count: 8}\n", ""),
                      ("machineType: g5.12xlarge", "machineType: m7i.8xlarge"),
                      ("machineType: g5.48xlarge", "machineType: m7i.8xlarge"))
    keys = objects_of(cluster)
    assert not any(k in keys for k in GPU_AGENTS)
    files = keys["ConfigMap/corral-monitoring/prometheus-config"]["data"]
    assert not any("dcgm-exporter" in text for text in files.values())


# --- teams ----------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_a_reserved_pool_is_tainted_on_every_path(name):
    """The join (on-prem: inventory), the cloud pool's registration and its
    autoscaler node template all take `node_taints`; the manifests tolerate it
    only in the team's namespaces."""
    cluster = FLEET.clusters[name]
    for team in cluster.scheduling.teams:
        for pool_name in team.reserved_pools:
            pool = cluster.pool(pool_name)
            expected = Taint(key=TEAM_TAINT_KEY, value=team.name, effect="NoSchedule")
            assert expected in cluster.node_taints(pool)
            assert cluster.node_labels(pool)[TEAM_TAINT_KEY] == team.name
            if pool.provider == "onprem":
                from corral.nodes.inventory import pool_vars

                assert expected.model_dump() in pool_vars(cluster, pool)["corral_node_taints"]
            elif pool.provider == "aws":
                nodepools = pytest.importorskip("corral.infra.aws.nodepools")
                tags = nodepools.autoscaler_tags(cluster, pool)
                assert tags[f"k8s.io/cluster-autoscaler/node-template/taint/{TEAM_TAINT_KEY}"] == f"{team.name}:NoSchedule"


def namespace_tolerations(ns: dict) -> tuple[list, list]:
    annotations = ns["metadata"].get("annotations", {})
    return (
        json.loads(annotations.get(policy.DEFAULT_TOLERATIONS_ANNOTATION, "[]")),
        json.loads(annotations.get(policy.TOLERATIONS_WHITELIST_ANNOTATION, "[]")),
    )


@pytest.mark.parametrize("name", NAMES)
def test_only_a_teams_namespaces_get_its_toleration(name):
    cluster = FLEET.clusters[name]
    objects = objects_of(cluster)
    namespaces = {o["metadata"]["name"]: o for o in objects.values() if o["kind"] == "Namespace"}
    for team in cluster.scheduling.teams:
        taint = Taint(key=TEAM_TAINT_KEY, value=team.name, effect="NoSchedule")
        for ns_name, ns in namespaces.items():
            defaults, whitelist = namespace_tolerations(ns)
            mine = ns_name in team.namespaces
            assert policy.tolerates(defaults, taint) == (mine and bool(team.reserved_pools)), (team.name, ns_name)
            assert policy.tolerates(whitelist, taint) == mine, (team.name, ns_name)
    for ns_name, ns in namespaces.items():
        owner = ns["metadata"]["labels"].get(TEAM_TAINT_KEY)
        assert owner == next((t.name for t in cluster.scheduling.teams if ns_name in t.namespaces), None)


def test_team_whitelist_allows_what_kubernetes_adds_and_gpu_pods_need():
    cluster = FLEET.clusters["jaguar"]
    ns = find(objects_of(cluster), "Namespace/robotics")
    _, whitelist = namespace_tolerations(ns)
    for key, effect in (("node.kubernetes.io/not-ready", "NoExecute"), ("node.kubernetes.io/unreachable", "NoExecute"),
                        ("nvidia.com/gpu", "NoSchedule")):
        assert policy.tolerates(whitelist, Taint(key=key, value="present", effect=effect)), key
    assert not any(t.get("key", "") == "" for t in whitelist), "no wildcard in a team whitelist"


def test_a_team_namespace_that_is_a_system_namespace_is_refused(tmp_path):
    # The cluster file's rule refuses it at load (tests/manifests/test_team_namespaces.py); this is
    # the policy's own check, for a Cluster built without the loader.
    cluster = variant(tmp_path, "jaguar")
    team = cluster.scheduling.teams[0]
    cluster.scheduling.teams[0] = team.model_copy(update={"namespaces": [*team.namespaces, "kube-system"]})
    with pytest.raises(policy.ManifestError, match="kube-system"):
        render(cluster)


# The pod placement admission policy: tests/manifests/test_cluster_policy.py.


# --- cluster-autoscaler ---------------------------------------------------------


def autoscaler_args(cluster: Cluster) -> list[str]:
    deployment = find(objects_of(cluster), "Deployment/kube-system/cluster-autoscaler")
    return pod_spec(deployment)["containers"][0]["args"]


def test_autoscaler_on_azure_sees_each_pools_zonal_scale_sets_with_the_pools_bounds():
    cluster = FLEET.clusters["jaguar"]
    nodes = [a.removeprefix("--nodes=") for a in autoscaler_args(cluster) if a.startswith("--nodes=")]
    groups = policy.autoscaler_node_groups(cluster)
    assert len(nodes) == len(groups) == sum(len(p.zones) for p in cluster.cloud_pools)
    for pool in cluster.cloud_pools:
        mine = [g for g in groups if g.pool == pool.name]
        # One scale set per zone (each zone's node subnet and NAT gateway).
        assert [(g.zone, g.name) for g in mine] == [(z, f"{node_group_name(cluster, pool)}-{z}") for z in pool.zones]
        assert sum(g.max_size for g in mine) == pool.max_size
        assert sum(g.min_size for g in mine) == pool.min_size
    assert nodes == [f"{g.min_size}:{g.max_size}:{g.name}" for g in groups]
    assert "--cloud-provider=azure" in autoscaler_args(cluster)
    assert "--balance-similar-node-groups=true" in autoscaler_args(cluster)


def test_autoscaler_on_gcp_drives_each_pools_zonal_migs_with_the_pools_bounds():
    cluster = FLEET.clusters["ibis"]
    nodes = [a.removeprefix("--nodes=") for a in autoscaler_args(cluster) if a.startswith("--nodes=")]
    groups = policy.autoscaler_node_groups(cluster)
    assert len(nodes) == len(groups) == sum(len(p.zones) for p in cluster.cloud_pools)
    for pool in cluster.cloud_pools:
        mine = [g for g in groups if g.pool == pool.name]
        assert [g.zone for g in mine] == pool.zones
        assert sum(g.max_size for g in mine) == pool.max_size
        assert sum(g.min_size for g in mine) == pool.min_size
    for group, arg in zip(groups, nodes):
        assert arg == (f"{group.min_size}:{group.max_size}:https://www.googleapis.com/compute/v1/projects/"
                       f"$(GCP_PROJECT)/zones/{group.zone}/instanceGroups/{group.name}")
    assert "--balance-similar-node-groups=true" in autoscaler_args(cluster)


def test_gcp_mig_names_and_split_agree_with_the_gcp_node_pools():
    gcp = pytest.importorskip("corral.infra.gcp.nodepools")
    common = pytest.importorskip("corral.infra.gcp.common")
    cluster = FLEET.clusters["ibis"]
    for pool in cluster.cloud_pools:
        mine = [g for g in policy.autoscaler_node_groups(cluster) if g.pool == pool.name]
        assert [g.name for g in mine] == [f"{node_group_name(cluster, pool)}-{common.zone_suffix(z)}" for z in pool.zones]
        assert [g.max_size for g in mine] == gcp.split_sizes(pool.max_size, len(pool.zones))
        assert [g.min_size for g in mine] == gcp.split_sizes(pool.min_size, len(pool.zones))


def test_autoscaler_on_aws_discovers_the_tags_the_asgs_carry():
    cluster = FLEET.clusters["heron"]
    args = autoscaler_args(cluster)
    discovery = next(a for a in args if a.startswith("--node-group-auto-discovery="))
    tags = discovery.removeprefix("--node-group-auto-discovery=asg:tag=").split(",")
    nodepools = pytest.importorskip("corral.infra.aws.nodepools")
    for pool in cluster.cloud_pools:
        carried = nodepools.autoscaler_tags(cluster, pool)
        assert all(tag in carried for tag in tags), pool.name
    assert not any(a.startswith("--nodes=") for a in args)


@pytest.mark.parametrize("name", ["heron", "ibis", "jaguar"])
def test_autoscaler_runs_only_on_the_api_servers_that_hold_the_cloud_identity(name):
    cluster = FLEET.clusters[name]
    spec = pod_spec(find(objects_of(cluster), "Deployment/kube-system/cluster-autoscaler"))
    required = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert required["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]}
    ]
    assert {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    # Every cloud: the identity comes from the instance metadata service, which pods on the pod
    # network never reach (tests/manifests/test_autoscaler_identity.py).
    assert spec.get("hostNetwork") is True
    assert spec.get("dnsPolicy") == "ClusterFirstWithHostNet"


def test_scale_down_guard_is_a_tenth_of_the_cloud_capacity():
    for name, capacity in (("jaguar", 200), ("heron", 420), ("ibis", 246)):
        args = autoscaler_args(FLEET.clusters[name])
        expected = -(-capacity // 10)
        assert f"--max-scale-down-parallelism={expected}" in args
        assert f"--max-empty-bulk-delete={expected}" in args
        assert "--scale-down-enabled=true" in args and "--expander=least-waste" in args


def test_gpu_nodes_are_only_scaled_down_when_no_gpu_is_requested():
    args = autoscaler_args(FLEET.clusters["heron"])  # 4- and 8-GPU pools
    threshold = float(next(a for a in args if "gpu-utilization" in a).split("=")[1])
    assert 0 < threshold < 1 / 8


def test_no_cloud_pools_no_autoscaler(tmp_path):
    text = (EXAMPLES / "jaguar.yaml").read_text()
    cloud_pool = text[text.index("  - name: cpu-d64"):]
    cluster = variant(tmp_path, "jaguar", (cloud_pool, ""))
    assert not cluster.cloud_pools
    assert not any("cluster-autoscaler" in k for k in objects_of(cluster))


# --- monitoring -----------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_prometheus_scrapes_pod_requests_for_billing(name):
    objects = objects_of(FLEET.clusters[name])
    data = find(objects, "ConfigMap/corral-monitoring/prometheus-config")["data"]
    assert "job_name: kube-state-metrics" in data["prometheus.yml"]
    assert "kube_pod_container_resource_requests" in data["corral-rules.yml"]
    assert "label_corral_dev_team" in data["corral-rules.yml"]
    ksm = pod_spec(find(objects, "Deployment/corral-monitoring/kube-state-metrics"))["containers"][0]["args"]
    assert any(a.startswith("--metric-labels-allowlist=namespaces=[corral.dev/team]") for a in ksm)
    if policy.gpu_pools(FLEET.clusters[name]):
        assert "job_name: dcgm-exporter" in data["prometheus-shard-0.yml"]


# --- what a change in the cluster file changes -----------------------------------


def test_toggling_direct_routing_changes_only_flannels_config_and_daemonset(tmp_path):
    before = FLEET.clusters["jaguar"]
    after = variant(tmp_path, "jaguar", ("directRouting: true", "directRouting: false"))
    # Only on-prem nodes route directly, so only their flannel rolls.
    assert changed(before, after) == {"ConfigMap/kube-flannel/kube-flannel-cfg-onprem",
                                      "DaemonSet/kube-flannel/kube-flannel-ds-onprem"}


def test_moving_a_pool_between_teams_changes_only_the_two_teams_namespaces(tmp_path):
    vision = "\n    - {name: vision, namespaces: [vision], reservedPools: []}"
    before = variant(tmp_path, "jaguar", ("reservedPools: [gpu-h100-robotics]}", "reservedPools: [gpu-h100-robotics]}" + vision))
    after = variant(tmp_path, "jaguar",
                    ("reservedPools: [gpu-h100-robotics]}", "reservedPools: []}"
                     + vision.replace("reservedPools: []", "reservedPools: [gpu-h100-robotics]")))
    assert changed(before, after) == {"Namespace/robotics", "Namespace/vision",
                                      # corral-node-approver relabels the pool's nodes for their new team.
                                      "ConfigMap/kube-system/corral-node-approver",
                                      "Deployment/kube-system/corral-node-approver",
                                      # The pool's GPUs move to the new team's Kueue quota and flavor.
                                      "ClusterQueue/team-robotics", "ClusterQueue/team-vision",
                                      "ResourceFlavor/h100-robotics", "ResourceFlavor/h100-vision"}
    pool = after.pool("gpu-h100-robotics")
    assert Taint(key=TEAM_TAINT_KEY, value="vision", effect="NoSchedule") in after.node_taints(pool)
    assert Taint(key=TEAM_TAINT_KEY, value="robotics", effect="NoSchedule") not in after.node_taints(pool)


def test_changing_a_pools_max_changes_only_the_autoscaler(tmp_path):
    before = FLEET.clusters["jaguar"]
    after = variant(tmp_path, "jaguar", ("maxSize: 200", "maxSize: 300"))
    assert changed(before, after) == {"Deployment/kube-system/cluster-autoscaler"}
    # 300 over the pool's three zonal scale sets.
    assert [a for a in autoscaler_args(after) if a.startswith("--nodes=")] == [
        f"--nodes=0:100:jaguar-cpu-d64-{zone}" for zone in ("1", "2", "3")]


def test_adding_a_gpu_pool_taint_changes_the_gpu_agents_and_team_whitelists(tmp_path):
    before = FLEET.clusters["jaguar"]
    after = variant(tmp_path, "jaguar", ("    taints: []\n", "    taints: [\"corral.dev/maintenance=true:NoSchedule\"]\n"))
    assert changed(before, after) == {
        "DaemonSet/kube-system/nvidia-device-plugin",
        "DaemonSet/corral-monitoring/dcgm-exporter",
        # The pool is a RoCE pool: its RDMA device plugin tolerates the taint too.
        "DaemonSet/kube-system/rdma-shared-dp-roce",
        "Namespace/robotics",
        # The pool's Kueue flavor tolerates its taints, so Kueue's pods can start there.
        "ResourceFlavor/h100",
    }


# --- the command ----------------------------------------------------------------


def cli():
    import typer

    from corral.cli import manifests

    app = typer.Typer()
    manifests.register(app)
    app.callback()(lambda: None)  # keep `manifests` a subcommand
    return app


def test_cli_prints_the_golden_stream():
    result = CliRunner().invoke(cli(), ["manifests", "jaguar", "--clusters", str(EXAMPLES)])
    assert result.exit_code == 0, result.output
    assert result.stdout == (GOLDEN / "jaguar.yaml").read_text()


def test_cli_validate_reports_the_schema_version():
    result = CliRunner().invoke(cli(), ["manifests", "heron", "--clusters", str(EXAMPLES), "--validate"])
    assert result.exit_code == 0, result.output
    assert "valid against the Kubernetes 1.35 API schemas" in result.stderr


def test_cli_writes_one_file_per_addon_and_removes_stale_ones(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "cluster-autoscaler.yaml").write_text("# from when jaguar had cloud pools\n")
    (out / "notes.txt").write_text("mine\n")
    fleet = tmp_path / "fleet"
    fleet.mkdir()
    text = (EXAMPLES / "jaguar.yaml").read_text()
    (fleet / "jaguar.yaml").write_text(text[: text.index("  - name: cpu-d64")])
    result = CliRunner().invoke(cli(), ["manifests", "jaguar", "--clusters", str(fleet), "--out", str(out)])
    assert result.exit_code == 0, result.output
    written = sorted(p.name for p in out.iterdir())
    assert written == ["flannel.yaml", "flow-control.yaml", "gpu-health.yaml", "kubelet-csr-approver.yaml",
                       "kueue-queues.yaml", "kueue.yaml", "monitoring.yaml", "network-policy.yaml",
                       "node-approver.yaml", "notes.txt", "nvidia-device-plugin.yaml", "pod-security.yaml",
                       "rdma-shared-device-plugin.yaml", "repair.yaml", "scheduling.yaml", "teams.yaml"]
    assert "removed" in result.stdout


def test_cli_unknown_cluster_is_a_clear_error():
    result = CliRunner().invoke(cli(), ["manifests", "okapi", "--clusters", str(EXAMPLES)])
    assert result.exit_code == 1
    assert "no cluster 'okapi'" in result.stderr


def test_the_manifests_command_keeps_heavy_imports_off_start_up():
    import subprocess
    import sys

    code = ("import sys, corral.cli.manifests; "
            "print(sorted(m for m in ('corral.manifests', 'kubernetes_validate', 'pulumi') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
