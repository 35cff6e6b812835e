"""`pulumi up` applies the fleet's MultiKueue objects (issue 29 item 3): the program under the mocks.

The example fleet (fleet.yaml beside clusters/): heron is the manager,
jaguar and ibis its workers. What the program registers is what `corral
plan` shows (it runs the program) and what `corral manifests` prints
(corral/manifests/fleet_addons.py, `cluster_addons`, serves both).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from ruamel.yaml import YAML
from typer.testing import CliRunner

from corral.cli import app
from corral.manifests import ManifestError, object_key, render
from corral.manifests.fleet_addons import (
    cluster_addons,
    load_fleet_beside,
    merge_fleet_objects,
)
from corral.model import load_fleet

from .conftest import EXAMPLES, real_plan

FLEET_NAME = "corral-research"      # the MultiKueueConfig and origin: corral-<fleet name> (fleet.yaml: research)
MANAGER_ROLE = "corral-multikueue-manager-heron"
runner = CliRunner()


def _k8s_objects(plan) -> list[dict]:
    """Every Kubernetes object the plan applies: each ConfigGroup's objects and each typed resource's."""
    objects = []
    for resource in plan.resources:
        if resource["type"] == "kubernetes:yaml/v2:ConfigGroup":
            objects += resource["inputs"]["objs"]
        elif resource["type"].startswith("kubernetes:") and resource["type"].count(":") == 2 \
                and "metadata" in resource["inputs"]:
            kind = resource["type"].rsplit(":", 1)[1]
            metadata = dict(resource["inputs"]["metadata"])
            if metadata.get("name") == "[secret]":
                # A bootstrap token's Secret is named after the (masked) token: its resource's name stands in.
                metadata["name"] = resource["name"]
            # A NamespacePatch patches the Namespace of that name: the same object.
            objects.append({"kind": kind.removesuffix("Patch"), "metadata": metadata})
    return objects


def _kueue_configs(plan) -> list[str]:
    """Kueue's manager configurations in the plan: kueue-manager-config ConfigMaps, and a Kueue Helm
    chart's managerConfig value (the chart renders the ConfigMap from it)."""
    configs = [obj["data"]["controller_manager_config.yaml"] for obj in _k8s_objects(plan)
               if obj["kind"] == "ConfigMap" and obj["metadata"]["name"] == "kueue-manager-config"]
    for resource in plan.resources:
        if resource["type"].startswith("kubernetes:helm.sh/") and "kueue" in str(resource["inputs"].get("chart")):
            configs.append(resource["inputs"]["values"]["managerConfig"]["controllerManagerConfigYaml"])
    return configs


@pytest.fixture(scope="module")
def plans():
    fleet = load_fleet([EXAMPLES])
    return {name: real_plan(fleet.clusters[name], EXAMPLES) for name in ("heron", "jaguar", "ibis")}


def test_the_managers_plan_applies_the_multikueue_objects(plans):
    objects = {object_key(obj): obj for obj in _k8s_objects(plans["heron"])}
    assert {"MultiKueueCluster/jaguar", "MultiKueueCluster/ibis", f"MultiKueueConfig/{FLEET_NAME}",
            "AdmissionCheck/corral-multikueue"} <= objects.keys()
    assert objects[f"MultiKueueConfig/{FLEET_NAME}"]["spec"]["clusters"] == ["jaguar", "ibis"]
    # The dispatched team's queue is the fleet's (the MultiKueue check, the workers' quota), not the add-on's.
    robotics = objects["ClusterQueue/team-robotics"]
    assert robotics["spec"]["admissionChecksStrategy"] == {"admissionChecks": [{"name": "corral-multikueue"}]}
    assert "cohort" not in robotics["spec"]
    # Flavors of the workers' quota the manager itself lacks, for quota only.
    assert objects["ResourceFlavor/h100-robotics"]["spec"] == {}


