"""Run playbooks/join.yml against real throwaway hosts (tests/hostlab) and
check the result with pytest-testinfra.

Hosts (systemd-nspawn Debian bookworm containers on a private bridge):
  gpu-001  gpu_nodes, roce_nodes, pool_h100 (8 x H100, fabric manager)
  gpu-002  gpu_nodes, pool_h100
  cpu-001  pool_cpu (no GPU: plain runc)
Packages come from the lab's signed apt repo of TEST FAKES (nvidia-driver,
nvidia-container-toolkit, kubeadm, kubelet, ...) plus Debian's mirror
(containerd, chrony, rdma-core) through the lab's NAT.

Sequence (one module-scoped lab, ~minutes): --check run on fresh hosts (must
not fail, must report changes, must write nothing), real run, second run
(changed=0 on every host), then the assertions.

Environment:
  CORRAL_HOSTLAB_BRIDGE / CORRAL_HOSTLAB_SUBNET   the lab's (one lab per bridge;
    e.g. corralans0 / 10.78.0.0/24 to run beside another lab user)
  CORRAL_ANSIBLE_TIMINGS=path                     append wall times as JSON
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import tomllib
from pathlib import Path

import pytest
import yaml

from corral.manifests.policy import NODE_RUNTIME_SETTINGS
from corral.model.versions import NVIDIA_CONTAINER_TOOLKIT
from corral.machine.containerd_config import render_config
from tests import gobuild
from tests.ansible.recap import parse_recap
from tests.hostlab.aptrepo import CONTAINERD_CURRENT, CONTAINERD_LEGACY

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_DIR = REPO / "ansible"

pytestmark = pytest.mark.hostlab

testinfra = pytest.importorskip("testinfra", reason="pytest-testinfra is not installed")

# The lab's session fixtures come from tests/conftest.py
# (pytest_plugins = ["tests.hostlab.conftest_plugin"]): `hostlab` (skips with
# the lab's reason when the machine cannot run it) and `hostlab_repo` (fake
# NVIDIA/k8s repos: driver 550.127.05 with 8 x "NVIDIA H100 80GB HBM3",
# toolkit 1.17.8 and 1.20.2, k8s 1.31.4). Not imported here: a second definition would
# start a second lab on the same bridge in one session.

DRIVER = "550.127.05"
K8S = "1.31.4"
TOKEN = "abcdef.0123456789abcdef"
CA_HASH = "sha256:" + "0123456789abcdef" * 4
# Machine names (first DNS label) are global on this machine (veth names):
# an "rl-" prefix keeps them apart from other suites' hosts.
GPU1, GPU2, CPU1 = (
    "rl-gpu-001.sf1.internal",
    "rl-gpu-002.sf1.internal",
    "rl-cpu-001.sf1.internal",
)
# containerd per host: gpu-001 keeps the last 1.7 (Debian's containerd 1.6.20 inside the test
# package; config layout version 2), gpu-002 runs the real containerd 2.3.6 built from its Go
# module (scripts/build-runtime; layout version 4), the catalog's default for every supported
# Kubernetes minor, and cpu-001 joins on 1.7 and is moved to 2.3.6 in place by a later run (the
# upgrade step of `corral upgrade --plan` that moves containerd). The module proves both layouts
# of corral's config on a running daemon, and the move between them.
PACKAGE_AT_JOIN = {GPU1: CONTAINERD_LEGACY, GPU2: CONTAINERD_CURRENT, CPU1: CONTAINERD_LEGACY}
PACKAGE = {**PACKAGE_AT_JOIN, CPU1: CONTAINERD_CURRENT}
CONTAINERD = {name: package.split("-")[0] for name, package in PACKAGE.items()}
# The roles' default pause image (the inventory here passes none).
SANDBOX = yaml.safe_load((ANSIBLE_DIR / "roles" / "container_runtime" / "defaults" / "main.yml").read_text())[
    "corral_containerd_sandbox_image"]
HOSTS = {
    GPU1: {
        "groups": ["onprem_nodes", "gpu_nodes", "roce_nodes", "site_sf1", "pool_h100"]
    },
    GPU2: {"groups": ["onprem_nodes", "gpu_nodes", "site_sf1", "pool_h100"]},
    CPU1: {"groups": ["onprem_nodes", "site_sf1", "pool_cpu"]},
}


def pool_vars(pool: str, gpu: bool) -> dict:
    labels = {
        "corral.dev/site": "sf1",
        "corral.dev/pool": pool,
        "corral.dev/gpu-model": "H100" if gpu else None,
        "corral.dev/roce": "true" if gpu else "false",
    }
    return {
        "corral_pool": pool,
        "corral_gpu_model": "H100" if gpu else None,
        "corral_gpu_count": 8 if gpu else 0,
        "corral_nvidia_driver_version": DRIVER if gpu else None,
        "corral_nvidia_fabricmanager": gpu,
        # host0 exists but the container has no RDMA: persisted, apply skipped.
        "corral_roce_interfaces": ["host0"] if gpu else [],
        "corral_roce_mtu": 9000,
        "corral_roce_pfc_priority": 3,
        "corral_roce_dscp": 26,
        "corral_roce_ecn": True,
        "corral_node_labels": labels,
        "corral_node_taints": (
            [
                {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
                {"key": "corral.dev/preflight", "effect": "NoSchedule"},
            ]
            if gpu
            else []
        ),
    }


def inventory(lab, repo, key_path: str) -> dict:
    hosts = [lab.hosts[n] for n in HOSTS]
    groups: dict[str, list] = {}
    for name, spec in HOSTS.items():
        for g in spec["groups"]:
            groups.setdefault(g, []).append(name)
    inv = lab.inventory_data(
        hosts,
        groups=groups,
        host_vars={name: {"corral_containerd_version": package.split("-")[0]}
                   for name, package in PACKAGE_AT_JOIN.items()},
        vars={
            # cluster
            "corral_cluster_name": "jaguar",
            "corral_kubernetes_version": K8S,
            "corral_pod_cidr": "10.244.0.0/16",
            "corral_service_cidr": "10.96.0.0/12",
            "corral_flannel_backend": "vxlan",
            "corral_flannel_direct_routing": True,
            # the lab's veth has MTU 1500: 1500 - 50 VXLAN overhead
            "corral_flannel_mtu": 1450,
            "corral_flannel_port": 8472,
            "corral_flannel_vni": 1,
            "corral_arp_gc_thresh1": 80000,
            "corral_arp_gc_thresh2": 90000,
            "corral_arp_gc_thresh3": 100000,
        },
    )
    children = inv["all"]["children"]
    children["site_sf1"]["vars"] = {
        "corral_site": "sf1",
        "corral_site_cidrs": [str(lab.config.network)],
        "corral_apt_mirror": None,
        "corral_http_proxy": None,
        # The lab's fake repos stand in for NVIDIA's and pkgs.k8s.io; the
        # key is a file on each host (what a site would put on its mirror).
        "corral_nvidia_repo_url": repo.url("cuda"),
        "corral_nvidia_repo_key_url": f"file://{key_path}",
        "corral_nvidia_container_toolkit_repo_url": repo.url(
            "nvidia-container-toolkit"
        ),
        "corral_nvidia_container_toolkit_repo_key_url": f"file://{key_path}",
        "corral_kubernetes_repo_url": repo.url("kubernetes-v1.31"),
        "corral_kubernetes_repo_key_url": f"file://{key_path}",
        "corral_containerd_repo_url": repo.url("docker"),
        "corral_containerd_repo_key_url": f"file://{key_path}",
        "corral_containerd_repo_suite": "/",
        "corral_containerd_repo_components": "",
    }
    children["pool_h100"]["vars"] = pool_vars("h100", True)
    children["pool_cpu"]["vars"] = pool_vars("cpu", False)
    return inv


def run_playbook(
    workdir: Path, inventory_path: Path, *extra: str, timeout: float = 1800
) -> dict:
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(ANSIBLE_DIR / "ansible.cfg"),
        ANSIBLE_FORCE_COLOR="0",
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_CACHE_PLUGIN_CONNECTION=str(workdir / "facts"),
        ANSIBLE_LOCAL_TEMP=str(workdir / "tmp"),
    )
    argv = [
        "ansible-playbook",
        "-i",
        str(inventory_path),
        "playbooks/join.yml",
        "-e",
        f"@{workdir / 'join-material.yml'}",
        *extra,
    ]
    t0 = time.monotonic()
    res = subprocess.run(
        argv,
        cwd=ANSIBLE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    wall = time.monotonic() - t0
    recap = parse_recap(res.stdout)
    return {
        "rc": res.returncode,
        "stdout": res.stdout,
        "stderr": res.stderr,
        "wall": wall,
        "recap": recap,
        "argv": argv,
    }


def explain(run: dict) -> str:
    return (
        f"$ {' '.join(run['argv'])}\nrc={run['rc']} wall={run['wall']:.1f}s recap={run['recap']}\n"
        f"--- stdout (tail) ---\n{run['stdout'][-20000:]}\n--- stderr ---\n{run['stderr'][-5000:]}"
    )


@pytest.fixture(scope="module")
def lab_run(hostlab, hostlab_repo, tmp_path_factory):
    ok, reason = gobuild.available("build-runtime", "CORRAL_RUNTIME_BIN")
    if not ok:
        pytest.skip(f"the real containerd 2.x cannot be built here: {reason}")
    lab, repo = hostlab, hostlab_repo
    workdir = tmp_path_factory.mktemp("ansible-hostlab")
    key_path = "/etc/corral-test/hostlab-archive-key.asc"
    t0 = time.monotonic()
    hosts = lab.boot(list(HOSTS))
    boot = time.monotonic() - t0
    try:
        for h in hosts:
            p = h.path(key_path)
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(repo.key_armored)
        inv_path = workdir / "inventory.yml"
        inv_path.write_text(json.dumps(inventory(lab, repo, key_path), indent=2))
        material = workdir / "join-material.yml"
        material.write_text(
            yaml.safe_dump(
                {
                    "corral_join_api_endpoint": "10.200.0.4:6443",
                    "corral_join_token": TOKEN,
                    "corral_join_ca_cert_hashes": [CA_HASH],
                }
            )
        )
        material.chmod(0o600)
        runs = {"check": run_playbook(workdir, inv_path, "--check", "--diff")}
        check_untouched = {
            h.name: not h.path("/etc/sysctl.d/90-corral-node.conf").exists()
            for h in hosts
        }
        runs["first"] = run_playbook(workdir, inv_path)
        runs["second"] = run_playbook(workdir, inv_path)
        # Failure budget: one GPU host fails its GPU check (the fake
        # nvidia-smi reports 7 GPUs) with a budget of 0%, so the rollout
        # stops before any GPU host joins; the host without GPUs has joined
        # before the GPU plays.
        gpus = lab.hosts[GPU1].path("/etc/corral-fakes/gpus")
        gpus.parent.mkdir(parents=True, exist_ok=True)
        gpus.write_text("model=NVIDIA H100 80GB HBM3\ncount=7\n")
        try:
            runs["budget"] = run_playbook(
                workdir,
                inv_path,
                "-e",
                "corral_max_fail_percentage=0",
            )
        finally:
            gpus.unlink()
        # Bare-metal code paths (module loading, reboot decision) in check
        # mode: pretend the hosts are not containers. No kernel module nvidia
        # is loaded here, so the GPU hosts must report a reboot, not do one.
        metal_check = (
            "--check",
            "-e",
            "corral_host_is_container=false",
            "-e",
            "corral_nvidia_install_kernel_headers=false",
        )
        runs["metal_check"] = run_playbook(workdir, inv_path, *metal_check)
        # The same, as if the hosts had never joined (no kubelet.conf): a
        # reboot disrupts nothing there, so all of them activate at once.
        runs["metal_check_fresh"] = run_playbook(
            workdir,
            inv_path,
            *metal_check,
            "-e",
            "corral_kubelet_kubeconfig=/etc/kubernetes/not-joined.conf",
        )
        runs["mtu"] = run_playbook(
            workdir, inv_path, "--limit", CPU1, "-e", "corral_flannel_mtu=8950"
        )
        # containerd 1.7 -> 2.3.6 on a joined node (the cluster file's containerd changed), twice.
        cpu = lab.hosts[CPU1]
        before = {"debian_containerd": cpu.run("dpkg-query -W -f='${Version}' containerd").stdout.strip()}
        move = ("--limit", CPU1, "-e", f"corral_containerd_version={CONTAINERD[CPU1]}")
        runs["containerd_move"] = run_playbook(workdir, inv_path, *move)
        runs["containerd_move_again"] = run_playbook(workdir, inv_path, *move)
        timings = {
            "boot_3_hosts": round(boot, 1),
            **{k: round(v["wall"], 1) for k, v in runs.items()},
        }
        print(f"\nhostlab ansible timings (s): {timings}")
        if os.environ.get("CORRAL_ANSIBLE_TIMINGS"):
            with open(os.environ["CORRAL_ANSIBLE_TIMINGS"], "a") as fh:
                fh.write(json.dumps(timings) + "\n")
        ssh_config = lab.write_ssh_config(workdir / "ssh_config", hosts=hosts)
        yield {
            "lab": lab,
            "hosts": {h.name: h for h in hosts},
            "runs": runs,
            "check_untouched": check_untouched,
            "before_containerd_move": before,
            "ssh_config": ssh_config,
            "timings": timings,
        }
    finally:
        for h in hosts:
            try:
                lab.remove_host(h)
            except (
                RuntimeError,
                OSError,
                subprocess.SubprocessError,
            ) as exc:  # keep removing the others
                print(f"hostlab: could not remove {h.name}: {exc}")


@pytest.fixture(scope="module")
def th(lab_run):
    """testinfra hosts by inventory name (over the lab's ssh config)."""
    return {
        name: testinfra.get_host(f"ssh://{name}", ssh_config=str(lab_run["ssh_config"]))
        for name in lab_run["hosts"]
    }


# ----------------------------------------------------------------- the runs


def test_check_mode_reports_changes_and_writes_nothing(lab_run):
    run = lab_run["runs"]["check"]
    assert run["rc"] == 0, explain(run)
    assert set(run["recap"]) == set(HOSTS), explain(run)
    for name, r in run["recap"].items():
        assert r["failed"] == 0 and r["unreachable"] == 0, explain(run)
        assert r["changed"] > 0, (
            f"{name}: --check on a fresh host should report changes\n" + explain(run)
        )
    assert all(lab_run["check_untouched"].values()), lab_run["check_untouched"]


def test_first_run_succeeds_on_every_host(lab_run):
    run = lab_run["runs"]["first"]
    assert run["rc"] == 0, explain(run)
    assert set(run["recap"]) == set(HOSTS), explain(run)
    for r in run["recap"].values():
        assert r["failed"] == 0 and r["unreachable"] == 0, explain(run)


def test_second_run_changes_nothing(lab_run):
    run = lab_run["runs"]["second"]
    assert run["rc"] == 0, explain(run)
    changed = {h: r["changed"] for h, r in run["recap"].items()}
    assert set(changed) == set(HOSTS) and all(c == 0 for c in changed.values()), (
        f"not idempotent: {changed}\n" + explain(run)
    )


def test_failure_budget_stops_gpu_rollout_only(lab_run):
    run = lab_run["runs"]["budget"]
    recap = run["recap"]
    out = " ".join(run["stdout"].split())
    assert recap[GPU1]["failed"] == 1, explain(run)
    assert "expected 8 x H100" in out and "found 7" in out, explain(run)
    # the other GPU host passed its check but did not go on to join ...
    assert recap[GPU2]["failed"] == 0, explain(run)
    assert recap[GPU2]["ok"] < lab_run["runs"]["second"]["recap"][GPU2]["ok"], explain(
        run
    )
    # ... while the host without GPUs went through all of its plays
    assert recap[CPU1] == {**lab_run["runs"]["second"]["recap"][CPU1]}, explain(run)


def reboot_batches(out: str) -> list[list[str]]:
    """The hosts of each "Reboot to load the declared driver" task header
    (one header per play, and per batch of a `serial` play)."""
    blocks = re.findall(
        r"TASK \[nvidia_driver : Reboot to load the declared driver\][^\n]*\n(.*?)\n\n",
        out,
        re.DOTALL,
    )
    return [sorted(re.findall(r"^changed: \[([^\]]+)\]", b, re.MULTILINE)) for b in blocks]


def test_metal_paths_in_check_mode_report_a_reboot(lab_run):
    """Serving nodes (joined in the first run) that must reboot for the
    driver do so one batch at a time (20% of two hosts: one per batch)."""
    run = lab_run["runs"]["metal_check"]
    assert run["rc"] == 0, explain(run)
    out = run["stdout"]
    assert reboot_batches(out) == [[GPU1], [GPU2]], explain(run)
    # the load attempt and the reason are reported
    assert "Load kernel modules now" in out, explain(run)
    for h in HOSTS:
        assert run["recap"][h]["failed"] == 0, explain(run)


def test_hosts_not_yet_joined_reboot_together(lab_run):
    """A host that is not a cluster node yet runs nothing a reboot could
    disrupt: all of them activate in one go, not in batches."""
    run = lab_run["runs"]["metal_check_fresh"]
    assert run["rc"] == 0, explain(run)
    assert reboot_batches(run["stdout"]) == [sorted([GPU1, GPU2])], explain(run)


def test_token_never_logged(lab_run):
    for name, run in lab_run["runs"].items():
        assert TOKEN not in run["stdout"] and TOKEN not in run["stderr"], (
            f"token leaked in the {name} run"
        )


def test_flannel_mtu_too_big_fails_clearly(lab_run):
    run = lab_run["runs"]["mtu"]
    assert run["rc"] != 0 and run["recap"][CPU1]["failed"] == 1, explain(run)
    # the callback wraps long messages: compare with whitespace normalised
    assert "flannel MTU 8950 does not fit interface host0 (MTU 1500)" in " ".join(
        run["stdout"].split()
    ), explain(run)


# ---------------------------------------------------------------- node_base


@pytest.mark.parametrize("name", list(HOSTS))
def test_node_base(th, name):
    h = th[name]
    mods = h.file("/etc/modules-load.d/90-corral.conf")
    assert mods.exists and mods.mode == 0o644
    assert {"overlay", "br_netfilter", "vxlan"} <= set(mods.content_string.split())
    sysctl = h.file("/etc/sysctl.d/90-corral-node.conf").content_string
    for line in (
        "net.ipv4.ip_forward = 1",
        "net.bridge.bridge-nf-call-iptables = 1",
        "net.bridge.bridge-nf-call-ip6tables = 1",
        "net.ipv4.conf.all.rp_filter = 2",
        "net.ipv4.conf.default.rp_filter = 2",
        "fs.inotify.max_user_instances = 8192",
        "fs.inotify.max_user_watches = 524288",
    ):
        assert line in sysctl
    # per-netns keys were applied; fs.* is read-only in the container (skipped)
    assert h.sysctl("net.ipv4.ip_forward") == 1
    assert h.sysctl("net.ipv4.conf.all.rp_filter") == 2
    assert h.run("swapon --show --noheadings").stdout.strip() == ""
    assert h.service("chrony").is_enabled


@pytest.mark.parametrize("name", list(HOSTS))
def test_arp_cache_persisted(th, name):
    content = th[name].file("/etc/sysctl.d/91-corral-arp-cache.conf").content_string
    for v, t in (("ipv4", 1), ("ipv4", 3), ("ipv6", 2)):
        assert f"net.{v}.neigh.default.gc_thresh{t} = {70000 + 10000 * t}" in content


# ------------------------------------------------------------ nvidia_driver


@pytest.mark.parametrize("name", [GPU1, GPU2])
def test_nvidia_driver(th, name):
    h = th[name]
    for pkg in (
        "nvidia-driver",
        "nvidia-kernel-open-dkms",
        "nvidia-smi",
        "nvidia-persistenced",
        "nvidia-fabricmanager-550",
    ):
        assert h.package(pkg).is_installed
        assert h.package(pkg).version == f"{DRIVER}-1"
        assert h.run(f"dpkg-query -W -f='${{Status}}' {pkg}").stdout.startswith("hold ")
    pin = h.file("/etc/apt/preferences.d/corral-nvidia").content_string
    assert f"Pin: version {DRIVER}-*" in pin and "Pin-Priority: 1001" in pin
    assert (
        "signed-by=/etc/apt/keyrings/corral-nvidia.asc"
        in h.file("/etc/apt/sources.list.d/corral-nvidia.list").content_string
    )
    assert h.service("nvidia-persistenced").is_enabled
    assert h.service("nvidia-persistenced").is_running
    assert h.service("nvidia-fabricmanager").is_enabled
    assert (
        len(
            h.check_output(
                "nvidia-smi --query-gpu=name --format=csv,noheader"
            ).splitlines()
        )
        == 8
    )


def test_no_driver_on_cpu_host(th):
    assert not th[CPU1].package("nvidia-driver").is_installed


# -------------------------------------------------------- container_runtime


def _containerd_config(h) -> dict:
    return tomllib.loads(h.file("/etc/containerd/config.toml").content_string)


@pytest.mark.parametrize("name,gpu", [(GPU1, True), (GPU2, True), (CPU1, False)])
def test_containerd(th, name, gpu):
    h = th[name]
    version = CONTAINERD[name]
    text = h.file("/etc/containerd/config.toml").content_string
    # The role wrote corral's template whole: the same bytes the cloud node prep writes.
    assert text == render_config(version, SANDBOX, nvidia_runtime=gpu)
    # What the daemon on the host runs with, as it says (not what the file says).
    dump = h.run("containerd config dump")
    assert dump.rc == 0, dump.stderr
    assert "unknown key" not in dump.stderr
    effective = tomllib.loads(dump.stdout)
    if version.startswith("1."):
        cri = effective["plugins"]["io.containerd.grpc.v1.cri"]
        sandbox, runtime = cri["sandbox_image"], cri
        assert cri["cni"]["bin_dir"] == "/opt/cni/bin"
    else:
        sandbox = effective["plugins"]["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"]
        runtime = effective["plugins"]["io.containerd.cri.v1.runtime"]
        assert runtime["cni"]["bin_dirs"] == ["/opt/cni/bin"]
        # The real containerd 2 is running, with its CRI plugins loaded.
        assert f"v{version} " in h.check_output("containerd --version") + " "
        plugins = h.check_output("ctr plugins ls")
        assert re.search(r"io\.containerd\.cri\.v1\s+runtime\s+.*\bok\b", plugins), plugins
    assert sandbox == SANDBOX
    runtimes = runtime["containerd"]["runtimes"]
    assert runtimes["runc"]["options"]["SystemdCgroup"] is True
    if gpu:
        assert runtime["containerd"]["default_runtime_name"] == "nvidia"
        assert runtimes["nvidia"]["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime"
        assert runtimes["nvidia"]["options"]["SystemdCgroup"] is True
        # Pinned past CVE-2025-23266, and held.
        held = h.check_output("apt-mark showhold").split()
        for package in ("nvidia-container-toolkit", "nvidia-container-toolkit-base", "libnvidia-container-tools",
                        "libnvidia-container1"):
            assert h.package(package).version == f"{NVIDIA_CONTAINER_TOOLKIT.value}-1", package
            assert package in held, package
        # Only allocated GPUs reach a container: the settings the device
        # plugin's volume-mounts strategy needs, top-level in config.toml.
        toolkit = tomllib.loads(h.file("/etc/nvidia-container-runtime/config.toml").content_string)
        assert {key: toolkit.get(key) for key in NODE_RUNTIME_SETTINGS} == NODE_RUNTIME_SETTINGS
    else:
        assert runtime["containerd"]["default_runtime_name"] == "runc"
        assert "nvidia" not in runtimes
    # Docker's containerd.io at the host's version, held (Debian 12's own
    # 1.6.20 is below containerd's minimum for Kubernetes 1.31).
    assert h.package("containerd.io").version == PACKAGE[name]
    assert "containerd.io" in h.check_output("apt-mark showhold").split()
    # RDMA pins memory: containers inherit containerd's unlimited memlock.
    assert h.check_output("systemctl show containerd -p LimitMEMLOCK") == "LimitMEMLOCK=infinity"
    assert h.service("containerd").is_enabled
    assert h.service("containerd").is_running


def test_containerd_moves_from_1_7_to_2_in_place(th, lab_run):
    """A joined node whose cluster moved to containerd 2 (the 1.34 step of the upgrade chain): the
    role replaces Debian's containerd with the real containerd 2.3.6, writes the layout-4 config in
    the same run, and a second run changes nothing."""
    first, again = lab_run["runs"]["containerd_move"], lab_run["runs"]["containerd_move_again"]
    assert first["rc"] == 0 and first["recap"][CPU1]["changed"] > 0, explain(first)
    assert again["rc"] == 0 and again["recap"][CPU1]["changed"] == 0, explain(again)
    assert lab_run["before_containerd_move"]["debian_containerd"].startswith("1.6."), lab_run["before_containerd_move"]
    h = th[CPU1]
    assert not h.package("containerd").is_installed  # Debian's, replaced by containerd.io 2.x
    assert h.package("containerd.io").version == CONTAINERD_CURRENT
    assert tomllib.loads(h.file("/etc/containerd/config.toml").content_string)["version"] == 4
    assert h.service("containerd").is_running


# --------------------------------------------------------------------- roce


def test_roce_persisted_not_applied(th, lab_run):
    h = th[GPU1]
    script = h.file("/usr/local/sbin/corral-roce-qos")
    assert script.mode == 0o755
    text = script.content_string
    assert (
        "PRIO=3" in text
        and "DSCP=26" in text
        and "MTU=9000" in text
        and "ECN=1" in text
    )
    assert "for IF in host0; do" in text
    assert h.service("corral-roce-qos").is_enabled
    assert h.package("rdma-core").is_installed and h.package("perftest").is_installed
    # container: not applied, with the reason in the output
    assert "apply and ACTIVE check skipped" in " ".join(
        lab_run["runs"]["first"]["stdout"].split()
    )
    assert not th[GPU2].file("/usr/local/sbin/corral-roce-qos").exists


# ------------------------------------------------------------- flannel_host


@pytest.mark.parametrize("name", list(HOSTS))
def test_flannel_host(th, name):
    h = th[name]
    assert h.file("/etc/cni/net.d").is_directory
    assert h.file("/run/flannel").is_directory
    assert (
        "vxlan" in h.file("/etc/modules-load.d/91-corral-flannel.conf").content_string
    )


# ------------------------------------------------------------- kubelet_join


@pytest.mark.parametrize("name", list(HOSTS))
def test_kubelet_join(th, name):
    h = th[name]
    for pkg in ("kubeadm", "kubelet", "kubectl"):
        assert h.package(pkg).version == f"{K8S}-1.1"
        assert h.run(f"dpkg-query -W -f='${{Status}}' {pkg}").stdout.startswith("hold ")
    assert (
        f"Pin: version {K8S}-*"
        in h.file("/etc/apt/preferences.d/corral-kubernetes").content_string
    )
    # What kubeadm joined with, as the fake kubeadm recorded it: the
    # JoinConfiguration itself (it holds the bootstrap token) is gone.
    record = json.loads(h.file("/var/lib/corral-fakes/kubeadm-join.json").content_string)
    assert record["api_version"] == "kubeadm.k8s.io/v1beta4"
    assert record["cri_socket"] == "unix:///run/containerd/containerd.sock"
    labels = record["kubelet_extra_args"]["node-labels"]
    gpu = "gpu" in name
    pool = "h100" if gpu else "cpu"
    assert labels == (
        f"corral.dev/gpu-model=H100,corral.dev/pool={pool},corral.dev/roce=true,corral.dev/site=sf1"
        if gpu
        else "corral.dev/pool=cpu,corral.dev/roce=false,corral.dev/site=sf1"
    )
    assert record["taints"] == pool_vars(pool, gpu)["corral_node_taints"]
    # The token is on no disk of the node after the join.
    for path in ("/run/corral-join/kubeadm-join.yaml", "/etc/kubernetes/kubeadm-join.yaml",
                 "/etc/kubernetes/bootstrap-kubelet.conf"):
        assert not h.file(path).exists, path
    found = h.run(f"grep -rlsF -D skip {TOKEN} /etc /run /var/lib /root /tmp /var/tmp")
    assert found.rc != 0 and not found.stdout.strip(), found.stdout
    # joined (the fake kubeadm leaves kubelet.conf like the real one) and enabled
    assert h.file("/etc/kubernetes/kubelet.conf").exists
    assert h.service("kubelet").is_enabled
    assert h.run("grep -c . /var/lib/corral-fakes/kubeadm-join.json").rc == 0
