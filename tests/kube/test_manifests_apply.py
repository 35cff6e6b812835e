"""Every add-on object corral renders, applied to the real kube-apiserver with server-side
apply and strict field validation: a field the server does not know, a value it refuses,
a CEL rule that does not compile, or a CRD it will not serve fails here.

The lab's own cluster is applied for real (its policies then guard the other tests'
requests); every example cluster is applied as a server-side dry run on top, which runs
the same admission and validation without storing anything.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .lab import KubeLab

ROOT = Path(__file__).resolve().parents[2]
KUEUE_CRDS = ROOT / "tests" / "manifests" / "kueue_crds"


def rendered(cluster_file: Path) -> list[dict]:
    from corral.manifests import all_objects
    from corral.manifests.fleet_addons import cluster_addons, load_fleet_beside
    from corral.model import load_cluster

    cluster = load_cluster(cluster_file)
    return all_objects(cluster_addons(cluster, load_fleet_beside(cluster_file.parent)))


def kueue_crds() -> list[str]:
    """The Kueue CRDs of the release corral installs (Kueue's chart brings them in production)."""
    from corral.manifests.versions import KUEUE

    version = KUEUE.rsplit(":", 1)[1]
    folder = KUEUE_CRDS / version
    return sorted(str(p) for p in folder.glob("*.yaml"))


def apply(lab: KubeLab, objects: list[dict], *extra: str):
    return lab.kubectl("apply", "--server-side", "--field-manager=corral", "--force-conflicts",
                       "--validate=strict", *extra, "-f", "-",
                       input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}), check=False)


@pytest.fixture(scope="module")
def crds_established(kube_lab):
    crds = kueue_crds()
    assert crds, "no Kueue CRDs for the pinned release under tests/manifests/kueue_crds"
    for path in crds:
        kube_lab.kubectl("apply", "--server-side", "--field-manager=corral", "-f", path)
    own = [o for o in rendered(kube_lab.cluster_file) if o["kind"] == "CustomResourceDefinition"]
    if own:
        result = apply(kube_lab, own)
        assert result.returncode == 0, result.stderr
    kube_lab.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
    return kube_lab


def test_every_object_of_the_lab_cluster_is_accepted_and_stored(crds_established):
    lab = crds_established
    objects = rendered(lab.cluster_file)
    namespaces = [o for o in objects if o["kind"] == "Namespace"]
    assert apply(lab, namespaces).returncode == 0
    result = apply(lab, [o for o in objects if o["kind"] not in ("Namespace", "CustomResourceDefinition")])
    assert result.returncode == 0, f"the real API server refused corral's objects:\n{result.stderr[-4000:]}"
    assert "Warning" not in result.stderr, result.stderr[-2000:]
    # Everything is there, as corral wrote it (no field dropped on the way).
    for obj in objects[:: max(1, len(objects) // 40)]:
        meta = obj["metadata"]
        args = ["get", obj["kind"].lower() if "." not in obj["apiVersion"] else
                f"{obj['kind'].lower()}.{obj['apiVersion'].split('/')[0]}", meta["name"], "-o", "json"]
        if meta.get("namespace"):
            args += ["-n", meta["namespace"]]
        stored = json.loads(lab.kubectl(*args).stdout)
        assert stored["metadata"]["name"] == meta["name"]


def test_a_field_the_server_does_not_know_is_refused(crds_established):
    """Broken on purpose: a misspelt field in one of corral's objects fails the apply."""
    lab = crds_established
    deployment = next(o for o in rendered(lab.cluster_file) if o["kind"] == "Deployment")
    broken = json.loads(json.dumps(deployment))
    broken["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    result = apply(lab, [broken], "--dry-run=server")
    assert result.returncode != 0
    # kubectl checks against the server's own OpenAPI schema before it sends (strict validation)
    assert 'unknown field "imagePullPolicyy"' in result.stderr, result.stderr


def test_a_cel_rule_that_does_not_compile_is_refused(crds_established):
    """Broken on purpose: corral's ValidatingAdmissionPolicies are compiled by the real server."""
    lab = crds_established
    policy = next(o for o in rendered(lab.cluster_file) if o["kind"] == "ValidatingAdmissionPolicy")
    broken = json.loads(json.dumps(policy))
    broken["spec"]["validations"][0]["expression"] = "object.spec.nodeName.startsWith("
    result = apply(lab, [broken], "--dry-run=server")
    assert result.returncode != 0
    assert "compilation failed" in result.stderr, result.stderr
