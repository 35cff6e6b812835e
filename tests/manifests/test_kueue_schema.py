"""The Kueue CRD validator itself (tests/manifests/kueue_schema.py): it must refuse
what the API server refuses, structural errors and CEL rules alike, or the
add-on's schema tests would prove nothing."""

from __future__ import annotations

import pytest

from .kueue_schema import (
    CRD_DIR,
    CRD_FILES,
    KUEUE_RELEASE,
    cel_rules,
    schemas,
    validate_kueue_object,
)

V1BETA2 = "kueue.x-k8s.io/v1beta2"


def flavor(**spec) -> dict:
    return {"apiVersion": V1BETA2, "kind": "ResourceFlavor", "metadata": {"name": "h100"}, "spec": spec}


def queue(**spec) -> dict:
    return {"apiVersion": V1BETA2, "kind": "ClusterQueue", "metadata": {"name": "robotics"}, "spec": spec}


GPU_GROUP = {"coveredResources": ["nvidia.com/gpu"],
             "flavors": [{"name": "h100", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 64}]}]}


def test_the_pinned_crds_are_kueues_own_files():
    assert {p.name for p in CRD_DIR.glob("*.yaml")} == set(CRD_FILES)
    assert f"tag {KUEUE_RELEASE} commit " in (CRD_DIR / "SOURCE").read_text()
    assert (V1BETA2, "Topology") in schemas()
    assert (V1BETA2, "ClusterQueue") in schemas() and (V1BETA2, "MultiKueueCluster") in schemas()


def test_every_cel_rule_of_the_pinned_crds_compiles_in_cel_python():
    # None is left out as impossible to evaluate: the 17 rules use only standard CEL
    # (has, size, all, filter, in, ternaries) and oldSelf.
    import celpy

    env = celpy.Environment()
    rules = cel_rules()
    assert len(rules) >= 15
    for _where, _path, rule in rules:
        env.compile(rule)


def test_a_valid_object_passes():
    assert validate_kueue_object(queue(cohortName="corral", resourceGroups=[GPU_GROUP])) == []
    assert validate_kueue_object(flavor(nodeLabels={"corral.dev/gpu-model": "H100"})) == []


@pytest.mark.parametrize(("obj", "problem"), [
    (queue(cohortName="corral", resourceGroup=[GPU_GROUP]), ".spec.resourceGroup: unknown field"),
    (queue(cohortName="Corral!", resourceGroups=[GPU_GROUP]), ".spec.cohortName: 'Corral!' does not match"),
    (queue(resourceGroups=[{**GPU_GROUP, "flavors": [{"name": "h100", "resources": [
        {"name": "nvidia.com/gpu", "nominalQuota": "lots"}]}]}]), "nominalQuota: 'lots' does not match"),
    (queue(namespaceSelector="all"), ".spec.namespaceSelector: 'all' is not of type object"),
    (flavor(nodeLabels={f"l{i}": "x" for i in range(9)}), ".spec.nodeLabels: more than 8 properties"),
    ({"apiVersion": V1BETA2, "kind": "LocalQueue", "metadata": {"name": "q", "namespace": "robotics"},
      "spec": {"clusterQueue": "Robotics"}}, ".spec.clusterQueue: 'Robotics' does not match"),
    ({"apiVersion": V1BETA2, "kind": "Topology", "metadata": {"name": "t"}, "spec": {"levels": []}},
     ".spec.levels: fewer than 1 items"),
    ({"apiVersion": V1BETA2, "kind": "AdmissionCheck", "metadata": {"name": "c"}, "spec": {}},
     ".spec: required field 'controllerName' is missing"),
])
def test_structural_errors_are_refused(obj, problem):
    found = validate_kueue_object(obj)
    assert any(problem in line for line in found), found


@pytest.mark.parametrize(("obj", "problem"), [
    # ClusterQueue: a borrowing limit needs a cohort (CEL on .spec).
    (queue(resourceGroups=[{**GPU_GROUP, "flavors": [{"name": "h100", "resources": [
        {"name": "nvidia.com/gpu", "nominalQuota": 64, "borrowingLimit": 8}]}]}]),
     "borrowingLimit must be nil when cohort is empty"),
    # ClusterQueue: every flavor covers every covered resource.
    (queue(resourceGroups=[{"coveredResources": ["nvidia.com/gpu", "cpu"], "flavors": GPU_GROUP["flavors"]}]),
     "flavors must have the same number of resources as the coveredResources"),
    # ClusterQueue: reclaim Never with borrowWithinCohort.
    (queue(preemption={"reclaimWithinCohort": "Never", "borrowWithinCohort": {"policy": "LowerPriority"}}),
     "reclaimWithinCohort=Never and borrowWithinCohort.Policy!=Never"),
    # ResourceFlavor: a topology needs node labels.
    (flavor(topologyName="sf1", nodeLabels={}), "at least one nodeLabel is required when topology is set"),
    # A rule that cannot evaluate (no nodeLabels at all) refuses the object, as the API server does.
    (flavor(topologyName="sf1"), "could not be evaluated: no such member in mapping: 'nodeLabels'"),
    (flavor(nodeLabels={"a": "b"}, tolerations=[{"key": "k", "operator": "Exists", "value": "v"}]),
     "a value must be empty when 'operator' is 'Exists'"),
    # Topology: hostname only at the lowest level, levels unique.
    ({"apiVersion": V1BETA2, "kind": "Topology", "metadata": {"name": "t"},
      "spec": {"levels": [{"nodeLabel": "kubernetes.io/hostname"}, {"nodeLabel": "corral.dev/rack"}]}},
     "the kubernetes.io/hostname label can only be used at the lowest level of topology"),
    ({"apiVersion": V1BETA2, "kind": "Topology", "metadata": {"name": "t"},
      "spec": {"levels": [{"nodeLabel": "corral.dev/rack"}, {"nodeLabel": "corral.dev/rack"}]}},
     "must be unique"),
])
def test_cel_rules_are_evaluated(obj, problem):
    found = validate_kueue_object(obj)
    assert any(problem in line for line in found), found


def test_transition_rules_run_only_on_updates():
    topology = {"apiVersion": V1BETA2, "kind": "Topology", "metadata": {"name": "t"},
                "spec": {"levels": [{"nodeLabel": "corral.dev/rack"}, {"nodeLabel": "kubernetes.io/hostname"}]}}
    changed = {**topology, "spec": {"levels": [{"nodeLabel": "kubernetes.io/hostname"}]}}
    assert validate_kueue_object(changed) == []
    assert any("field is immutable" in p for p in validate_kueue_object(changed, old=topology))
    assert validate_kueue_object(topology, old=topology) == []


def test_an_unknown_kind_is_a_problem_not_a_pass():
    found = validate_kueue_object({"apiVersion": V1BETA2, "kind": "Workload", "metadata": {"name": "w"}})
    assert found and "no CRD for kueue.x-k8s.io/v1beta2 Workload" in found[0]
