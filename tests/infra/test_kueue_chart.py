"""`pulumi up` installs Kueue itself from its Helm chart at the pinned release (issue 29 item 1).

Kueue's installation page at v0.19.2 (site/content/en/docs/getting-started/installation.md, "Install by
Helm"): `helm install kueue oci://registry.k8s.io/kueue/charts/kueue --version=0.19.2
--namespace kueue-system`. The chart's values are charts/kueue/values.yaml at that tag.
"""

from __future__ import annotations

import pytest
from ruamel.yaml import YAML

from corral.manifests import kueue, render, versions
from corral.model import load_fleet

from .conftest import EXAMPLES, real_plan

pytest.importorskip("pulumi_kubernetes")

from tests.manifests.test_addons_pulumi import CLOUD_SETTINGS
from tests.manifests.test_addons_pulumi import plan as recorded_plan

CHART_TYPE = "kubernetes:helm.sh/v4:Chart"
FLEET = load_fleet([EXAMPLES])


def _config(values: dict) -> dict:
    return YAML(typ="safe", pure=True).load(values["managerConfig"]["controllerManagerConfigYaml"])


def test_the_chart_version_and_the_image_are_the_pinned_release():
    repository, tag = versions.KUEUE.rsplit(":", 1)
    # The chart of release vX.Y.Z is version X.Y.Z (site/hugo.toml chart_version at the tag).
    assert tag == f"v{versions.KUEUE_CHART_VERSION}"
    installed = kueue.chart(FLEET.clusters["jaguar"])
    assert (installed.chart, installed.version, installed.namespace) == (
        "oci://registry.k8s.io/kueue/charts/kueue", versions.KUEUE_CHART_VERSION, "kueue-system")
    image = installed.values["controllerManager"]["manager"]["image"]
    # Not the chart's default staging repository (values.yaml at the tag): the promoted, pinned image.
    assert (image["repository"], image["tag"]) == (repository, tag) == ("registry.k8s.io/kueue/kueue", "v0.19.2")


def test_the_plan_installs_the_chart_with_the_cluster_files_configuration():
    # heron is the example fleet's MultiKueue manager (fleet.yaml): its configuration carries multiKueue.
    cluster = FLEET.clusters["heron"]
    charts = [r for r in real_plan(cluster, EXAMPLES).resources if r["type"] == CHART_TYPE]
    assert [c["name"] for c in charts] == ["heron-addons-kueue-chart"]
    inputs = charts[0]["inputs"]
    assert inputs["chart"] == kueue.CHART
    assert inputs["version"] == versions.KUEUE_CHART_VERSION
    assert inputs["namespace"] == "kueue-system"
    assert inputs["name"] == "kueue"
    section = {"origin": "corral-research", "workerLostTimeout": "15m"}    # fleet.yaml's
    assert inputs["values"] == kueue.chart_values(cluster, section)
    config = _config(inputs["values"])
    assert config["multiKueue"] == section
    assert config["waitForPodsReady"]["timeout"] == f"{cluster.scheduling.kueue.wait_for_pods_ready_minutes}m"
    assert "featureGates" not in config
    assert config["resources"]["excludeResourcePrefixes"] == list(kueue.EXCLUDED_RESOURCE_PREFIXES)


def test_a_worker_clusters_chart_has_no_multikueue_section():
    charts = [r for r in real_plan(FLEET.clusters["jaguar"], EXAMPLES).resources if r["type"] == CHART_TYPE]
    assert _config(charts[0]["inputs"]["values"]) == kueue.manager_config(FLEET.clusters["jaguar"])


def _addons(cluster, **kwargs) -> list:
    """What corral.infra.addons.Addons registers for `cluster` under the recording mocks."""
    import pulumi

    from corral.infra.addons import Addons
    from corral.infra.platform import ClusterContext
    from tests.manifests.test_addons_pulumi import KUBECONFIG, Recorder

    recorder = Recorder()
    pulumi.runtime.set_mocks(recorder.mocks, project="corral", stack=cluster.name, preview=False, monitor=recorder)

    @pulumi.runtime.test
    def program():
        addons = Addons(f"{cluster.name}-addons", ClusterContext.of(cluster), pulumi.Output.secret(KUBECONFIG),
                        cloud_settings=CLOUD_SETTINGS[cluster.name], **kwargs)
        return addons.urn

    program()
    return recorder.registered


def test_a_cluster_without_kueue_installs_no_chart():
    cluster = FLEET.clusters["ibis"].model_copy(deep=True)
    assert [r.name for r in _addons(cluster) if r.type == CHART_TYPE] == ["ibis-addons-kueue-chart"]
    cluster.scheduling.kueue.enabled = False
    assert not [r for r in _addons(cluster) if r.type == CHART_TYPE]


