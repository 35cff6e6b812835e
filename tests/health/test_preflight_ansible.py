"""Ansible renders the preflight template byte-identical to corral's Python renderer,
from the inventory's own (unsafe-marked) expectations, hostile values included."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from corral.machine import gpu_preflight as preflight
from corral.nodes.inventory import build, mark_unsafe, to_ansible_json

from .conftest import load_script

ROLE = Path(__file__).resolve().parents[2] / "ansible" / "roles" / "gpu_preflight"

pytestmark = pytest.mark.skipif(shutil.which("ansible-playbook") is None and
                                not (Path(sys.executable).parent / "ansible-playbook").exists(),
                                reason="ansible-playbook not installed")


def ansible_render(tmp_path: Path, expected: dict) -> str:
    """Render through Ansible as `corral join` feeds it: the inventory's JSON (values marked unsafe)
    from a dynamic-inventory script, the role's template task and its `vars:`."""
    inventory = {"all": {"hosts": ["localhost"], "vars": to_ansible_json(mark_unsafe({"corral_gpu_preflight": expected}))},
                 "_meta": {"hostvars": {}}}
    script = tmp_path / "inventory.py"
    script.write_text(f"#!{sys.executable}\nprint({json.dumps(json.dumps(inventory))})\n")
    script.chmod(0o755)
    out = tmp_path / "gpu-preflight"
    task = next(t for t in yaml.safe_load((ROLE / "tasks" / "main.yml").read_text())
                if "ansible.builtin.template" in t and "preflight" in t.get("vars", {}))
    playbook = [{"name": "Render the preflight", "hosts": "localhost", "gather_facts": False,
                 "vars": {"corral_gpu_preflight_template": str(ROLE.parents[2] / "corral" / "templates"
                                                               / preflight.TEMPLATE)},
                 "tasks": [{"name": "Render", "ansible.builtin.template": {
                     "src": task["ansible.builtin.template"]["src"], "dest": str(out), "mode": "0755"},
                     "vars": task["vars"]}]}]
    (tmp_path / "play.yml").write_text(json.dumps(playbook))
    bindir = str(Path(sys.executable).parent)
    proc = subprocess.run(
        ["ansible-playbook", "-i", str(script), "-c", "local", "-e", f"ansible_python_interpreter={sys.executable}",
         str(tmp_path / "play.yml")],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**os.environ, "PATH": bindir + os.pathsep + os.environ.get("PATH", ""), "ANSIBLE_NOCOLOR": "1",
             "ANSIBLE_LOCALHOST_WARNING": "0"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out.read_text()


def test_ansible_and_python_render_the_same_script(tmp_path, h100_expected):
    hostile = dict(h100_expected, gpu_model="H100{{ lookup('pipe', 'id') }}'\"$(id)")
    for expected in (h100_expected, hostile):
        text = ansible_render(tmp_path, expected)
        assert text == preflight.render(expected)
        assert load_script(text).EXPECTED == expected


def test_inventory_gives_each_gpu_pool_its_expectations(jaguar):
    groups = build(jaguar)
    for pool in jaguar.onprem_pools:
        got = groups[f"pool_{pool.name.replace('-', '_')}"]["vars"]["corral_gpu_preflight"]
        assert got == preflight.expectations(jaguar, pool)
