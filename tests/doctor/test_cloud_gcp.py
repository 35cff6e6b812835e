"""GCP: gcloud login and ADC, testIamPermissions (a fake API server on localhost), images and region quotas."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from corral.doctor import Finding, Status
from corral.doctor.cloud_gcp import (
    GCP_PERMISSIONS,
    GCP_VPN_PERMISSIONS,
    check_credentials,
    check_images,
    check_permissions,
    check_quotas,
)
from corral.doctor.pulumi_checks import check_config

from .conftest import ROOT


def ready(world):
    ctx = world.context("ibis")
    check_config(ctx)
    check_credentials(ctx)
    return ctx


@pytest.fixture
def fake_resource_manager():
    """TEST FAKE of projects.testIamPermissions at the network boundary: grants `granted`,
    records each request (path, Authorization header, asked permissions)."""
    seen: list[dict] = []
    granted: set[str] = set()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            asked = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["permissions"]
            seen.append({"path": self.path, "auth": self.headers["Authorization"], "asked": asked})
            body = json.dumps({"permissions": [p for p in asked if p in granted]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/v1/projects/{{project}}:testIamPermissions"
    yield url, granted, seen
    server.shutdown()


def test_every_gcp_resource_type_the_program_plans_has_its_permissions():
    planned = {r["type"] for r in json.loads((ROOT / "tests/golden/plans/ibis.json").read_text())["resources"]
               if r["type"].startswith("gcp:")}
    assert planned and planned <= set(GCP_PERMISSIONS) | set(GCP_VPN_PERMISSIONS), planned - set(GCP_PERMISSIONS)


def configured(world):
    ctx = world.context("ibis")
    check_config(ctx)
    return ctx


def test_credentials_need_an_active_account_and_application_default_credentials(world):
    assert [(f.status, f.finding) for f in check_credentials(configured(world))] == [
        (Status.passed, "gcloud account alice@example.com, project corral-ibis (Application Default Credentials present)")]
    world.state["gcloud"]["adc"] = False
    [found] = check_credentials(configured(world))
    assert found.status is Status.fail and found.fix == "gcloud auth application-default login"
    world.state["gcloud"]["accounts"] = [{"account": "old@example.com", "status": ""}]
    [none] = check_credentials(configured(world))
    assert (none.status, none.finding) == (Status.fail, "gcloud has no active account")


def test_a_stack_without_a_project_names_gclouds_default_in_the_fix(world):
    world.state["gcloud"]["project"] = "alice-sandbox"
    world.stack("ibis", "config:\n  corral:nodeImage: projects/p/global/images/family/f\n")
    [found] = check_credentials(configured(world))
    assert found.status is Status.fail
    assert found.finding == ("gcloud account alice@example.com, but the stack names no gcp:project "
                             "(gcloud's default project: alice-sandbox)")
    assert found.fix == "pulumi config set -s ibis gcp:project PROJECT"


def test_permissions_are_tested_on_the_project_with_the_adc_token(world, fake_resource_manager):
    url, granted, seen = fake_resource_manager
    granted.update(p for perms in GCP_PERMISSIONS.values() for p in perms)
    [found] = check_permissions(ready(world), url=url)
    assert found.status is Status.passed and found.finding.endswith("permissions on corral-ibis")
    assert seen[0]["path"] == "/v1/projects/corral-ibis:testIamPermissions"
    assert seen[0]["auth"] == "Bearer ya29.TEST-FAKE-TOKEN"
    granted.discard("iam.serviceAccounts.actAs")
    [missing] = check_permissions(ready(world), url=url)
    assert missing.status is Status.fail
    assert missing.finding.startswith("alice@example.com lacks iam.serviceAccounts.actAs on corral-ibis (1 of ")
    assert "TEST-FAKE-TOKEN" not in missing.finding + missing.fix


def test_image_families_and_images_are_described_and_a_missing_one_fails(world):
    assert [f.status for f in check_images(ready(world))] == [Status.passed, Status.passed]
    calls = [c for c in world.calls() if c[1:3] == ["compute", "images"]]
    assert calls[0][3:6] == ["describe-from-family", "corral-node", "--project=corral-images"]
    assert calls[1][3:6] == ["describe", "corral-gpu-node-k8s-1-31-4", "--project=corral-images"]
    world.state["gcloud"]["images"].pop("projects/corral-images/global/images/family/corral-node")
    found = check_images(ready(world))[0]
    assert found.status is Status.fail and "(booted by control plane, cpu-n2) not found" in found.finding


def test_quotas_count_cpus_per_series_and_gpus_per_model_spot_apart(world):
    findings = {f.finding.split(" in ")[0]: f for f in check_quotas(ready(world))}
    # a2-highgpu-8g (96 vCPUs, 8 A100) spot x 0..32; g2-standard-48 (4 L4) x 0..64; C3: 3 etcd x 8 vCPUs.
    assert findings["PREEMPTIBLE_NVIDIA_A100_GPUS"].finding.endswith("quota 256 covers up to 256")
    assert findings["PREEMPTIBLE_CPUS"].finding.endswith("quota 2000 covers the 0 needed at once, not the 3072 at full scale")
    assert findings["PREEMPTIBLE_CPUS"].status is Status.warn
    assert findings["C3_CPUS"].status is Status.passed and findings["NVIDIA_L4_GPUS"].status is Status.passed
    world.state["gcloud"]["quotas"] = [{"metric": "C3_CPUS", "limit": 8.0, "usage": 0}]
    findings = check_quotas(ready(world))
    assert [f.status for f in findings if f.finding.startswith("C3_CPUS")] == [Status.fail]
    # the region's answer lists no such quota: not checked, and said so
    assert Finding("cloud.quotas", Status.skip, "us-central1 lists no quota N2_CPUS") in findings
