"""The converge record (corral.nodes.converge) without hosts: fingerprints,
what a run's events say the roles manage, and the host-side check and record
scripts run for real with `sh` over a temporary state folder (a fake
systemctl at the process boundary)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from corral.model import load_cluster
from corral.nodes import converge
from corral.nodes.converge import AppliedState, AppliedStateCollector, parse_verdict
from corral.nodes.inventory import host_pool
from corral.nodes.join import ansible_dir
from tests.conftest import EXAMPLES

HERE = Path(__file__).resolve().parent
MATERIAL = {"corral_join_api_endpoint": "10.200.0.5:6443", "corral_join_ca_cert_hashes": ["sha256:" + "ab" * 32]}


@pytest.fixture(scope="module")
def jaguar():
    return load_cluster(EXAMPLES / "jaguar.yaml")


def _hosts_by_pool(cluster):
    pools: dict[str, list[str]] = {}
    for host, pool in host_pool(cluster).items():
        pools.setdefault(pool, []).append(host)
    return pools


def test_fingerprint_is_stable_and_ignores_the_runs_token_and_drain_credential(jaguar):
    hosts = list(host_pool(jaguar))
    first = converge.desired_fingerprints(
        jaguar, hosts, MATERIAL | {"corral_join_token": "aaaaaa.1", "corral_runner_kubeconfig": "/tmp/a/kubeconfig"},
        [], ansible_dir())
    again = converge.desired_fingerprints(
        jaguar, hosts, MATERIAL | {"corral_join_token": "bbbbbb.2", "corral_runner_kubeconfig": "/tmp/b/kubeconfig"},
        [], ansible_dir())
    assert first == again
    assert len(set(first.values())) == len(hosts)  # the host's own name is an input


def test_a_pool_change_moves_only_that_pools_hosts(jaguar):
    pools = _hosts_by_pool(jaguar)
    assert len(pools) >= 2, "the example needs two on-prem pools"
    hosts = [h for names in pools.values() for h in names]
    before = converge.desired_fingerprints(jaguar, hosts, MATERIAL, [], ansible_dir())
    name, changed_hosts = next((p, names) for p, names in pools.items()
                               if any(pool.name == p and pool.gpu for pool in jaguar.onprem_pools))
    pool = next(p for p in jaguar.onprem_pools if p.name == name)
    edited = jaguar.model_copy(deep=True)
    next(p for p in edited.onprem_pools if p.name == name).gpu.driver = pool.gpu.driver + "1"
    after = converge.desired_fingerprints(edited, hosts, MATERIAL, [], ansible_dir())
    assert {h for h in hosts if before[h] != after[h]} == set(changed_hosts)


def test_how_a_host_is_reached_is_not_an_input(jaguar, tmp_path):
    """A checkout moved elsewhere (the known hosts file's path in every host's ssh
    options), an address or an ssh user given: nothing to converge for that."""
    hosts = list(host_pool(jaguar))
    base = converge.desired_fingerprints(jaguar, hosts, MATERIAL, [], ansible_dir())
    moved = tmp_path / "elsewhere" / "jaguar.yaml"
    moved.parent.mkdir()
    shutil.copy(EXAMPLES / "jaguar.yaml", moved)
    relocated = load_cluster(moved)
    relocated.sites[0].ssh.user = "ops"
    relocated.onprem_pools[1].addresses = ["10.50.13.[65:72]"]
    assert converge.desired_fingerprints(relocated, hosts, MATERIAL, [], ansible_dir()) == base


def test_site_overrides_and_join_material_are_inputs(jaguar, tmp_path):
    hosts = list(host_pool(jaguar))[:2]
    base = converge.desired_fingerprints(jaguar, hosts, MATERIAL, [], ansible_dir())
    overrides = tmp_path / "site.json"
    overrides.write_text(json.dumps({"corral_reboot_batch": "10%"}))
    assert converge.desired_fingerprints(jaguar, hosts, MATERIAL, [overrides], ansible_dir()) != base
    moved = MATERIAL | {"corral_join_api_endpoint": "10.200.0.6:6443"}
    assert converge.desired_fingerprints(jaguar, hosts, moved, [], ansible_dir()) != base


@pytest.fixture()
def trees(tmp_path, monkeypatch):
    """Copies of ansible/ and corral/templates/ that a test may edit."""
    ansible = tmp_path / "ansible"
    shutil.copytree(ansible_dir(), ansible, ignore=shutil.ignore_patterns("__pycache__"))
    templates = tmp_path / "templates"
    shutil.copytree(converge.CORRAL_TEMPLATES, templates, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(converge, "CORRAL_TEMPLATES", templates)
    return ansible, templates


def test_roles_and_the_templates_they_read_are_inputs_other_templates_are_not(trees):
    ansible, templates = trees
    base = converge.roles_digest(ansible)
    # A role's README: documentation changes nothing on a host.
    readme = ansible / "roles" / "arp_cache" / "README.md"
    readme.write_text(readme.read_text() + "more words\n", encoding="utf-8")
    assert converge.roles_digest(ansible) == base
    # A manifest template only the cloud add-ons use: on-prem hosts stay put.
    (templates / "manifests" / "flannel.yaml.j2").write_text("# edited\n", encoding="utf-8")
    assert converge.roles_digest(ansible) == base
    # The shared JoinConfiguration the kubelet_join role renders.
    join = templates / "kubeadm" / "join-configuration.yaml.j2"
    join.write_text(join.read_text() + "# edited\n")
    after_template = converge.roles_digest(ansible)
    assert after_template != base
    defaults = ansible / "roles" / "arp_cache" / "defaults" / "main.yml"
    defaults.write_text(defaults.read_text() + "# edited\n")
    assert converge.roles_digest(ansible) != after_template


def _event(host, action, args, kind="runner_on_ok"):
    return {"event": kind, "event_data": {"host": host, "task_action": action,
                                          "res": {"invocation": {"module_args": args}}}}


def test_the_runs_events_say_what_the_roles_manage():
    collector = AppliedStateCollector(["h1", "h2"])
    for event in [
        _event("h1", "ansible.builtin.template", {"dest": "/etc/crictl.yaml"}),
        _event("h1", "ansible.builtin.replace", {"path": "/etc/containerd/config.toml"}),
        _event("h1", "ansible.builtin.file", {"path": "/etc/cni/net.d", "state": "directory"}),
        _event("h1", "ansible.builtin.copy", {"dest": "/etc/gone", "state": "absent"}),
        _event("h1", "ansible.builtin.apt", {"name": ["kubeadm=1.31.4-*", "kubelet=1.31.4-*"], "state": "present"}),
        _event("h1", "ansible.builtin.apt", {"name": "old-thing", "state": "absent"}),
        # The roles' dpkg-query before installing: on a re-run nothing is
        # installed, yet the packages are the roles'. Patterns are not names.
        _event("h1", "ansible.builtin.command",
               {"argv": ["dpkg-query", "-W", "-f=${Package}\t${Version}\n", "containerd", "nvidia-fabricmanager*"]}),
        _event("h1", "ansible.builtin.command", {"argv": ["systemctl", "is-active", "notapackage"]}),
        _event("h1", "ansible.builtin.systemd_service", {"name": "kubelet", "enabled": True, "state": None}),
        _event("h1", "ansible.builtin.systemd_service", {"name": "containerd", "enabled": None, "state": "restarted"}),
        _event("h1", "ansible.builtin.systemd_service", {"name": None, "daemon_reload": True}),
        # A failed task and a no_log task (censored result) teach nothing.
        _event("h1", "ansible.builtin.template", {"dest": "/etc/failed"}, kind="runner_on_failed"),
        {"event": "runner_on_ok", "event_data": {"host": "h1", "task_action": "ansible.builtin.template",
                                                 "res": {"censored": "the output has been hidden"}}},
        _event("h2", "ansible.builtin.template", {"dest": "/etc/only-h2"}),
        _event("unknown-host", "ansible.builtin.template", {"dest": "/etc/x"}),
    ]:
        collector(event)
    h1 = collector.hosts["h1"]
    assert h1.files == {"/etc/crictl.yaml", "/etc/containerd/config.toml"}
    assert h1.packages == {"kubeadm", "kubelet", "containerd"}
    assert h1.enabled == {"kubelet"} and h1.active == {"containerd"}
    assert collector.hosts["h2"].files == {"/etc/only-h2"}


# ------------------------------------------------------------ host scripts
@pytest.fixture()
def host(tmp_path):
    """A 'host': a state folder, managed files, and a fake systemctl on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").symlink_to(HERE / "fake_systemctl")
    units = tmp_path / "units"
    for verb in ("is-enabled", "is-active"):
        (units / verb).mkdir(parents=True)
    files = tmp_path / "etc"
    files.mkdir()
    for name in ("crictl.yaml", "with space.conf"):
        (files / name).write_text(f"managed {name}\n")
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FAKE_SYSTEMCTL_DIR": str(units)}

    class Host:
        state = tmp_path / "state"

        def run(self, script):
            result = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=60)
            assert result.returncode == 0, result.stderr
            return parse_verdict("h", result.stdout)

        def unit(self, verb, name, on=True):
            path = units / verb / name
            path.touch() if on else path.unlink()

    applied = AppliedState(files={str(files / "crictl.yaml"), str(files / "with space.conf"), str(files / "never")},
                           packages={"bash", "coreutils"}, enabled={"kubelet"}, active={"containerd"})
    h = Host()
    h.applied, h.files = applied, files
    h.unit("is-enabled", "kubelet")
    h.unit("is-active", "containerd")
    return h


