"""MultiKueue objects of a fleet (corral/manifests/multikueue.py): valid against the pinned CRDs, and in agreement."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from corral.certs.multikueue import (
    KUBECONFIG_KEY,
    NAMESPACE,
    SERVICE_ACCOUNT,
    manager_secret_name,
)
from corral.manifests.multikueue import (
    ADMISSION_CHECK,
    JOB_KIND_RULES,
    KUEUE_RULES,
    MULTIKUEUE_CONTROLLER,
    kueue_config,
    manager_objects,
    multikueue_objects,
    worker_objects,
    workers_agree,
)
from corral.manifests.validate import validate_objects
from corral.model import load_fleet
from corral.model.document import Document
from corral.model.fleet import FleetFile, LoadedFleet
from corral.model.kueue import cluster_quotas
from tests.manifests.kueue_schema import validate_kueue_object

ROOT = Path(__file__).resolve().parents[2]


def fleet_of(tmp_path: Path, **multi_kueue) -> LoadedFleet:
    """A fleet over the example clusters, read without the rules across files (the objects' shape only)."""
    spec = {"manager": "heron", "workers": ["jaguar", "ibis"], "teams": ["robotics"], **multi_kueue}
    data = {"apiVersion": "corral.dev/v1", "kind": "Fleet", "name": "research", "multiKueue": spec}
    path = tmp_path / "fleet.yaml"
    path.write_text("{}\n")
    return LoadedFleet(FleetFile.model_validate(data), Document.read(path), load_fleet([ROOT / "clusters"]))


def test_the_manager_multikueue_objects_validate_against_the_pinned_crds(tmp_path):
    objects = multikueue_objects(fleet_of(tmp_path))
    assert [o["kind"] for o in objects] == ["MultiKueueCluster", "MultiKueueCluster", "MultiKueueConfig",
                                            "AdmissionCheck"]
    for obj in objects:
        assert validate_kueue_object(obj) == [], obj


def test_the_crd_check_would_catch_a_wrong_field(tmp_path):
    cluster = copy.deepcopy(multikueue_objects(fleet_of(tmp_path))[0])
    cluster["spec"]["clusterSource"]["kubeConfig"]["locationType"] = "Vault"
    assert any("locationType" in p for p in validate_kueue_object(cluster))
    config = copy.deepcopy(multikueue_objects(fleet_of(tmp_path))[2])
    config["spec"]["clusters"] = [f"w{i}" for i in range(21)]  # the pinned CRD: at most 20
    assert validate_kueue_object(config)


def test_the_check_names_the_config_which_names_every_worker_whose_secret_the_credential_writes(tmp_path):
    *clusters, config, check = multikueue_objects(fleet_of(tmp_path))
    assert check["spec"] == {"controllerName": MULTIKUEUE_CONTROLLER, "parameters": {
        "apiGroup": "kueue.x-k8s.io", "kind": "MultiKueueConfig", "name": config["metadata"]["name"]}}
    assert check["metadata"]["name"] == ADMISSION_CHECK
    assert config["spec"]["clusters"] == ["jaguar", "ibis"] == [c["metadata"]["name"] for c in clusters]
    for cluster in clusters:
        # The Secret corral fleet multikueue-credentials writes on the manager (corral/certs/multikueue.py).
        assert cluster["spec"]["clusterSource"]["kubeConfig"] == {"locationType": "Secret",
                                                 "location": manager_secret_name(cluster["metadata"]["name"])}
    assert (NAMESPACE, KUBECONFIG_KEY) == ("kueue-system", "kubeconfig")


def test_the_worker_role_has_kueues_rules_for_the_dispatched_kinds_only(tmp_path):
    role = worker_objects(fleet_of(tmp_path), "jaguar")[1]
    assert role["rules"] == [*KUEUE_RULES, *JOB_KIND_RULES["batch/job"]]
    granted = {(group, resource) for rule in role["rules"] for group in rule["apiGroups"]
               for resource in rule["resources"]}
    assert ("", "pods") not in granted and ("", "secrets") not in granted
    assert not any(group == "jobset.x-k8s.io" for group, _ in granted)
    assert all("*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"] for rule in role["rules"])

    with_jobsets = worker_objects(fleet_of(tmp_path, jobKinds=["batch/job", "jobset.x-k8s.io/jobset"]), "ibis")[1]
    assert with_jobsets["rules"][len(role["rules"]):] == list(JOB_KIND_RULES["jobset.x-k8s.io/jobset"])


