"""corral.infra.addons under Pulumi mocks: what `corral plan` registers for the add-ons."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pulumi = pytest.importorskip("pulumi")
pytest.importorskip("pulumi_kubernetes")

from pulumi.runtime import mocks as pulumi_mocks, rpc  # noqa: E402

from corral.infra.platform import ClusterContext  # noqa: E402
from corral.manifests import render  # noqa: E402
from corral.model import load_fleet  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "clusters"
KUBECONFIG = "apiVersion: v1\nkind: Config\n"


@dataclass
class Registered:
    type: str
    name: str
    custom: bool
    inputs: dict
    depends_on: list[str]
    provider: str


def _plain(value: Any) -> Any:
    if rpc.is_rpc_secret(value):
        return _plain(rpc.unwrap_rpc_secret(value))
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


class Mocks(pulumi.runtime.Mocks):
    def new_resource(self, args):
        return f"{args.name}-id", dict(args.inputs)

    def call(self, args):
        raise AssertionError(f"add-ons must not invoke {args.token} at plan time")


class Recorder(pulumi_mocks.MockMonitor):
    def __init__(self):
        super().__init__(Mocks())
        self.registered: list[Registered] = []

    def RegisterResource(self, request):
        response = super().RegisterResource(request)
        if request.type != "pulumi:pulumi:Stack":
            self.registered.append(Registered(
                request.type, request.name, request.custom,
                _plain(rpc.deserialize_properties(request.object)),
                list(request.dependencies), request.provider,
            ))
        return response


def plan(name: str, cloud_settings=None) -> list[Registered]:
    from corral.infra.addons import Addons

    cluster = load_fleet([EXAMPLES]).clusters[name]
    recorder = Recorder()
    pulumi.runtime.set_mocks(recorder.mocks, project="corral", stack=name, preview=False, monitor=recorder)

    @pulumi.runtime.test
    def program():
        addons = Addons(f"{name}-addons", ClusterContext.of(cluster), pulumi.Output.secret(KUBECONFIG),
                        cloud_settings=cloud_settings)
        return addons.urn

    program()
    return recorder.registered


CLOUD_SETTINGS = {
    "jaguar": {"ARM_SUBSCRIPTION_ID": "00000000-0000-0000-0000-000000000000", "ARM_RESOURCE_GROUP": "jaguar"},
    "ibis": {"GCP_PROJECT": "corral-ibis"},
    "heron": None,
}


@pytest.mark.parametrize("name", sorted(CLOUD_SETTINGS))
def test_one_config_group_per_addon_holding_exactly_the_rendered_objects(name):
    registered = plan(name, CLOUD_SETTINGS[name])
    cluster = load_fleet([EXAMPLES]).clusters[name]
    groups = {r.name: r for r in registered if r.type == "kubernetes:yaml/v2:ConfigGroup"}
    addons = render(cluster)
    assert sorted(groups) == sorted(f"{name}-addons-{a.name}" for a in addons)
    for addon in addons:
        assert groups[f"{name}-addons-{addon.name}"].inputs["objs"] == [dict(o) for o in addon.objects]


def test_objects_wait_for_the_api_and_use_the_admin_kubeconfig():
    registered = plan("jaguar", CLOUD_SETTINGS["jaguar"])
    ready = next(r for r in registered if r.name == "jaguar-addons-api-ready")
    provider = next(r for r in registered if r.type == "pulumi:providers:kubernetes")
    assert provider.inputs["kubeconfig"] == KUBECONFIG
    assert ready.inputs["server"] == "https://10.200.0.5:6443"
    for group in (r for r in registered if r.type == "kubernetes:yaml/v2:ConfigGroup"):
        assert any("api-ready" in urn for urn in group.depends_on), group.name
        assert "jaguar-addons-provider" in group.provider


def test_autoscaler_cloud_settings_become_its_configmap():
    registered = plan("ibis", CLOUD_SETTINGS["ibis"])
    configmap = next(r for r in registered if r.type == "kubernetes:core/v1:ConfigMap")
    assert configmap.inputs["metadata"] == {"name": "cluster-autoscaler-cloud", "namespace": "kube-system"}
    assert configmap.inputs["data"] == {"GCP_PROJECT": "corral-ibis"}


def test_missing_cloud_settings_are_a_clear_error():
    with pytest.raises(Exception, match="needs cloud_settings ARM_SUBSCRIPTION_ID, ARM_RESOURCE_GROUP"):
        plan("jaguar", None)


@pytest.mark.parametrize("name", ["jaguar"])
def test_kubernetes_own_namespaces_are_patched_with_their_pod_security_labels(name):
    registered = plan(name, CLOUD_SETTINGS[name])
    cluster = load_fleet([EXAMPLES]).clusters[name]
    patched = {r.inputs["metadata"]["name"]: r.inputs["metadata"].get("labels")
               for r in registered if r.type == "kubernetes:core/v1:NamespacePatch"}
    wanted = {o["metadata"]["name"]: o["metadata"]["labels"] for a in render(cluster) for o in a.patches}
    assert wanted and patched == wanted
    for group in (r for r in registered if r.type == "kubernetes:yaml/v2:ConfigGroup"):
        assert not any(o["kind"] == "Namespace" and o["metadata"]["name"] in wanted for o in group.inputs["objs"])
