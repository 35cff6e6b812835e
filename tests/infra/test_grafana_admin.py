"""Grafana's admin login: `pulumi up` generates it into Secret corral-monitoring/grafana-admin,
which the Grafana Deployment mounts; no plan, manifest or golden holds the password."""

from __future__ import annotations

import json

import pytest

from corral.manifests import render
from corral.manifests.monitoring import (
    GRAFANA_ADMIN_DIR,
    GRAFANA_ADMIN_PASSWORD_KEY,
    GRAFANA_ADMIN_SECRET,
    GRAFANA_ADMIN_USER_KEY,
)
from corral.model import load_fleet

from .conftest import EXAMPLES, PSK_PREFIX

NAMES = ("heron", "ibis", "jaguar")


def _plan(name: str, mocks):
    from corral.infra.plan import plan_cluster, read_stack_config, stack_config_file

    cluster = load_fleet([EXAMPLES]).clusters[name]
    config, secret_keys = read_stack_config(stack_config_file(name, EXAMPLES))
    return plan_cluster(cluster, mocks=mocks, preview=False, stack_config=config, secret_config_keys=secret_keys)


@pytest.mark.parametrize("name", NAMES)
def test_pulumi_generates_the_admin_secret_grafana_mounts_and_the_plan_masks_it(name, known_secret_mocks):
    plan = _plan(name, known_secret_mocks)
    by_name = {r["name"]: r for r in plan.resources}
    password = by_name[f"{name}-addons-grafana-admin-password"]
    assert password["type"] == "random:index/randomPassword:RandomPassword"
    assert password["inputs"]["length"] >= 32 and password["inputs"]["special"] is False
    secret = by_name[f"{name}-addons-grafana-admin"]
    assert secret["type"] == "kubernetes:core/v1:Secret"
    assert secret["inputs"]["metadata"]["name"] == GRAFANA_ADMIN_SECRET
    assert secret["inputs"]["metadata"]["namespace"] == "corral-monitoring"
    # The password is known to these mocks (as after `pulumi up`) and still in no plan output.
    assert secret["inputs"]["stringData"] == "[secret]"
    text = plan.to_json() + json.dumps(plan.snapshot())
    assert PSK_PREFIX + f"{name}addonsgrafanaadminpassword" not in text

    # What the Deployment mounts is exactly that Secret's two keys.
    cluster = load_fleet([EXAMPLES]).clusters[name]
    monitoring = next(a for a in render(cluster) if a.name == "monitoring")
    grafana = next(o for o in monitoring.objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "grafana")
    pod = grafana["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v.get("secret", {}).get("secretName") == GRAFANA_ADMIN_SECRET]
    assert "optional" not in volume["secret"], "without the Secret Grafana would start with admin/admin"
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["GF_SECURITY_ADMIN_USER__FILE"] == f"{GRAFANA_ADMIN_DIR}/{GRAFANA_ADMIN_USER_KEY}"
    assert env["GF_SECURITY_ADMIN_PASSWORD__FILE"] == f"{GRAFANA_ADMIN_DIR}/{GRAFANA_ADMIN_PASSWORD_KEY}"


def test_the_secret_waits_for_the_monitoring_namespace():
    """Created after the monitoring add-on (its namespace), with the add-ons' provider."""
    pytest.importorskip("pulumi_kubernetes")
    from tests.manifests.test_addons_pulumi import plan

    registered = plan("heron")
    secret = next(r for r in registered if r.name == "heron-addons-grafana-admin")
    monitoring = next(r for r in registered if r.name == "heron-addons-monitoring")
    assert any(urn.endswith("::heron-addons-monitoring") for urn in secret.depends_on), secret.depends_on
    assert secret.provider == monitoring.provider or "heron-addons-provider" in secret.provider
    assert secret.inputs["stringData"][GRAFANA_ADMIN_USER_KEY] == "admin"

