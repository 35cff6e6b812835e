"""Role templates that write shell scripts, systemd units and apt files quote what they interpolate.

The model refuses hostile values; these tests hand the templates such values
anyway (as if one got past it) and render them with Ansible's own template
module, on this machine, with no root: a value must never start a line of its
own, end a quote, or run. What apt.conf and sources.list cannot escape fails
the task with a message naming the variable.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROLES = REPO / "ansible" / "roles"

pytestmark = pytest.mark.skipif(shutil.which("ansible-playbook") is None, reason="ansible-playbook not installed")


def unsafe(value):
    """Ansible's JSON mark, as corral's inventory sends every value."""
    if isinstance(value, str):
        return {"__ansible_unsafe": value}
    if isinstance(value, list):
        return [unsafe(v) for v in value]
    return value


def render(tmp_path: Path, cases: dict[str, tuple[str, dict]]) -> dict[str, dict]:
    """Render each case (template path under roles/, its variables) in one ansible-playbook run.

    Returns, per case, {"failed": bool, "msg": str, "text": rendered text or None}.
    """
    play_tasks = []
    for name, (template, variables) in cases.items():
        var_file = tmp_path / f"{name}.json"
        var_file.write_text(json.dumps({k: unsafe(v) for k, v in variables.items()}))
        play_tasks.append({"name": f"Case {name}", "block": [
            {"name": f"Load {name}", "ansible.builtin.include_vars": {"file": str(var_file)}},
            {"name": f"Render {name}",
             "ansible.builtin.template": {"src": str(ROLES / template), "dest": str(tmp_path / f"{name}.out"),
                                          "mode": "0600"},
             "ignore_errors": True, "register": f"result_{name}"},
        ]})
    summary = {name: f"{{{{ result_{name} }}}}" for name in cases}
    play_tasks.append({
        "name": "Write the results",
        "ansible.builtin.copy": {"content": "{{ _summary | to_json }}", "dest": str(tmp_path / "results.json"),
                                 "mode": "0600"},
        "vars": {"_summary": summary},
    })
    # Facts only for sources.list (the distribution's release name).
    facts = any("sources.list" in template for template, _ in cases.values())
    playbook = [{"name": "Render role templates", "hosts": "localhost", "gather_facts": facts,
                 "gather_subset": ["!all", "min"], "tasks": play_tasks}]
    (tmp_path / "render.yml").write_text(json.dumps(playbook))
    result = subprocess.run(
        ["ansible-playbook", "-i", "localhost,", "-c", "local",
         "-e", f"ansible_python_interpreter={sys.executable}", str(tmp_path / "render.yml")],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_LOCALHOST_WARNING": "0"},
    )
    assert (tmp_path / "results.json").exists(), result.stdout[-4000:] + result.stderr[-4000:]
    results = json.loads((tmp_path / "results.json").read_text())
    out = {}
    for name in cases:
        rendered = tmp_path / f"{name}.out"
        out[name] = {
            "failed": bool(results[name].get("failed")),
            "msg": str(results[name].get("msg", "")),
            "text": rendered.read_text() if rendered.exists() else None,
        }
    return out


ROCE = {"corral_roce_mtu": 9000, "corral_roce_pfc_priority": 3, "corral_roce_dscp": 26, "corral_roce_ecn": True,
        "corral_roce_require_dcb": True, "corral_roce_script": "/usr/local/sbin/corral-roce-qos"}


def test_roce_script_and_unit_keep_hostile_interface_names_inert(tmp_path):
    marker = tmp_path / "ran"
    hostile = [
        "ens1f0np0",
        f"x\ntouch {marker}-newline #",
        f"y$(touch {marker}-subst)",
        f"z'; touch {marker}-quote; '",
        "w\nExecStartPre=/bin/true",
    ]
    results = render(tmp_path, {
        "script": ("roce/templates/corral-roce-qos.sh.j2", {**ROCE, "corral_roce_interfaces": hostile}),
        "unit": ("roce/templates/corral-roce-qos.service.j2", {**ROCE, "corral_roce_interfaces": hostile}),
    })
    script = results["script"]["text"]
    assert script is not None, results["script"]["msg"]
    # Run it for real: interfaces that do not exist are reported, nothing else happens.
    run = subprocess.run(["sh", str(tmp_path / "script.out")], capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin"})
    assert not list(tmp_path.glob("ran*")), f"the script ran a command from an interface name:\n{script}"
    assert run.returncode == 1
    assert "interface y$(touch" in run.stderr and "does not exist" in run.stderr
    unit = results["unit"]["text"]
    assert unit is not None, results["unit"]["msg"]
    keys = [line.split("=", 1)[0] for line in unit.splitlines()
            if line and not line.startswith(("#", "["))]
    assert "ExecStartPre" not in keys and all(re.fullmatch(r"[A-Za-z]+", k) for k in keys), unit
    assert keys.count("ExecStart") == 1


def systemd_unquote(value: str) -> str:
    """systemd.syntax(7) double-quoted string with C escapes and '%%' -> the value."""
    assert value.startswith('"') and value.endswith('"'), value
    body = value[1:-1]
    assert re.fullmatch(r'(?:[^"\\%\n]|\\[\\"nr]|%%)*', body), value
    return re.sub(r'\\(.)|%%', lambda m: {"\\": "\\", '"': '"', "n": "\n", "r": "\r"}[m.group(1)]
                  if m.group(1) else "%", body)


def test_containerd_proxy_drop_in_quotes_for_systemd(tmp_path):
    proxy = 'http://proxy:3128"\nExecStartPre=/bin/touch /tmp/owned\n%h\\'
    results = render(tmp_path, {
        "proxy": ("container_runtime/templates/proxy.conf.j2", {
            "corral_http_proxy": proxy, "corral_https_proxy": "http://proxy:3128",
            "corral_no_proxy": "localhost,10.0.0.0/8"}),
    })
    text = results["proxy"]["text"]
    assert text is not None, results["proxy"]["msg"]
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert lines[0] == "[Service]" and len(lines) == 4, text
    values = [systemd_unquote(line.removeprefix("Environment=")) for line in lines[1:]]
    assert values == [f"HTTP_PROXY={proxy}", "HTTPS_PROXY=http://proxy:3128", "NO_PROXY=localhost,10.0.0.0/8"]


@pytest.mark.parametrize("template, variables, variable", [
    ("node_base/templates/apt-proxy.conf.j2",
     {"corral_http_proxy": 'http://proxy:3128";\nAPT::Update::Pre-Invoke {"touch /tmp/x"', "corral_https_proxy": None},
     "corral_http_proxy"),
    ("node_base/templates/sources.list.j2",
     {"corral_apt_mirror": "http://m\ndeb http://evil bookworm main", "corral_debian_repo_url": "http://m/debian",
      "corral_debian_security_repo_url": "http://m/debian-security", "corral_debian_components": "main"},
     "corral_apt_mirror"),
    ("corral_common/templates/apt-source.list.j2",
     {"corral_repo_keyring": "/etc/apt/keyrings/k.asc", "corral_repo_line": "http://m/k8s /\ndeb http://evil x y"},
     "corral_repo_line"),
])
def test_apt_files_refuse_what_they_cannot_quote(tmp_path, template, variables, variable):
    results = render(tmp_path, {"hostile": (template, variables)})
    assert results["hostile"]["failed"], results["hostile"]["text"]
    assert results["hostile"]["text"] is None
    assert f"{variable} must be" in results["hostile"]["msg"]


def test_apt_files_render_plain_values(tmp_path):
    results = render(tmp_path, {
        "proxy": ("node_base/templates/apt-proxy.conf.j2",
                  {"corral_http_proxy": "http://proxy.sf1.internal:3128",
                   "corral_https_proxy": "http://proxy.sf1.internal:3128"}),
        "sources": ("node_base/templates/sources.list.j2",
                    {"corral_apt_mirror": "http://mirror.sf1.internal",
                     "corral_debian_repo_url": "http://mirror.sf1.internal/debian",
                     "corral_debian_security_repo_url": "http://mirror.sf1.internal/debian-security",
                     "corral_debian_components": "main contrib"}),
        "source": ("corral_common/templates/apt-source.list.j2",
                   {"corral_repo_keyring": "/etc/apt/keyrings/k.asc",
                    "corral_repo_line": "http://mirror.sf1.internal/nvidia/$(ARCH) /"}),
    })
    assert results["proxy"]["text"].splitlines()[1:] == [
        'Acquire::http::Proxy "http://proxy.sf1.internal:3128";',
        'Acquire::https::Proxy "http://proxy.sf1.internal:3128";',
    ]
    sources = results["sources"]["text"].splitlines()
    assert [line.split()[:2] for line in sources if line.startswith("deb ")] == [
        ["deb", "http://mirror.sf1.internal/debian"]] * 2 + [["deb", "http://mirror.sf1.internal/debian-security"]]
    assert len(sources) == 5, sources
    assert results["source"]["text"].splitlines()[1:] == [
        "deb [signed-by=/etc/apt/keyrings/k.asc] http://mirror.sf1.internal/nvidia/$(ARCH) /"]
