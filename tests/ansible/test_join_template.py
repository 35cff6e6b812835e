"""The shared kubeadm JoinConfiguration template renders the same under plain
jinja2 (cloud-init, any whitespace settings) and under Ansible's template
module (on-prem nodes), and produces the documented kubeadm structure."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
from pathlib import Path

import jinja2
import pytest
import yaml

from corral.nodes.inventory import mark_unsafe, to_ansible_json

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_DIR = REPO / "ansible"
JOIN_TEMPLATE = REPO / "corral" / "templates" / "kubeadm" / "join-configuration.yaml.j2"

VARS = {
    "api_endpoint": "10.200.0.4:6443",
    "token": "abcdef.0123456789abcdef",
    "ca_cert_hashes": ["sha256:" + "a" * 64, "sha256:" + "b" * 64],
    "node_name": "gpu-001",
    "node_labels": {
        "corral.dev/site": "sf1",
        "corral.dev/pool": "h100",
        "corral.dev/roce": True,
        "corral.dev/gpu-model": "H100",
        "corral.dev/unset": None,
    },
    "node_taints": [
        {"key": "corral.dev/team", "value": "research", "effect": "NoSchedule"},
        {"key": "corral.dev/preflight", "effect": "NoSchedule"},
    ],
    "cri_socket": "unix:///run/containerd/containerd.sock",
    "kubernetes_version": "1.31.4",
}


def render(variables: dict, **env_opts) -> str:
    # StrictUndefined like corral.machine.files' environment (cloud-init side).
    env_opts.setdefault("undefined", jinja2.StrictUndefined)
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(JOIN_TEMPLATE.parent)), **env_opts
    )
    return env.get_template(JOIN_TEMPLATE.name).render(**variables)


def test_identical_under_all_whitespace_settings():
    outs = {
        render(VARS, trim_blocks=t, lstrip_blocks=l, keep_trailing_newline=k)
        for t, l, k in itertools.product([False, True], repeat=3)
    }
    assert len(outs) == 1, "\n=====\n".join(outs)


def test_v1beta4_structure():
    doc = yaml.safe_load(render(VARS))
    assert doc["apiVersion"] == "kubeadm.k8s.io/v1beta4"
    assert doc["kind"] == "JoinConfiguration"
    bt = doc["discovery"]["bootstrapToken"]
    assert bt == {
        "apiServerEndpoint": "10.200.0.4:6443",
        "token": "abcdef.0123456789abcdef",
        "caCertHashes": VARS["ca_cert_hashes"],
    }
    reg = doc["nodeRegistration"]
    assert reg["name"] == "gpu-001"
    assert reg["criSocket"] == "unix:///run/containerd/containerd.sock"
    # v1beta4: kubeletExtraArgs is a list of {name, value}; labels sorted, None dropped.
    assert reg["kubeletExtraArgs"] == [
        {
            "name": "node-labels",
            "value": "corral.dev/gpu-model=H100,corral.dev/pool=h100,corral.dev/roce=true,corral.dev/site=sf1",
        }
    ]
    assert reg["taints"] == [
        {"key": "corral.dev/team", "value": "research", "effect": "NoSchedule"},
        {"key": "corral.dev/preflight", "effect": "NoSchedule"},
    ]


def test_v1beta3_below_1_31_and_empty_lists():
    doc = yaml.safe_load(
        render(
            dict(
                VARS,
                kubernetes_version="v1.30.8",
                node_taints=[],
                node_labels={"a": "b"},
            )
        )
    )
    assert doc["apiVersion"] == "kubeadm.k8s.io/v1beta3"
    assert doc["nodeRegistration"]["kubeletExtraArgs"] == {"node-labels": "a=b"}
    assert doc["nodeRegistration"]["taints"] == []


def test_awkward_values_stay_valid_yaml():
    doc = yaml.safe_load(
        render(dict(VARS, node_name="n: #1 'x'", node_labels={"k": "v: #"}))
    )
    assert doc["nodeRegistration"]["name"] == "n: #1 'x'"


def _render_with_ansible(tmp_path: Path, variables_json: object) -> Path:
    """Render the join template with Ansible's own template module; the file it wrote."""
    vars_file = tmp_path / "vars.json"
    vars_file.write_text(json.dumps(variables_json))
    dest = tmp_path / "ansible.yaml"
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(ANSIBLE_DIR / "ansible.cfg"),
        ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path / "facts"),
    )
    res = subprocess.run(
        ["ansible", "localhost", "-c", "local", "-m", "ansible.builtin.template",
         "-a", f"src={JOIN_TEMPLATE} dest={dest}", "-e", f"@{vars_file}"],
        cwd=ANSIBLE_DIR, env=env, capture_output=True, text=True, timeout=120, check=False,
    )
    if res.returncode != 0 and "No module named" in res.stderr:
        pytest.skip("ansible-core not installed")
    assert res.returncode == 0, res.stdout + res.stderr
    return dest


