"""The Kueue add-on (issue 29, items 1, 2 and 5): every object valid against Kueue
v0.19.2's own CRDs and their CEL rules, quotas that add up to the cluster file,
topology levels per provider, and team flavors the placement policy admits."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ruamel.yaml import YAML

from corral.manifests import kueue, policy, versions
from corral.manifests.render import all_objects, render
from corral.model import load_fleet
from corral.model.kueue import SHARED, Kueue, cluster_quotas, flavor_name, quotas

from .kueue_schema import KUEUE_RELEASE, validate_kueue_object
from .test_cluster_policy import admit

ROOT = Path(__file__).resolve().parents[2]
FLEET = load_fleet([ROOT / "clusters"])
WITH_KUEUE = sorted(name for name, c in FLEET.clusters.items() if c.scheduling.kueue.enabled)


def kueue_objects(cluster) -> list[dict]:
    """Both Kueue add-ons' objects: before the chart (namespace, priorities) and after it (queues)."""
    return [o for a in render(cluster) if a.name in (kueue.ADDON, kueue.QUEUES_ADDON) for o in a.every_object]


def of_kind(objects: list[dict], kind: str) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def test_the_add_on_pins_the_release_whose_crds_the_tests_hold():
    assert versions.KUEUE.endswith(f":{KUEUE_RELEASE}")


def _without_kueue(name: str):
    """Example cluster `name` with scheduling.kueue.enabled false (every example runs Kueue: fleet.yaml)."""
    cluster = FLEET.clusters[name].model_copy(deep=True)
    cluster.scheduling.kueue.enabled = False
    return cluster


def test_the_example_clusters_enable_kueue_and_a_cluster_without_it_renders_none():
    assert WITH_KUEUE == ["heron", "ibis", "jaguar"]
    assert "kueue" not in [a.name for a in render(_without_kueue("ibis"))]


@pytest.mark.parametrize("name", WITH_KUEUE)
def test_every_kueue_object_validates_against_the_pinned_crds_and_their_cel_rules(name):
    objects = [o for o in all_objects(render(FLEET.clusters[name])) if o["apiVersion"].startswith("kueue.x-k8s.io/")]
    # A Topology only where a flavor uses one: jaguar's racked on-prem pools (flavor_topology).
    topology = {"Topology"} if name == "jaguar" else set()
    assert {o["kind"] for o in objects} == {"ResourceFlavor", "ClusterQueue", "LocalQueue"} | topology
    problems = [p for o in objects for p in validate_kueue_object(o)]
    assert problems == []


@pytest.mark.parametrize("name", WITH_KUEUE)
def test_queues_reach_each_other_only_through_the_cohort(name):
    cluster = FLEET.clusters[name]
    objects = kueue_objects(cluster)
    queues = of_kind(objects, "ClusterQueue")
    assert {q["spec"]["cohortName"] for q in queues.values()} == {"corral"}
    for team in cluster.scheduling.teams:
        spec = queues[f"team-{team.name}"]["spec"]
        # Only the team's namespaces may use its queue: another namespace's LocalQueue would be inactive.
        assert spec["namespaceSelector"] == {"matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": team.namespaces}]}
        for namespace in team.namespaces:
            assert of_kind(objects, "LocalQueue")[team.name]["spec"]["clusterQueue"] == f"team-{team.name}"
            assert any(o["metadata"].get("namespace") == namespace for o in objects if o["kind"] == "LocalQueue")
        # No team's queue lists another team's flavor.
        listed = {f["name"] for g in spec.get("resourceGroups", []) for f in g["flavors"]}
        assert all(not f.endswith(tuple(f"-{t.name}" for t in cluster.scheduling.teams if t != team)) for f in listed)


def test_jaguar_quotas_are_its_reserved_and_shared_h100s():
    queues = {q.name: q for q in cluster_quotas(FLEET.clusters["jaguar"])}
    robotics = {f.flavor: f for f in queues["team-robotics"].flavors}
    assert robotics["h100-robotics"].nominal == 8 * 8              # gpu-[065:072], 8 H100 each
    assert robotics["h100"].nominal == 0 and robotics["h100"].borrowing_limit == 128  # maxBorrowGPUs
    assert [(f.flavor, f.nominal, f.lending_limit) for f in queues[SHARED].flavors] == [("h100", 64 * 8, None)]