def test_a_host_without_a_record_is_never_up_to_date(host):
    verdict = host.run(converge.check_script("f" * 64, str(host.state)))
    assert not verdict.up_to_date and verdict.reason == "never converged by corral"


def test_record_then_check_is_up_to_date(host):
    recorded = host.run(converge.record_script("f" * 64, host.applied, str(host.state)))
    assert recorded.up_to_date
    assert host.run(converge.check_script("f" * 64, str(host.state))).up_to_date
    assert oct(host.state.stat().st_mode & 0o777) == "0o700"
    # A file the roles wrote and later removed is not part of the record.
    assert "never" not in (host.state / "files.sha256").read_text()
    # Recording again (a forced run) leaves nothing behind but the record.
    host.run(converge.record_script("f" * 64, host.applied, str(host.state)))
    assert sorted(p.name for p in host.state.iterdir()) == sorted(
        ["fingerprint", "files.sha256", "packages", "packages.versions", "services.enabled", "services.active"])


@pytest.mark.parametrize("drift, reason", [
    ("fingerprint", "roles or inputs changed since the last converge"),
    ("edit", "managed files changed: {file}: FAILED"),
    ("delete", "managed files changed: {file}: FAILED open or read"),
    ("package", "managed packages changed"),
    ("disabled", "unit kubelet is not enabled"),
    ("stopped", "unit containerd is not running"),
    ("cut-short", "never converged by corral"),
])
def test_every_kind_of_drift_is_found_and_named(host, drift, reason):
    host.run(converge.record_script("f" * 64, host.applied, str(host.state)))
    target = host.files / "with space.conf"
    fingerprint = "f" * 64
    if drift == "fingerprint":
        fingerprint = "e" * 64
    elif drift == "edit":
        target.write_text("changed by hand\n")
    elif drift == "delete":
        target.unlink()
    elif drift == "package":
        # As if coreutils had been up- or downgraded since the record.
        versions = host.state / "packages.versions"
        versions.write_text(versions.read_text().replace("coreutils=", "coreutils=0:"))
    elif drift == "disabled":
        host.unit("is-enabled", "kubelet", on=False)
    elif drift == "stopped":
        host.unit("is-active", "containerd", on=False)
    elif drift == "cut-short":
        (host.state / "fingerprint").unlink()
    verdict = host.run(converge.check_script(fingerprint, str(host.state)))
    assert not verdict.up_to_date
    assert verdict.reason.startswith(reason.format(file=target)), verdict.reason


def test_the_verdict_needs_the_checks_own_line():
    assert parse_verdict("h", "motd noise\ncorral-converge: up to date\n").up_to_date
    assert not parse_verdict("h", "up to date\n").up_to_date
    assert not parse_verdict("h", "corral-converge: up to dated\n").up_to_date