def test_the_worker_role_is_bound_to_the_service_account_the_credential_uses(tmp_path):
    account, role, binding = worker_objects(fleet_of(tmp_path), "jaguar")
    assert account["metadata"] | {"labels": None} == {"name": SERVICE_ACCOUNT, "namespace": NAMESPACE, "labels": None}
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}]


@pytest.mark.parametrize("worker", ["jaguar", "ibis"])
def test_the_worker_objects_validate_against_the_kubernetes_schemas(tmp_path, worker):
    fleet = fleet_of(tmp_path)
    kubernetes = fleet.clusters.clusters[worker].kubernetes.version
    _, problems = validate_objects(worker_objects(fleet, worker), kubernetes)
    assert problems == [], problems


def test_the_manager_config_sets_its_origin_and_only_a_timeout_the_file_sets(tmp_path):
    assert kueue_config(fleet_of(tmp_path)) == {"origin": "corral-research"}
    assert kueue_config(fleet_of(tmp_path, workerLostTimeout="5m")) == {"origin": "corral-research",
                                                                         "workerLostTimeout": "5m"}


# --- The dispatched teams' queues: the manager's, summed from the workers' ---------------


def hybrid_clusters(tmp_path: Path) -> Path:
    """The example clusters with Kueue on everywhere and the robotics team on all three: reserving the
    H100s on jaguar (as it does) and the A100s on ibis, and only its namespace on the manager heron."""
    clusters = tmp_path / "clusters"
    clusters.mkdir()
    for path in (ROOT / "clusters").glob("*.yaml"):
        (clusters / path.name).write_text(path.read_text())
    edits = {
        "heron": ("  teams:\n", "  teams:\n    - {name: robotics, namespaces: [robotics]}\n"),
        "ibis": ("scheduling:\n  binPacking: true\n", ("scheduling:\n  binPacking: true\n  teams:\n"
                 "    - {name: robotics, namespaces: [robotics], reservedPools: [gpu-a100]}\n")),
    }
    for name, (old, new) in edits.items():
        text = (clusters / f"{name}.yaml").read_text()
        if "{name: robotics" not in text:
            assert old in text, (name, old)
            text = text.replace(old, new, 1)
        if "kueue:" not in text:
            text = text.replace("scheduling:\n", "scheduling:\n  kueue: {enabled: true}\n", 1)
        (clusters / f"{name}.yaml").write_text(text)
    return clusters


FLEET = ("apiVersion: corral.dev/v1\nkind: Fleet\nname: research\nmultiKueue:\n  manager: heron\n"
         "  workers: [jaguar, ibis]\n  teams: [robotics]\n")


def loaded(tmp_path: Path) -> LoadedFleet:
    """The fleet heron -> [jaguar, ibis] for robotics over `hybrid_clusters`, with every rule."""
    from corral.model.fleet import load_fleet_file

    clusters = hybrid_clusters(tmp_path)
    (tmp_path / "fleet.yaml").write_text(FLEET)
    return load_fleet_file(tmp_path / "fleet.yaml", clusters)


def test_every_manager_object_validates_against_the_pinned_crds(tmp_path):
    fleet = loaded(tmp_path)
    configmap, *objects = manager_objects(fleet)
    assert configmap["kind"] == "ConfigMap"
    assert {o["kind"] for o in objects} == {"MultiKueueCluster", "MultiKueueConfig", "AdmissionCheck",
                                            "ClusterQueue", "ResourceFlavor"}
    for obj in objects:
        assert validate_kueue_object(obj) == [], obj


