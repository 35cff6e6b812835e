"""The node image template is valid for Packer and uses roles that exist."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from ruamel.yaml import YAML

ROOT = Path(__file__).resolve().parent.parent
IMAGES = ROOT / "node-images"


@pytest.mark.skipif(shutil.which("packer") is None, reason="packer not installed (apt-get install packer)")
def test_packer_validates_the_template():
    result = subprocess.run(
        ["packer", "validate", "-var", "kubernetes_version=1.36.4", "-var", "gcp_project=example-project",
         "-var", "azure_subscription_id=00000000-0000-0000-0000-000000000000", "."],
        cwd=IMAGES, capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.skipif(shutil.which("packer") is None, reason="packer not installed (apt-get install packer)")
def test_packer_requires_the_kubernetes_version():
    result = subprocess.run(["packer", "validate", "."], cwd=IMAGES, capture_output=True, text=True)
    assert result.returncode != 0
    assert "kubernetes_version" in result.stdout + result.stderr


def test_image_playbook_uses_existing_roles_and_parses():
    plays = YAML(typ="safe").load((IMAGES / "image.yml").read_text())
    roles = [r["role"] for play in plays for r in play["roles"]]
    assert roles and all((ROOT / "ansible" / "roles" / r / "tasks" / "main.yml").is_file() for r in roles)
    assert "kubelet_join" in roles and plays[0]["vars"]["corral_image_build"] is True
    # Neighbour-table sizes belong to the cluster (cloud-init's 90-corral.conf,
    # or the arp_cache role at an on-prem join), never to an image, where a
    # baked 91-... file would sort after cloud-init's and win.
    assert "arp_cache" not in roles
    env = {**os.environ, "ANSIBLE_ROLES_PATH": str(ROOT / "ansible" / "roles"),
           "ANSIBLE_CONFIG": str(ROOT / "ansible" / "ansible.cfg")}
    result = subprocess.run(
        ["ansible-playbook", "--syntax-check", "-i", "localhost,", str(IMAGES / "image.yml")],
        capture_output=True, text=True, env=env,
    )
    assert result.returncode == 0, result.stdout + result.stderr