def test_ansible_template_module_renders_identically(tmp_path):
    # includes characters jinja's tojson escapes (<, >, &, ') to check both
    # sides escape them alike
    variables = dict(VARS, node_labels=dict(VARS["node_labels"], odd="a<b>&'c'"))
    dest = _render_with_ansible(tmp_path, variables)
    assert dest.read_text() == render(variables)


def test_unsafe_marked_values_render_identically_and_literally(tmp_path):
    """The inventory marks every value unsafe: the template renders them the
    same, and a template hidden in a value stays text under Ansible."""
    marker = tmp_path / "evaluated"
    labels = dict(VARS["node_labels"], odd=f"{{{{ lookup('pipe', 'touch {marker}') }}}}")
    variables = dict(VARS, node_labels=labels)
    # marked exactly as corral's inventory marks what it hands Ansible
    dest = _render_with_ansible(tmp_path, to_ansible_json(mark_unsafe(variables)))
    assert not marker.exists()
    assert dest.read_text() == render(variables)
    assert "{{ lookup(" in dest.read_text()


@pytest.mark.parametrize("version", ["1.31.4", "1.30.8"])
def test_patches_folder_renders_for_both_apis_and_only_when_given(version):
    """The kubelet reservations patch (corral.machine.kubelet_reservations): kubeadm
    applies the folder's kubeletconfiguration patch when it writes the kubelet's
    configuration (JoinConfiguration.patches.directory, v1beta3 and v1beta4)."""
    variables = dict(VARS, kubernetes_version=version, patches_dir="/etc/kubernetes/patches")
    outs = {
        render(variables, trim_blocks=t, lstrip_blocks=l, keep_trailing_newline=k)
        for t, l, k in itertools.product([False, True], repeat=3)
    }
    assert len(outs) == 1, "\n=====\n".join(outs)
    assert yaml.safe_load(outs.pop())["patches"] == {"directory": "/etc/kubernetes/patches"}
    for absent in ({}, {"patches_dir": ""}, {"patches_dir": None}):
        assert "patches" not in yaml.safe_load(render(dict(VARS, kubernetes_version=version, **absent)))


def test_the_role_passes_the_patches_folder_of_its_reservations(tmp_path):
    """kubelet_join's `patches_dir` expression, under Ansible, with and without reservations."""
    tasks = yaml.safe_load((ANSIBLE_DIR / "roles/kubelet_join/tasks/main.yml").read_text())
    block = next(t for t in tasks if t.get("name") == "Render and run the join")["block"]
    (task,) = [t for t in block if (t.get("ansible.builtin.template") or {}).get("src") == "{{ corral_join_template }}"]
    expression = task["vars"]["patches_dir"]
    for reservations, expected in (({"patches_dir": "/etc/kubernetes/patches"}, "/etc/kubernetes/patches"), (None, "")):
        env = jinja2.Environment()
        got = env.from_string(expression).render(corral_kubelet_reservations=reservations)
        assert got == expected
