"""Shared bits of the Ansible tests (lint, template, role tests on hostlab hosts)."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# tests/ansible has no __init__.py on purpose (a package named "ansible" would
# shadow ansible-core); make `tests.hostlab` importable from the repo root.
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
ANSIBLE_DIR = REPO / "ansible"
JOIN_TEMPLATE = REPO / "corral" / "templates" / "kubeadm" / "join-configuration.yaml.j2"


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "hostlab: needs the throwaway systemd-nspawn hosts of tests/hostlab (root, "
        "systemd-container, debootstrap); skipped with the lab's reason otherwise",
    )