def test_the_manager_runs_exactly_one_kueue_configuration_and_it_is_the_fleets(plans):
    configs = _kueue_configs(plans["heron"])
    assert len(configs) == 1, configs
    config = YAML(typ="safe").load(configs[0])
    assert config["multiKueue"]["origin"] == FLEET_NAME
    assert config["multiKueue"]["workerLostTimeout"] == "15m"


@pytest.mark.parametrize("name", ["heron", "jaguar", "ibis"])
def test_no_object_reaches_pulumi_twice(plans, name):
    """Two resources for one object would share a URN: `pulumi up` would fail, or two would fight over it."""
    keys = [object_key(obj) for obj in _k8s_objects(plans[name])]
    assert len(keys) > 20
    assert sorted(key for key in set(keys) if keys.count(key) > 1) == []


@pytest.mark.parametrize("worker", ["jaguar", "ibis"])
def test_the_workers_plans_apply_the_managers_least_privilege_role(plans, worker):
    objects = {object_key(obj): obj for obj in _k8s_objects(plans[worker])}
    role = objects[f"ClusterRole/{MANAGER_ROLE}"]
    assert {"apiGroups": ["batch"], "resources": ["jobs"],
            "verbs": ["create", "delete", "get", "list", "watch"]} in role["rules"]
    assert not any("pods" in rule["resources"] for rule in role["rules"])
    assert "ServiceAccount/kueue-system/corral-multikueue-manager" in objects
    binding = objects[f"ClusterRoleBinding/{MANAGER_ROLE}"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "corral-multikueue-manager",
                                    "namespace": "kueue-system"}]
    # A worker runs no dispatching objects of its own.
    assert not any(key.startswith(("MultiKueue", "AdmissionCheck")) for key in objects)


def _fleet_folder(tmp_path: Path, fleet_text: str) -> Path:
    clusters = tmp_path / "clusters"
    clusters.mkdir()
    for path in EXAMPLES.glob("*.yaml"):
        shutil.copy(path, clusters / path.name)
    (tmp_path / "fleet.yaml").write_text(fleet_text)
    return clusters


def test_a_cluster_not_in_the_fleet_is_unchanged(tmp_path):
    text = (EXAMPLES.parent / "fleet.yaml").read_text().replace("workers: [jaguar, ibis]", "workers: [jaguar]")
    clusters = _fleet_folder(tmp_path, text)
    ibis = load_fleet([clusters]).clusters["ibis"]
    with_fleet = real_plan(ibis, clusters)
    without_fleet = real_plan(ibis)
    assert with_fleet.snapshot() == without_fleet.snapshot()
    assert cluster_addons(ibis, load_fleet_beside(clusters)) == render(ibis)


def test_a_broken_fleet_file_stops_the_plan_at_its_line(tmp_path):
    text = (EXAMPLES.parent / "fleet.yaml").read_text().replace("workers: [jaguar, ibis]", "workers: [jaguar, kestrl]")
    clusters = _fleet_folder(tmp_path, text)
    line = text.splitlines().index("  workers: [jaguar, kestrl]") + 1
    for command in (["plan", "heron"], ["manifests", "heron"]):
        result = runner.invoke(app, [*command, "--clusters", str(clusters)])
        assert result.exit_code == 1, result.output
        assert isinstance(result.exception, SystemExit) and "Traceback" not in result.output
        assert f"{tmp_path / 'fleet.yaml'}:{line}:" in result.output, result.output
        assert "multiKueue.workers[1]: no cluster 'kestrl'" in result.output


def test_corral_manifests_shows_what_the_plan_applies(plans):
    result = runner.invoke(app, ["manifests", "heron", "--clusters", str(EXAMPLES)])
    assert result.exit_code == 0, result.output
    shown = {object_key(obj) for obj in YAML(typ="safe").load_all(result.output) if obj}
    applied = {object_key(obj) for obj in _k8s_objects(plans["heron"])}
    assert f"MultiKueueConfig/{FLEET_NAME}" in shown
    # The plan also holds the bootstrap tokens and the cloud settings, which are not add-on manifests.
    assert shown <= applied
    assert {key for key in applied - shown if not key.startswith(("Secret/", "ConfigMap/kube-system/"))} == set()


