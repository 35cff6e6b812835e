"""Per-minor pins: kube-state-metrics and the cluster-autoscaler follow the cluster's
Kubernetes minor, and a minor without a pin is refused with the fix in the message."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.manifests import policy, render, versions
from corral.model import load_fleet

from .test_manifests import variant

ROOT = Path(__file__).resolve().parents[2]
FLEET = load_fleet([ROOT / "clusters"])


def ksm_image(cluster) -> str:
    addon = next(a for a in render(cluster) if a.name == "monitoring")
    deployment = next(o for o in addon.objects if o["kind"] == "Deployment"
                      and o["metadata"]["name"].startswith("kube-state-metrics"))
    return deployment["spec"]["template"]["spec"]["containers"][0]["image"]


@pytest.mark.parametrize(("name", "tag"), [("heron", "v2.19.1"), ("ibis", "v2.20.0"), ("jaguar", "v2.20.0")])
def test_kube_state_metrics_is_the_release_built_for_the_clusters_minor(name, tag):
    # kube-state-metrics README, "Compatibility matrix": v2.19 <-> client-go
    # v1.35, v2.20.0 <-> v1.36. heron runs 1.35, ibis and jaguar 1.36.
    cluster = FLEET.clusters[name]
    assert ksm_image(cluster) == f"registry.k8s.io/kube-state-metrics/kube-state-metrics:{tag}"
    assert versions.kube_state_metrics(cluster.kubernetes.minor).endswith(f":{tag}")


def test_every_pinned_minor_has_both_per_minor_images():
    # 1.37 has kube-state-metrics and no cluster-autoscaler release yet (corral/model/versions.py).
    assert set(versions.KUBE_STATE_METRICS) == set(versions.CLUSTER_AUTOSCALER) | {"1.37"}


def test_a_minor_without_a_kube_state_metrics_pin_is_refused(tmp_path, monkeypatch):
    cluster = FLEET.clusters["jaguar"]
    monkeypatch.delitem(versions.KUBE_STATE_METRICS, cluster.kubernetes.minor)
    with pytest.raises(policy.ManifestError, match="kube_state_metrics in the 1.36 row of corral/model/versions.py"):
        render(cluster)


def test_a_cluster_moving_to_the_next_minor_moves_kube_state_metrics(tmp_path):
    before = FLEET.clusters["heron"]
    after = variant(tmp_path, "heron", ('version: "1.35.9"', 'version: "1.36.4"'))
    assert ksm_image(before).endswith(":v2.19.1")
    assert ksm_image(after).endswith(":v2.20.0")