def test_heron_shared_queue_lends_half():
    queues = {q.name: q for q in cluster_quotas(FLEET.clusters["heron"])}
    (a10g,) = queues[SHARED].flavors
    assert (a10g.nominal, a10g.lending_limit) == (80 * 4, 160)     # gpu-a10g: maxSize 80 x 4, lendPercent 50
    assert {f.flavor: f.nominal for f in queues["team-inference"].flavors} == {"a10g-inference": 40 * 8, "a10g": 0}


def test_flavors_select_gpu_model_and_team_and_name_their_topology():
    objects = kueue_objects(FLEET.clusters["jaguar"])
    flavors = of_kind(objects, "ResourceFlavor")
    assert flavors["h100"]["spec"]["nodeLabels"] == {"corral.dev/gpu-model": "H100"}
    assert flavors["h100-robotics"]["spec"]["nodeLabels"] == {
        "corral.dev/gpu-model": "H100", policy.TEAM_NODE_LABEL: "robotics"}
    assert {"key": "corral.dev/team", "operator": "Equal", "value": "robotics", "effect": "NoSchedule"} in \
        flavors["h100-robotics"]["spec"]["tolerations"]
    assert {f["spec"]["topologyName"] for f in flavors.values()} == {"corral-onprem"}
    levels = [level["nodeLabel"] for level in of_kind(objects, "Topology")["corral-onprem"]["spec"]["levels"]]
    assert levels == ["corral.dev/pool", "corral.dev/rack", "kubernetes.io/hostname"]


def test_cloud_topologies_use_the_clouds_labels():
    assert kueue.TOPOLOGY_LEVELS["aws"] == (
        "topology.k8s.aws/network-node-layer-1", "topology.k8s.aws/network-node-layer-2",
        "topology.k8s.aws/network-node-layer-3", "kubernetes.io/hostname")
    for provider in ("aws", "gcp", "azure"):
        topology = {"apiVersion": kueue.TOPOLOGY_API, "kind": "Topology",
                    "metadata": {"name": kueue.topology_name(provider)},
                    "spec": {"levels": [{"nodeLabel": label} for label in kueue.TOPOLOGY_LEVELS[provider]]}}
        assert validate_kueue_object(topology) == []


def test_a_team_flavors_pod_passes_the_placement_policy_only_in_the_teams_namespace():
    # Kueue injects the flavor's nodeLabels as a nodeSelector and its tolerations
    # into the admitted pods: the pod placement policy must let them through.
    jaguar = FLEET.clusters["jaguar"]
    flavor = of_kind(kueue_objects(jaguar), "ResourceFlavor")["h100-robotics"]["spec"]
    spec = {"containers": [{"name": "train", "image": "train:1"}],
            "nodeSelector": flavor["nodeLabels"], "tolerations": flavor["tolerations"]}
    allowed, messages = admit(jaguar, "robotics", spec)
    assert allowed, messages
    refused, _ = admit(jaguar, "default", spec)
    assert not refused


def test_the_manager_config_waits_for_whole_gangs_and_enables_topology():
    objects = kueue_objects(FLEET.clusters["jaguar"])
    # One source: the chart's value, rendered by the chart into kueue-manager-config; corral renders no ConfigMap.
    assert of_kind(objects, "ConfigMap") == {}
    values = kueue.chart(FLEET.clusters["jaguar"]).values
    config = YAML(typ="safe", pure=True).load(values["managerConfig"]["controllerManagerConfigYaml"])
    # v1beta2: the section's presence turns it on (no `enable`); TAS is on by default (no gate).
    assert "enable" not in config["waitForPodsReady"]
    assert config["waitForPodsReady"]["timeout"] == "15m"        # jaguar's waitForPodsReadyMinutes
    assert "featureGates" not in config
    assert config["apiVersion"] == "config.kueue.x-k8s.io/v1beta2"
    assert "cpu" in config["resources"]["excludeResourcePrefixes"]
    namespace = of_kind(objects, "Namespace")["kueue-system"]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert set(of_kind(objects, "PriorityClass")) == {"corral-batch", "corral-batch-high"}


def test_reclaim_never_with_borrowing_preemption_is_a_file_line_error(tmp_path):
    from tests.model.helpers import variant

    found = variant(tmp_path, "jaguar", "kueue: {enabled: true,",
                    "kueue: {reclaimWithinCohort: Never, borrowWithinCohort: LowerPriority, enabled: true,")
    assert len(found) == 1 and found[0].startswith("jaguar.yaml:") and "scheduling.kueue" in found[0], found
    assert "borrowWithinCohort LowerPriority needs reclaimWithinCohort LowerPriority or Any" in found[0]