def test_the_chart_comes_after_its_namespace_and_the_queues_after_the_charts_crds():
    registered = recorded_plan("jaguar", CLOUD_SETTINGS["jaguar"])
    by_name = {r.name: r for r in registered}
    chart = by_name["jaguar-addons-kueue-chart"]
    assert chart.type == CHART_TYPE
    assert any(urn.endswith("::jaguar-addons-kueue") for urn in chart.depends_on), chart.depends_on
    assert "jaguar-addons-provider" in chart.provider
    queues = by_name["jaguar-addons-kueue-queues"]
    assert any(urn.endswith("::jaguar-addons-kueue-chart") for urn in queues.depends_on), queues.depends_on
    before = by_name["jaguar-addons-kueue"]
    assert not any("kueue-chart" in urn for urn in before.depends_on)
    # The namespace before the chart, every Kueue kind after it.
    assert {o["kind"] for o in before.inputs["objs"]} == {"Namespace", "PriorityClass"}
    assert all(o["apiVersion"].startswith("kueue.x-k8s.io/") for o in queues.inputs["objs"])


@pytest.mark.parametrize("name", ["heron", "ibis", "jaguar"])
def test_one_manager_configuration_the_charts_and_no_configmap_of_corrals(name):
    cluster = FLEET.clusters[name]
    rendered = [o for a in render(cluster) for o in a.every_object]
    assert not [o for o in rendered if o["kind"] == "ConfigMap" and o["metadata"]["name"] == kueue.MANAGER_CONFIGMAP]
    values = kueue.chart_values(cluster)
    # The chart names its ConfigMap <fullname>-manager-config: fullname pinned to "kueue".
    assert values["fullnameOverride"] + "-manager-config" == kueue.MANAGER_CONFIGMAP
    assert _config(values) == kueue.manager_config(cluster)


def test_the_fleet_managers_multikueue_section_reaches_the_charts_values():
    from corral.manifests.fleet_addons import load_fleet_beside

    fleet = load_fleet_beside(EXAMPLES)
    heron = fleet.clusters.clusters["heron"]
    chart = next(r for r in _addons(heron, fleet=fleet) if r.type == CHART_TYPE)
    config = _config(chart.inputs["values"])
    assert config.pop("multiKueue") == {"origin": "corral-research", "workerLostTimeout": "15m"}
    assert config == kueue.manager_config(heron)
    # Without the fleet, the same cluster's chart has none.
    alone = next(r for r in _addons(heron) if r.type == CHART_TYPE)
    assert "multiKueue" not in _config(alone.inputs["values"])


def test_the_charts_crds_are_retained_like_the_config_groups(monkeypatch):
    """The chart's children (its CRDs among them) pass through the same retain transform as the ConfigGroups'."""
    from tests.manifests.test_addons_pulumi import Recorder

    transforms: dict[str, int] = {}
    register = Recorder.RegisterResource

    def counting(self, request):
        transforms[request.name] = len(request.transforms)
        return register(self, request)

    monkeypatch.setattr(Recorder, "RegisterResource", counting)
    _addons(FLEET.clusters["jaguar"])
    assert transforms["jaguar-addons-kueue-chart"] == transforms["jaguar-addons-kueue"] == 1


def test_the_charts_pods_meet_the_namespaces_restricted_level():
    cluster = FLEET.clusters["jaguar"]
    namespace = next(o for o in kueue.before_chart(cluster) if o["kind"] == "Namespace")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    manager = kueue.chart_values(cluster)["controllerManager"]["manager"]
    # Pod Security "restricted": non-root, seccomp RuntimeDefault or Localhost, no privilege
    # escalation, every capability dropped (kubernetes.io/docs/concepts/security/pod-security-standards).
    assert manager["podSecurityContext"]["runAsNonRoot"] is True
    assert manager["podSecurityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert manager["containerSecurityContext"]["allowPrivilegeEscalation"] is False
    assert manager["containerSecurityContext"]["capabilities"]["drop"] == ["ALL"]
    # KueueViz's pods (frontend and backend) would be other pods under the level: off.
    assert kueue.chart_values(cluster)["enableKueueViz"] is False


def test_the_kueue_manager_runs_at_cluster_critical_priority():
    # Its webhooks admit every queued Job: evicting it would stop job creation cluster-wide.
    manager = kueue.chart_values(FLEET.clusters["jaguar"])["controllerManager"]["manager"]
    assert manager["priorityClassName"] == "system-cluster-critical"
