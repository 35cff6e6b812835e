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
    multikueue_objects,
    worker_objects,
)
from corral.manifests.validate import validate_objects
from corral.model import load_fleet
from corral.model.document import Document
from corral.model.fleet import FleetFile, LoadedFleet
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
    cluster["spec"]["kubeConfig"]["locationType"] = "Vault"
    assert any("locationType" in p for p in validate_kueue_object(cluster))
    config = copy.deepcopy(multikueue_objects(fleet_of(tmp_path))[2])
    config["spec"]["clusters"] = [f"w{i}" for i in range(11)]  # the pinned CRD: at most 10
    assert validate_kueue_object(config)


def test_the_check_names_the_config_which_names_every_worker_whose_secret_the_credential_writes(tmp_path):
    *clusters, config, check = multikueue_objects(fleet_of(tmp_path))
    assert check["spec"] == {"controllerName": MULTIKUEUE_CONTROLLER, "parameters": {
        "apiGroup": "kueue.x-k8s.io", "kind": "MultiKueueConfig", "name": config["metadata"]["name"]}}
    assert check["metadata"]["name"] == ADMISSION_CHECK
    assert config["spec"]["clusters"] == ["jaguar", "ibis"] == [c["metadata"]["name"] for c in clusters]
    for cluster in clusters:
        # The Secret corral fleet multikueue-credentials writes on the manager (corral/certs/multikueue.py).
        assert cluster["spec"]["kubeConfig"] == {"locationType": "Secret",
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