# --- property tests of the quota arithmetic ----------------------------------------

MODELS = ("H100", "A100", "L4")
pools_strategy = st.lists(
    st.tuples(st.sampled_from((*MODELS, None)), st.integers(0, 300), st.integers(1, 8)), min_size=1, max_size=8)


@st.composite
def fleets(draw):
    pools = [(f"pool-{i}", model, machines, per) for i, (model, machines, per) in enumerate(draw(pools_strategy))]
    team_count = draw(st.integers(0, 3))
    owner = [draw(st.sampled_from([None, *range(team_count)])) for _ in pools]
    teams = [(f"team{t}", tuple(p[0] for p, o in zip(pools, owner) if o == t)) for t in range(team_count)]
    kueue_settings = Kueue(max_borrow_gpus=draw(st.none() | st.integers(0, 500)),
                           lend_percent=draw(st.integers(0, 100)))
    return pools, teams, kueue_settings


@settings(max_examples=300, deadline=None)
@given(fleets())
def test_quotas_add_up_to_the_pools(fleet):
    pools, teams, settings_ = fleet
    queues = {q.name: q for q in quotas(pools, teams, settings_)}
    owner = {pool: team for team, reserved in teams for pool in reserved}
    gpus = {}
    for name, model, machines, per in pools:
        if model:
            key = (model, owner.get(name))
            gpus[key] = gpus.get(key, 0) + machines * per
    # Nominal quota = reserved capacity, per team and model; the shared queue holds the rest.
    for team, _ in teams:
        own = {f.gpu_model: f.nominal for f in queues[f"team-{team}"].flavors if f.team == team}
        assert own == {m: n for (m, t), n in gpus.items() if t == team}
    assert {f.gpu_model: f.nominal for f in queues[SHARED].flavors} == {m: n for (m, t), n in gpus.items()
                                                                        if t is None}
    # The cohort's quota of each model is the cluster's GPUs of that model.
    cohort: dict[str, int] = {}
    for queue in queues.values():
        for f in queue.flavors:
            cohort[f.gpu_model] = cohort.get(f.gpu_model, 0) + f.nominal
    total: dict[str, int] = {}
    for (model, _), n in gpus.items():
        total[model] = total.get(model, 0) + n
    assert cohort == total
    for queue in queues.values():
        for f in queue.flavors:
            # Borrowing: only of shared flavors, at most maxBorrowGPUs; lending: at most the nominal.
            if f.team is None and queue.team is not None:
                assert f.nominal == 0 and f.borrowing_limit == settings_.max_borrow_gpus
            else:
                assert f.borrowing_limit is None
            if f.lending_limit is not None:
                assert queue.name == SHARED and 0 <= f.lending_limit <= f.nominal
                assert f.lending_limit == f.nominal * settings_.lend_percent // 100
            # A team's own flavor is listed by that team's queue only.
            if f.team is not None:
                assert queue.team == f.team and f.flavor == flavor_name(f.gpu_model, f.team)


@settings(max_examples=60, deadline=None)
@given(fleets())
def test_rendered_queues_of_any_quota_validate(fleet):
    pools, teams, settings_ = fleet
    for queue in quotas(pools, teams, settings_):
        if not queue.flavors:
            continue
        obj = {"apiVersion": kueue.KUEUE_API, "kind": "ClusterQueue", "metadata": {"name": queue.name},
               "spec": {"cohortName": "corral", "resourceGroups": [{"coveredResources": [kueue.GPU_RESOURCE],
                        "flavors": [kueue._flavor_resources(f) for f in queue.flavors]}]}}
        assert validate_kueue_object(obj) == []


def test_the_global_prometheus_scrapes_kueue_only_where_it_runs():
    from corral.manifests import monitoring

    def kueue_jobs(cluster) -> list[dict]:
        config = YAML(typ="safe", pure=True).load(monitoring.global_config(cluster, monitoring.shard_count(cluster)))
        return [job for job in config["scrape_configs"] if job["job_name"] == "kueue"]

    (job,) = kueue_jobs(FLEET.clusters["jaguar"])
    assert job["static_configs"] == [{"targets": ["kueue-controller-manager-metrics-service.kueue-system.svc:8443"]}]
    assert job["scheme"] == "https" and job["authorization"]["credentials_file"].endswith("/token")
    assert kueue_jobs(_without_kueue("ibis")) == []


