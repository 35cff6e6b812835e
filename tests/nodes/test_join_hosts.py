"""`corral join` end to end on real throwaway hosts (systemd-nspawn, tests/hostlab).

Three GPU hosts and one CPU host are joined from a cluster file through the
real CLI, ansible-runner and the roles; packages come from the lab's signed
apt repository of test fakes (NVIDIA driver, toolkit, kubeadm, kubelet). Then:
the hosts' state is checked with testinfra; a second run finds every host up
to date and runs no role, a forced one runs them and changes nothing, and so
does `--check`; drift on one host (a managed file edited, a unit stopped)
converges that host only; a host taken away mid-run must not stop the others
and must be named in the report. The hosts' names resolve nowhere on this
machine: corral reaches them by the addresses in the cluster file, and checks
their ssh host keys against the file `corral hosts trust` recorded; a host
whose key changed stops the join until it is trusted again.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
from pathlib import Path

import pytest

pytest.importorskip("testinfra")
import testinfra  # noqa: E402

from . import joinlab  # noqa: E402

pytestmark = pytest.mark.hostlab

GPU_HOSTS, CPU_HOSTS = joinlab.host_names(gpu=3, cpu=1)
ALL_HOSTS = GPU_HOSTS + CPU_HOSTS


def run_cli(setup, *extra, timeout=1800):
    result = subprocess.run(joinlab.corral_join_argv(setup, *extra), env=joinlab.env_with(setup),
                            capture_output=True, text=True, timeout=timeout)
    return result


def recap(stdout: str) -> dict[str, dict[str, str]]:
    """Rows of the final per-host table: host -> {status, ok, changed, failed}."""
    rows = {}
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.split("│")]
        if len(cells) >= 7 and cells[1] in ALL_HOSTS:
            rows[cells[1]] = {"status": cells[2], "ok": cells[3], "changed": cells[4], "failed": cells[5],
                              "detail": cells[6]}
    return rows


@pytest.fixture(scope="module")
def joined(hostlab, hostlab_repo, tmp_path_factory):
    lab = hostlab
    workdir = tmp_path_factory.mktemp("corral-join")
    hosts = lab.boot(ALL_HOSTS)
    try:
        setup = joinlab.prepare(lab, hostlab_repo, hosts, workdir, GPU_HOSTS, CPU_HOSTS)
        first = run_cli(setup)
        yield {"lab": lab, "hosts": {h.name: h for h in hosts}, "setup": setup, "first": first}
    finally:
        joinlab.remove_hosts(lab, hosts)


@pytest.fixture(scope="module")
def infra(joined):
    config = str(joined["setup"].ssh_config)
    return {name: testinfra.get_host(f"ssh://{name}", ssh_config=config) for name in ALL_HOSTS}


def test_first_join_succeeds_on_every_host(joined):
    first = joined["first"]
    assert first.returncode == 0, first.stdout + first.stderr
    rows = recap(first.stdout)
    assert set(rows) == set(ALL_HOSTS)
    assert all(row["status"] == "changed" for row in rows.values()), rows
    assert "4 of 4 hosts ok" in first.stdout


def test_the_join_reached_the_hosts_by_address_without_dns(joined):
    for name in ALL_HOSTS:
        with pytest.raises(socket.gaierror):
            socket.getaddrinfo(name, 22)
    text = (joined["setup"].clusters / f"{joinlab.CLUSTER}.yaml").read_text()
    assert all(joined["hosts"][name].ip in text for name in ALL_HOSTS)
    assert "ANSIBLE_REMOTE_USER" not in joined["setup"].env and "-F" not in joined["setup"].env["ANSIBLE_SSH_ARGS"]


def test_trust_recorded_the_keys_the_hosts_really_have(joined):
    from corral.nodes.known_hosts import read

    recorded = read(joined["setup"].clusters / f"{joinlab.CLUSTER}.known_hosts")
    assert set(recorded) == set(ALL_HOSTS)
    for name in ALL_HOSTS:
        host = joined["hosts"][name]
        real = {tuple(host.path(f"/etc/ssh/ssh_host_{kind}_key.pub").read_text().split()[:2])
                for kind in ("ed25519", "ecdsa")}
        assert recorded[name] == real, name


def test_nodes_are_joined_with_the_pools_labels_and_taints(joined, infra):
    for name in GPU_HOSTS:
        host = infra[name]
        assert host.file("/etc/kubernetes/kubelet.conf").exists
        # What kubeadm joined with, as the fake kubeadm recorded it (the
        # JoinConfiguration itself holds the token and is gone).
        text = host.file("/var/lib/corral-fakes/kubeadm-join.json").content_string
        assert "kubeadm.k8s.io/v1beta4" in text and "10.200.0.5:6443" in text
        assert "corral.dev/pool=gpu-h100" in text and "corral.dev/gpu-model=H100" in text
        assert "corral.dev/team" in text and "robotics" in text
        assert host.service("kubelet").is_enabled
    cpu = infra[CPU_HOSTS[0]].file("/var/lib/corral-fakes/kubeadm-join.json").content_string
    assert "corral.dev/pool=cpu-edge" in cpu and "nvidia.com/gpu" not in cpu


def test_each_run_joins_with_a_fresh_token_that_leaves_no_trace_on_the_nodes(joined, infra):
    setup = joined["setup"]
    tokens = setup.tokens()
    assert len(tokens) == 1 and not json.loads(Path(f"{setup.kubectl_log}.secrets.json").read_text())
    for name in ALL_HOSTS:
        host = infra[name]
        for path in ("/run/corral-join/kubeadm-join.yaml", "/etc/kubernetes/kubeadm-join.yaml",
                     "/etc/kubernetes/bootstrap-kubelet.conf"):
            assert not host.file(path).exists, (name, path)
        secret = tokens[0].split(".")[1]
        found = host.run(f"grep -rlsF -D skip {secret} /etc /run /var/lib /root /tmp /var/tmp")
        assert found.rc != 0 and not found.stdout.strip(), (name, found.stdout)


def test_gpu_hosts_have_the_pinned_driver_and_nvidia_runtime(infra):
    for name in GPU_HOSTS:
        host = infra[name]
        driver = host.package("nvidia-driver")
        assert driver.is_installed and driver.version == "550.127.05-1"
        assert host.package("nvidia-fabricmanager-550").is_installed
        holds = host.check_output("apt-mark showhold").split()
        assert {"nvidia-driver", "kubelet", "kubeadm"} <= set(holds)
        gpus = host.check_output("nvidia-smi --query-gpu=name --format=csv,noheader").splitlines()
        assert len(gpus) == 8 and all("H100" in g for g in gpus)
        config = host.file("/etc/containerd/config.toml").content_string
        assert 'default_runtime_name = "nvidia"' in config and "SystemdCgroup = true" in config
        assert host.service("nvidia-persistenced").is_enabled
        assert host.service("containerd").is_running
    cpu = infra[CPU_HOSTS[0]]
    assert not cpu.package("nvidia-driver").is_installed
    assert 'default_runtime_name = "nvidia"' not in cpu.file("/etc/containerd/config.toml").content_string


def test_kernel_settings_are_persisted(infra):
    for name in ALL_HOSTS:
        host = infra[name]
        assert host.sysctl("net.ipv4.ip_forward") == 1
        sysctl_d = host.check_output("cat /etc/sysctl.d/*.conf")
        assert "net.ipv4.neigh.default.gc_thresh3" in sysctl_d
        assert "br_netfilter" in host.check_output("cat /etc/modules-load.d/*.conf")


def test_second_run_finds_every_host_up_to_date_and_runs_no_role(joined):
    setup = joined["setup"]
    second = run_cli(setup)
    assert second.returncode == 0, second.stdout + second.stderr
    rows = recap(second.stdout)
    assert set(rows) == set(ALL_HOSTS)
    assert all(row["changed"] == "0" and row["status"] == "ok" and row["detail"] == "up to date"
               for row in rows.values()), rows
    assert "0 changes, 4 up to date (not run)" in second.stdout
    assert len(setup.tokens()) == 1  # nothing to join: no token made


def test_forced_second_run_runs_the_roles_and_changes_nothing(joined):
    setup = joined["setup"]
    forced = run_cli(setup, "--force")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    rows = recap(forced.stdout)
    assert all(row["changed"] == "0" and row["status"] == "ok" and int(row["ok"]) > 50
               for row in rows.values()), rows
    assert len(setup.tokens()) == 2


def test_check_mode_on_healthy_hosts_changes_nothing(joined):
    check = run_cli(joined["setup"], "--check", "--force")
    assert check.returncode == 0, check.stdout + check.stderr
    assert all(row["changed"] == "0" for row in recap(check.stdout).values())


def test_drift_on_a_host_converges_that_host_only(joined, infra):
    """Someone edits a managed file on one host and stops containerd on another."""
    setup = joined["setup"]
    edited, stopped = GPU_HOSTS[1], CPU_HOSTS[0]
    infra[edited].run("echo '# hand edit' >> /etc/crictl.yaml")
    infra[stopped].run("systemctl stop containerd")
    tokens_before = len(setup.tokens())
    result = run_cli(setup)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = recap(result.stdout)
    assert {h for h, row in rows.items() if row["detail"] != "up to date"} == {edited, stopped}, rows
    assert "# hand edit" not in infra[edited].file("/etc/crictl.yaml").content_string
    assert infra[stopped].service("containerd").is_running
    assert len(setup.tokens()) == tokens_before + 1
    again = run_cli(setup)
    assert "0 changes, 4 up to date (not run)" in again.stdout, again.stdout


def test_the_token_stays_out_of_artifacts(joined):
    setup = joined["setup"]
    secrets = [token.split(".")[1] for token in setup.tokens()]
    assert secrets
    for path in setup.runs_dir.rglob("*"):
        if path.is_file():
            text = path.read_text(errors="ignore")
            assert not [s for s in secrets if s in text], path


def test_a_host_taken_away_mid_run_does_not_stop_the_others(joined):
    """Stop one host once the others are under way; they finish, it is named."""
    from corral.model import load_cluster
    from datetime import timedelta

    from corral.nodes.join import join_material, new_bootstrap_token, run_join

    setup = joined["setup"]
    victim = joined["hosts"][GPU_HOSTS[-1]]
    cluster = load_cluster(setup.clusters / f"{joinlab.CLUSTER}.yaml")
    stopped = threading.Event()

    def take_victim_away(report):
        # Once the first host has finished a few tasks, the run is under way.
        if not stopped.is_set() and report.hosts[GPU_HOSTS[0]].ok >= 3:
            stopped.set()
            threading.Thread(target=victim.stop, daemon=True).start()

    saved = dict(os.environ)
    os.environ.update(setup.env)
    try:
        material = join_material(joinlab.CLUSTER, setup.outputs)
        material["corral_join_token"] = new_bootstrap_token(timedelta(hours=1)).value
        report = run_join(cluster, material, ALL_HOSTS,
                          runs_dir=setup.runs_dir, extra_vars=[setup.extra_vars], on_update=take_victim_away)
    finally:
        os.environ.clear()
        os.environ.update(saved)
        victim.start()
    assert stopped.is_set()
    assert report.hosts[victim.name].status == "unreachable", json.dumps(report.hosts[victim.name].__dict__)
    assert report.hosts[victim.name].message
    for name in ALL_HOSTS:
        if name != victim.name:
            assert report.hosts[name].status == "ok", (name, report.hosts[name])
    assert not report.succeeded


def test_cli_exit_code_and_report_when_a_host_is_unreachable(joined):
    victim = joined["hosts"][CPU_HOSTS[0]]
    victim.stop()
    try:
        assert not victim.reachable()
        result = run_cli(joined["setup"])
    finally:
        victim.start()
    assert result.returncode == 1, result.stdout + result.stderr
    rows = recap(result.stdout)
    assert rows[victim.name]["status"] == "unreachable"
    assert all(rows[n]["status"] == "ok" for n in GPU_HOSTS)
    assert "3 of 4 hosts ok" in result.stdout


def test_a_host_whose_key_changed_stops_the_join_until_it_is_trusted_again(joined):
    """The host is reinstalled (new ssh host keys): corral join stops before any
    task, naming it; ssh itself refuses it too; `corral hosts trust` reports the
    change and records it only with --replace; then the join runs again."""
    from datetime import timedelta

    from corral.model import load_cluster
    from corral.nodes.join import join_material, new_bootstrap_token, run_join
    from corral.nodes.known_hosts import read

    setup, victim = joined["setup"], joined["hosts"][GPU_HOSTS[1]]
    known = setup.clusters / f"{joinlab.CLUSTER}.known_hosts"
    recorded = known.read_text()
    victim.stop()   # also closes the ssh master connections to it
    for key in (victim.dir / "upper" / "etc" / "ssh").glob("ssh_host_*"):
        key.unlink()
    victim.start()  # the lab makes new host keys for a host that has none
    new_keys = {tuple(victim.path(f"/etc/ssh/ssh_host_{kind}_key.pub").read_text().split()[:2])
                for kind in ("ed25519", "ecdsa")}
    assert new_keys.isdisjoint(read(known)[victim.name])

    runs_before = joinlab.artifact_dirs(setup)
    stopped = run_cli(setup)
    assert stopped.returncode == 1, stopped.stdout + stopped.stderr
    message = " ".join(stopped.stderr.split())
    assert f"ssh host key changed for {victim.name} (the keys recorded in {known} differ" in message
    assert f"corral hosts trust {joinlab.CLUSTER} --replace {victim.name}" in message
    assert joinlab.artifact_dirs(setup) == runs_before, "Ansible ran"

    # Without corral's check, ssh refuses the host on its own (StrictHostKeyChecking=yes
    # against the file, though the lab's environment says ANSIBLE_HOST_KEY_CHECKING=False).
    # First close the master connection the lab's own (unchecked) ssh opened while the
    # host booted: Ansible shares its ControlPath, and a reused master has no key exchange.
    subprocess.run(["ssh", *victim.ssh_options, "-O", "exit", f"root@{victim.ip}"], capture_output=True, timeout=30)
    saved = dict(os.environ)
    os.environ.update(setup.env)
    try:
        material = join_material(joinlab.CLUSTER, setup.outputs)
        material["corral_join_token"] = new_bootstrap_token(timedelta(hours=1)).value
        report = run_join(load_cluster(setup.clusters / f"{joinlab.CLUSTER}.yaml"), material, [victim.name],
                          runs_dir=setup.runs_dir, extra_vars=[setup.extra_vars])
    finally:
        os.environ.clear()
        os.environ.update(saved)
    assert report.hosts[victim.name].status == "unreachable"
    assert report.hosts[victim.name].message.startswith("ssh host key verification failed")

    kept = joinlab.trust_hosts(setup)
    assert kept.returncode == 1 and f"CHANGED, kept the recorded keys: {victim.name}" in kept.stdout
    assert known.read_text() == recorded
    replaced = joinlab.trust_hosts(setup, "--replace", victim.name)
    assert replaced.returncode == 0, replaced.stdout + replaced.stderr
    assert read(known)[victim.name] == new_keys
    again = run_cli(setup)
    assert again.returncode == 0, again.stdout + again.stderr