def test_a_fleet_object_replaces_the_addons_object_of_the_same_key():
    fleet = load_fleet_beside(EXAMPLES)
    heron = fleet.manager
    merged = cluster_addons(heron, fleet)
    keys = [object_key(obj) for addon in merged for obj in addon.every_object]
    assert keys.count("ClusterQueue/team-robotics") == 1
    plain = [object_key(obj) for addon in render(heron) for obj in addon.every_object]
    assert set(plain) <= set(keys)
    # The merge refuses a fleet that renders one key twice: one of the two would be lost.
    addons = render(heron)
    queue = next(obj for addon in addons for obj in addon.objects if object_key(obj) == "ClusterQueue/team-robotics")
    with pytest.raises(ManifestError, match="ClusterQueue/team-robotics is rendered twice"):
        merge_fleet_objects(addons, [queue, queue])


def test_a_cluster_other_than_the_fleets_copy_is_refused():
    fleet = load_fleet_beside(EXAMPLES)
    edited = fleet.manager.model_copy(update={"description": "another heron"})
    with pytest.raises(ManifestError, match="is not the one fleet research"):
        cluster_addons(edited, fleet)


def _run_program_as_pulumi_up(stack: str, clusters: Path) -> list:
    """`pulumi up -s <stack>`'s program under the mocks: main() with no cluster, which loads
    clusters/<stack>.yaml and the fleet file itself (CORRAL_CLUSTERS names the folder)."""
    import pulumi
    from pulumi.runtime import settings
    from pulumi.runtime.stack import run_pulumi_func
    from pulumi.runtime.sync_await import _sync_await

    from corral.infra import plan as plan_module
    from corral.infra import program

    config, secret_keys = plan_module.read_stack_config(plan_module.stack_config_file(stack, clusters))
    monitor = plan_module.RecordingMonitor(plan_module.PlanMocks())
    settings.ROOT.set(None)
    pulumi.runtime.set_all_config(config, secret_keys)
    pulumi.runtime.set_mocks(monitor.mocks, project=plan_module.PROJECT, stack=stack, preview=True, monitor=monitor)
    try:
        _sync_await(run_pulumi_func(program.main))
    finally:
        settings.ROOT.set(None)
    return monitor.registrations


def test_pulumi_up_loads_the_fleet_file_beside_the_clusters_folder(tmp_path, monkeypatch):
    clusters = _fleet_folder(tmp_path, (EXAMPLES.parent / "fleet.yaml").read_text())
    monkeypatch.setenv("CORRAL_CLUSTERS", str(clusters))
    registrations = _run_program_as_pulumi_up("jaguar", clusters)
    kinds = {(obj["kind"], obj["metadata"]["name"]) for r in registrations
             if r.type == "kubernetes:yaml/v2:ConfigGroup" for obj in r.inputs["objs"]}
    assert ("ClusterRole", MANAGER_ROLE) in kinds


def test_pulumi_up_stops_at_a_broken_fleet_file_with_its_line(tmp_path, monkeypatch):
    from corral.infra import program

    text = (EXAMPLES.parent / "fleet.yaml").read_text().replace("teams: [robotics]", "teams: [robotix]")
    clusters = _fleet_folder(tmp_path, text)
    monkeypatch.setenv("CORRAL_CLUSTERS", str(clusters))
    line = text.splitlines().index("  teams: [robotix]") + 1
    with pytest.raises(program.ProgramError, match=rf"fleet.yaml:{line}:\d+: multiKueue.teams\[0\]: team 'robotix'"):
        program.load_stack_fleet()