def test_a_flavor_tolerates_its_pools_own_taints():
    # ibis's A100 pool is tainted corral.dev/preemptible=true:NoSchedule (spot machines):
    # without the toleration Kueue's pods for that flavor could never start there.
    ibis = FLEET.clusters["ibis"]
    flavor = next(f for f in of_kind(kueue_objects(ibis), "ResourceFlavor").values()
                  if f["spec"]["nodeLabels"]["corral.dev/gpu-model"] == "A100")
    assert {"key": "corral.dev/preemptible", "operator": "Equal", "value": "true", "effect": "NoSchedule"} in \
        flavor["spec"]["tolerations"]
    assert validate_kueue_object(flavor) == []


def _shown_chart(output: str) -> dict:
    """The chart `corral manifests` shows in its leading comment lines."""
    comments = "\n".join(line[2:] for line in output.splitlines() if line.startswith("# "))
    return YAML(typ="safe", pure=True).load(comments[comments.index("helmChart:"):comments.index("Add-on manifests")])


def test_corral_manifests_shows_the_kueue_chart_it_does_not_apply(tmp_path):
    from typer.testing import CliRunner

    from .test_manifests import cli

    app = cli()
    result = CliRunner().invoke(app, ["manifests", "jaguar", "--clusters", str(ROOT / "clusters")])
    assert result.exit_code == 0, result.output
    chart = kueue.chart(FLEET.clusters["jaguar"])
    assert _shown_chart(result.output)["helmChart"] == {
        "release": "kueue", "chart": "oci://registry.k8s.io/kueue/charts/kueue",
        "version": versions.KUEUE_CHART_VERSION, "namespace": "kueue-system", "values": chart.values}
    # The comments are no object: what kubectl would apply from the stream has no manager ConfigMap of corral's.
    documents = [d for d in YAML(typ="safe", pure=True).load_all(result.output) if d]
    assert not [d for d in documents if d["kind"] == "ConfigMap" and d["metadata"]["name"] == kueue.MANAGER_CONFIGMAP]

    # On the fleet's manager (heron, fleet.yaml) the shown configuration carries the multiKueue section.
    result = CliRunner().invoke(app, ["manifests", "heron", "--clusters", str(ROOT / "clusters")])
    assert result.exit_code == 0, result.output
    values = _shown_chart(result.output)["helmChart"]["values"]
    config = YAML(typ="safe", pure=True).load(values["managerConfig"]["controllerManagerConfigYaml"])
    assert config["multiKueue"]["origin"] == "corral-research"

    out = tmp_path / "manifests"
    result = CliRunner().invoke(app, ["manifests", "jaguar", "--clusters", str(ROOT / "clusters"), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "# helmChart:" in (out / "kueue.yaml").read_text()
    assert "helmChart" not in (out / "kueue-queues.yaml").read_text()


@pytest.mark.parametrize("name", ["heron", "ibis"])
def test_cloud_flavors_are_placed_by_quota_not_by_a_topology_kueue_could_never_fill(name):
    # A topology flavor (v0.12 to v0.19.2) admits only onto nodes that exist and carry every level: a cloud
    # pool at size 0 (heron's gpu-a10g, every ibis GPU pool) would never admit, and the autoscaler
    # never sees a pod to scale up for.
    flavors = of_kind(kueue_objects(FLEET.clusters[name]), "ResourceFlavor")
    assert flavors and all("topologyName" not in f["spec"] for f in flavors.values())


def test_an_onprem_pool_without_racks_gets_no_topology():
    cluster = FLEET.clusters["jaguar"]
    pool = next(p for p in cluster.node_pools if p.provider == "onprem" and p.racks)
    flavor = next(f for q in kueue.cluster_quotas(cluster) for f in q.flavors if pool.name in f.pools)
    assert kueue.flavor_topology(cluster, flavor) == "corral-onprem"
    unracked = cluster.model_copy(update={"node_pools": [
        p.model_copy(update={"racks": None}) if p.name == pool.name else p for p in cluster.node_pools]})
    assert kueue.flavor_topology(unracked, flavor) is None