def test_the_manager_queue_holds_the_workers_quota_and_waits_for_the_check(tmp_path):
    fleet = loaded(tmp_path)
    queue = next(o for o in manager_objects(fleet) if o["kind"] == "ClusterQueue")
    assert queue["metadata"]["name"] == "team-robotics"
    assert queue["spec"]["admissionChecksStrategy"] == {"admissionChecks": [{"name": ADMISSION_CHECK}]}
    assert "admissionChecks" not in queue["spec"]          # v1beta1's field, gone in v1beta2
    assert "cohortName" not in queue["spec"]
    # Each worker's own flavor for the team at its nominal quota (jaguar: 8 hosts x 8 H100;
    # ibis: up to 32 a2-highgpu-8g x 8 A100), the shared flavors (no nominal quota) left out.
    expected = {}
    for worker in fleet.workers:
        for q in cluster_quotas(worker):
            if q.team == "robotics":
                for flavor in q.flavors:
                    if flavor.nominal:
                        expected[flavor.flavor] = expected.get(flavor.flavor, 0) + flavor.nominal
    got = {f["name"]: f["resources"][0]["nominalQuota"] for f in queue["spec"]["resourceGroups"][0]["flavors"]}
    assert got == expected == {"h100-robotics": 64, "a100-robotics": 256}
    flavors = {o["metadata"]["name"]: o for o in manager_objects(fleet) if o["kind"] == "ResourceFlavor"}
    assert set(flavors) == set(got)
    assert all(f["spec"] == {} for f in flavors.values())  # quota only: nothing runs on the manager


def test_every_dispatched_queue_exists_on_every_worker_with_the_same_name(tmp_path):
    from corral.manifests import kueue

    fleet = loaded(tmp_path)
    manager_local = {(o["metadata"]["namespace"], o["metadata"]["name"])
                     for o in kueue.objects(fleet.manager) if o["kind"] == "LocalQueue"
                     and o["spec"]["clusterQueue"] == "team-robotics"}
    assert manager_local == {("robotics", "robotics")}
    for worker in fleet.workers:
        rendered = kueue.objects(worker)
        local = {(o["metadata"]["namespace"], o["metadata"]["name"]) for o in rendered if o["kind"] == "LocalQueue"}
        assert manager_local <= local, worker.name
        for obj in rendered:
            if obj["apiVersion"].startswith("kueue.x-k8s.io/"):
                assert validate_kueue_object(obj) == [], obj
    assert workers_agree(fleet) == []


def test_a_worker_without_the_managers_local_queue_is_named(tmp_path):
    fleet = loaded(tmp_path)
    # The manager's team gains a namespace the workers' teams lack (the fleet rules refuse this
    # in a file; here the model is changed after loading, as a later edit could).
    manager_team = next(t for t in fleet.manager.scheduling.teams if t.name == "robotics")
    manager_team.namespaces.append("robotics-eval")
    assert workers_agree(fleet) == [
        "worker jaguar has no LocalQueue robotics-eval/robotics of team robotics",
        "worker ibis has no LocalQueue robotics-eval/robotics of team robotics",
    ]


def test_the_fleet_rules_refuse_a_team_whose_namespace_a_worker_lacks(tmp_path):
    clusters = hybrid_clusters(tmp_path)
    heron = clusters / "heron.yaml"
    heron.write_text(heron.read_text().replace("{name: robotics, namespaces: [robotics]}",
                                               "{name: robotics, namespaces: [robotics, robotics-eval]}"))
    (tmp_path / "fleet.yaml").write_text(FLEET)
    from corral.model import ValidationFailed
    from corral.model.fleet import load_fleet_file

    with pytest.raises(ValidationFailed) as failed:
        load_fleet_file(tmp_path / "fleet.yaml", clusters)
    messages = [p.message for p in failed.value.problems]
    assert any(m.startswith("team robotics on worker jaguar (") and "lacks namespace robotics-eval" in m
               for m in messages)
    assert any(m.startswith("team robotics on worker ibis (") for m in messages)


def test_the_managers_kueue_configuration_gets_the_multikueue_section_and_keeps_the_add_ons(tmp_path):
    from ruamel.yaml import YAML

    from corral.manifests import kueue

    fleet = loaded(tmp_path)
    configmap = manager_objects(fleet)[0]
    addon = kueue.manager_configmap(fleet.manager)
    assert configmap["metadata"] == addon["metadata"]
    yaml = YAML(typ="safe", pure=True)
    config = yaml.load(configmap["data"][kueue.MANAGER_CONFIG_KEY])
    before = yaml.load(addon["data"][kueue.MANAGER_CONFIG_KEY])
    assert config.pop("multiKueue") == {"origin": "corral-research"}
    assert config == before
    # No feature gate for MultiKueue: beta and on at the pinned release; MultiKueueBatchJobWithManagedBy
    # is gone at v0.19.2 (the Job's managedBy is GA from Kubernetes 1.35).
    assert "MultiKueue" not in config.get("featureGates", {})
    assert "MultiKueueBatchJobWithManagedBy" not in config.get("featureGates", {})
