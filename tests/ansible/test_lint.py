"""ansible-lint (production profile) and yamllint must pass on ansible/.

Both run from ansible/ so ansible.cfg (roles_path) and the lint configs there
(.ansible-lint, .yamllint) apply. Their full output is shown on failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_DIR = REPO / "ansible"


def _tool(name: str) -> list[str]:
    exe = shutil.which(name) or os.path.join(os.path.dirname(sys.executable), name)
    if not os.path.exists(exe):
        pytest.skip(f"{name} is not installed (pip install {name})")
    return [exe]


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(ANSIBLE_DIR / "ansible.cfg"),
        NO_COLOR="1",
        ANSIBLE_FORCE_COLOR="0",
        ANSIBLE_NOCOLOR="1",
    )
    return subprocess.run(
        argv,
        cwd=ANSIBLE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_ansible_lint_production_profile():
    res = _run(
        _tool("ansible-lint") + ["--nocolor", "--profile", "production", "--strict"]
    )
    assert res.returncode == 0, (
        f"ansible-lint failed (rc={res.returncode})\n--- stdout ---\n{res.stdout}\n--- stderr ---\n{res.stderr}"
    )


def test_yamllint():
    res = _run(_tool("yamllint") + ["--strict", "-f", "parsable", "."])
    assert res.returncode == 0, (
        f"yamllint failed (rc={res.returncode})\n--- stdout ---\n{res.stdout}\n--- stderr ---\n{res.stderr}"
    )


def test_playbook_syntax():
    res = _run(
        _tool("ansible-playbook")
        + ["-i", "localhost,", "--syntax-check", "playbooks/join.yml"]
    )
    assert res.returncode == 0, f"syntax check failed\n{res.stdout}\n{res.stderr}"
