"""Tests of the throwaway test-host lab (tests/hostlab) itself.

Two kinds:

* plain tests of the fakes and the inventory writer, which run anywhere with
  Python 3.11 (the fakes run on this machine under ``CORRAL_FAKE_ROOT``);
* ``@pytest.mark.hostlab`` tests that boot real systemd-nspawn hosts; they are
  skipped with the reason from ``available()`` where that is impossible.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import textwrap
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:  # `pytest tests/test_hostlab.py` without pythonpath config
    sys.path.insert(0, str(_ROOT))

from corral.model.containerd import package_version  # noqa: E402
from corral.model.versions import DEFAULT_CONTAINERD, NVIDIA_CONTAINER_TOOLKIT  # noqa: E402
from tests import gobuild  # noqa: E402
from tests.hostlab import Lab, LabConfig, available  # noqa: E402
from tests.hostlab import lab as lab_module  # noqa: E402
from tests.hostlab.aptrepo import default_repos, render_fake  # noqa: E402
from tests.hostlab.lab import _RULE_COMMENT_PREFIX, _mounted_under  # noqa: E402

# registers the `hostlab` marker and the fixtures even without a root conftest entry
pytest_plugins = ["tests.hostlab.conftest_plugin"]

hostlab_only = pytest.mark.skipif(not available()[0], reason=f"hostlab unavailable: {available()[1]}")


# --------------------------------------------------------------------------
# fakes, run on this machine under CORRAL_FAKE_ROOT
# --------------------------------------------------------------------------

def _fake(tmp_path: Path, program: str, **build) -> Path:
    """Render a fake like the package build does, into tmp_path/bin."""
    defaults = {"driver_version": "550.127.05", "cuda_version": "12.4",
                "gpu_model": "NVIDIA H100 80GB HBM3", "gpu_count": 8, "gpu_memory_mib": 81559,
                "toolkit_version": "1.17.8", "k8s_version": "1.31.4", "cri_tools_version": "1.31.1"}
    path = tmp_path / "bin" / program
    path.parent.mkdir(exist_ok=True)
    path.write_text(render_fake(program, {**defaults, **build}))
    path.chmod(0o755)
    return path


def _run_fake(tmp_path: Path, program: str, *args: str, check=True, **build):
    root = tmp_path / "root"
    root.mkdir(exist_ok=True)
    exe = _fake(tmp_path, program, **build)
    env = {**os.environ, "CORRAL_FAKE_ROOT": str(root)}
    res = subprocess.run([sys.executable, str(exe), *args], capture_output=True, text=True,
                         env=env, timeout=30)
    if check:
        assert res.returncode == 0, res.stderr
    return res


def test_every_fake_is_marked_as_a_test_fake():
    for src in (Path(__file__).parent / "hostlab/fakepkgs/bin").iterdir():
        head = src.read_text().splitlines()[:3]
        assert head[0].startswith("#!"), src
        assert head[1].startswith("# TEST FAKE: "), src


def test_fake_nvidia_smi_answers_like_the_real_one(tmp_path):
    out = _run_fake(tmp_path, "nvidia-smi", "--query-gpu=name,count", "--format=csv,noheader").stdout
    assert out.splitlines() == ["NVIDIA H100 80GB HBM3, 8"] * 8
    out = _run_fake(tmp_path, "nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader").stdout
    assert set(out.split()) == {"550.127.05"}
    lines = _run_fake(tmp_path, "nvidia-smi", "-L").stdout.splitlines()
    assert len(lines) == 8 and lines[0].startswith("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-")
    # the GPU file a test can write overrides the build defaults
    conf = tmp_path / "root/etc/corral-fakes/gpus"
    conf.parent.mkdir(parents=True)
    conf.write_text("model=NVIDIA L40S\ncount=2\n")
    out = _run_fake(tmp_path, "nvidia-smi", "--query-gpu=name,memory.total", "--format=csv").stdout
    assert out.splitlines() == ["name, memory.total [MiB]", "NVIDIA L40S, 81559 MiB", "NVIDIA L40S, 81559 MiB"]
    log = (tmp_path / "root/var/log/corral-fakes/nvidia-smi.log").read_text().splitlines()
    assert log[0] == "nvidia-smi --query-gpu=name,count --format=csv,noheader"
    assert len(log) == 4


def test_fake_nvidia_ctk_configures_containerd(tmp_path):
    cfg = tmp_path / "root/etc/containerd/config.toml"
    cfg.parent.mkdir(parents=True)
    cfg.write_text(textwrap.dedent("""\
        version = 2
        [plugins."io.containerd.grpc.v1.cri".containerd]
          default_runtime_name = "runc"
          [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
            runtime_type = "io.containerd.runc.v2"
            [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
              SystemdCgroup = true
        """))
    _run_fake(tmp_path, "nvidia-ctk", "runtime", "configure", "--runtime=containerd", "--set-as-default")
    data = tomllib.loads(cfg.read_text())
    cd = data["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]
    assert cd["default_runtime_name"] == "nvidia"
    nv = cd["runtimes"]["nvidia"]
    assert nv["runtime_type"] == "io.containerd.runc.v2"
    assert nv["options"] == {"SystemdCgroup": True, "BinaryName": "/usr/bin/nvidia-container-runtime"}
    assert cd["runtimes"]["runc"]["options"] == {"SystemdCgroup": True}
    # idempotent, like the real one
    before = cfg.read_text()
    _run_fake(tmp_path, "nvidia-ctk", "runtime", "configure", "--runtime=containerd", "--set-as-default")
    assert cfg.read_text() == before


def test_fake_kubeadm_join_validates_and_leaves_join_files(tmp_path):
    yaml = pytest.importorskip("yaml")  # the fake needs it, as the package's Depends says
    root = tmp_path / "root"
    (root / "proc/sys/net/ipv4").mkdir(parents=True)
    (root / "proc/sys/net/ipv4/ip_forward").write_text("1\n")
    bad = tmp_path / "root/bad.yaml"
    bad.write_text("apiVersion: kubeadm.k8s.io/v1beta4\nkind: InitConfiguration\n")
    res = _run_fake(tmp_path, "kubeadm", "join", "--config", "/bad.yaml", check=False)
    assert res.returncode == 1 and "no JoinConfiguration" in res.stderr
    good = root / "join.yaml"
    good.write_text(textwrap.dedent("""\
        apiVersion: kubeadm.k8s.io/v1beta4
        kind: JoinConfiguration
        discovery:
          bootstrapToken:
            apiServerEndpoint: cp.sf1.internal:6443
            token: abcdef.0123456789abcdef
            caCertHashes: ["sha256:%s"]
        nodeRegistration:
          name: gpu-001
          kubeletExtraArgs:
            - {name: node-labels, value: "corral.dev/gpu=true"}
        ---
        apiVersion: kubelet.config.k8s.io/v1beta1
        kind: KubeletConfiguration
        maxPods: 200
        """ % ("0" * 64)))
    res = _run_fake(tmp_path, "kubeadm", "join", "--config", "/join.yaml")
    assert "This node has joined the cluster" in res.stdout
    assert (root / "etc/kubernetes/kubelet.conf").exists()
    kcfg = yaml.safe_load((root / "var/lib/kubelet/config.yaml").read_text())
    assert kcfg["kind"] == "KubeletConfiguration" and kcfg["maxPods"] == 200
    assert "--node-labels=corral.dev/gpu=true" in (root / "var/lib/kubelet/kubeadm-flags.env").read_text()
    record = json.loads((root / "var/lib/corral-fakes/kubeadm-join.json").read_text())
    assert record["node_name"] == "gpu-001" and record["api_server_endpoint"] == "cp.sf1.internal:6443"
    # a second join fails preflight like the real one
    res = _run_fake(tmp_path, "kubeadm", "join", "--config", "/join.yaml", check=False)
    assert res.returncode == 1 and "FileAvailable--etc-kubernetes-kubelet.conf" in res.stderr
    _run_fake(tmp_path, "kubeadm", "reset", "-f")
    assert not (root / "etc/kubernetes/kubelet.conf").exists()
    (root / "proc/sys/net/ipv4/ip_forward").write_text("0\n")
    res = _run_fake(tmp_path, "kubeadm", "join", "--config", "/join.yaml", check=False)
    assert res.returncode == 1 and "ip_forward contents are not set to 1" in res.stderr
    assert _run_fake(tmp_path, "kubeadm", "version", "-o", "short").stdout == "v1.31.4\n"


def test_repo_recipes_mirror_upstream_names_and_versions():
    repos = {r.name: r for r in default_repos(driver_versions=("550.90.07", "550.127.05"),
                                               k8s_versions=("1.30.8", "1.31.4"))}
    assert set(repos) == {"cuda", "nvidia-container-toolkit", "kubernetes-v1.30", "kubernetes-v1.31", "docker",
                          "debian-kernel", "debian-kernel-update"}
    # Docker's containerd.io: the last 1.7 corral pinned and the catalog's default (the real
    # containerd inside, built by scripts/build-runtime), when this machine can build it.
    docker = {(p.name, p.version): p for p in repos["docker"].packages}
    expected = {("containerd.io", "1.7.27-1")}
    if gobuild.available("build-runtime", "CORRAL_RUNTIME_BIN")[0]:
        expected.add(("containerd.io", package_version(DEFAULT_CONTAINERD)))
        real = docker["containerd.io", package_version(DEFAULT_CONTAINERD)]
        assert real.files["/usr/bin/containerd"][0] == "program" and real.conflicts == ["containerd"]
    assert set(docker) == expected
    # A Debian flavour's kernel, headers and metapackages, before and after an update.
    kernel = {p.name: p.version for p in repos["debian-kernel"].packages}
    assert kernel == {"linux-image-6.1.0-90-amd64": "6.1.500-1", "linux-headers-6.1.0-90-amd64": "6.1.500-1",
                      "linux-image-amd64": "6.1.500-1", "linux-headers-amd64": "6.1.500-1"}
    update = {p.name: p.version for p in repos["debian-kernel-update"].packages}
    assert update["linux-headers-amd64"] == "6.1.501-1" and "linux-headers-6.1.0-92-amd64" in update
    cuda = {(p.name, p.version) for p in repos["cuda"].packages}
    for name in ("cuda-drivers", "cuda-drivers-550", "nvidia-driver", "nvidia-fabricmanager-550",
                 "nvidia-persistenced", "nvidia-smi"):
        assert (name, "550.127.05-1") in cuda and (name, "550.90.07-1") in cuda
    tk = {(p.name, p.version): p for p in repos["nvidia-container-toolkit"].packages}
    names = {"libnvidia-container1", "libnvidia-container-tools", "nvidia-container-toolkit-base",
             "nvidia-container-toolkit"}
    assert set(tk) == {(name, f"{v}-1") for name in names for v in ("1.17.8", NVIDIA_CONTAINER_TOOLKIT.value)}
    # From 1.18 the toolkit wants its own release of the tools, as the real package does.
    assert "libnvidia-container-tools (= 1.20.2-1)" in tk["nvidia-container-toolkit", "1.20.2-1"].depends
    assert "libnvidia-container-tools (>= 1.17.8-1)" in tk["nvidia-container-toolkit", "1.17.8-1"].depends
    k8s = {p.name: p.version for p in repos["kubernetes-v1.31"].packages}
    assert k8s["kubeadm"] == "1.31.4-1.1" and k8s["kubelet"] == "1.31.4-1.1"
    assert repos["kubernetes-v1.31"].path == "core:/stable:/v1.31/deb"


def test_inventory_uses_names_and_ansible_host(tmp_path):
    lab = Lab(LabConfig(cache_dir=tmp_path / "cache", run_dir=tmp_path / "run", machine_prefix=""))
    a = lab.add_host("gpu-001.sf1.internal")
    b = lab.add_host("gpu-002.sf1.internal")
    inv = json.loads(lab.write_inventory(tmp_path / "inv.yml", groups={"gpu": [a, b]}).read_text())
    assert inv["all"]["hosts"]["gpu-001.sf1.internal"] == {"ansible_host": a.ip}
    assert inv["all"]["children"]["gpu"]["hosts"] == {"gpu-001.sf1.internal": {}, "gpu-002.sf1.internal": {}}
    common = inv["all"]["vars"]["ansible_ssh_common_args"]
    assert "StrictHostKeyChecking=no" in common and "ControlMaster=auto" in common
    assert a.ip != b.ip and a.machine == "gpu-001" and a.hostname == "gpu-001"
    cfg = lab.write_ssh_config(tmp_path / "ssh_config").read_text()
    assert f"Host gpu-001.sf1.internal gpu-001 {a.ip}" in cfg


def test_available_names_what_is_missing(monkeypatch):
    import tests.hostlab.lab as lab_mod
    monkeypatch.setattr(lab_mod.os, "geteuid", lambda: 1000)
    ok, reason = lab_mod.available()
    assert not ok and "root" in reason
    monkeypatch.setattr(lab_mod.os, "geteuid", lambda: 0)
    real_which = shutil.which
    monkeypatch.setattr(lab_mod.shutil, "which",
                        lambda tool: None if tool == "debootstrap" else real_which(tool))
    ok, reason = lab_mod.available()
    assert not ok and "debootstrap" in reason and "install-hostlab-deps.sh" in reason


# --------------------------------------------------------------------------
# first run on an empty cache: pytest workers race (issue 34)
# --------------------------------------------------------------------------

RACERS = 6


def _race(make, barrier, results) -> None:
    """One racer: wait for the others, then make the cached thing; report what it got."""
    try:
        barrier.wait(timeout=60)
        results.put(("ok", make()))
    except BaseException as exc:  # reported to the test, which fails on it
        results.put(("error", f"{type(exc).__name__}: {exc}"))


def _run_racers(make) -> list[str]:
    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(RACERS), ctx.Queue()
    procs = [ctx.Process(target=_race, args=(make, barrier, results)) for _ in range(RACERS)]
    for proc in procs:
        proc.start()
    outcomes = [results.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join(timeout=30)
    errors = [detail for kind, detail in outcomes if kind == "error"]
    assert not errors, f"{len(errors)} of {RACERS} racers failed: {errors[0]}"
    return [detail for _, detail in outcomes]


@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="needs ssh-keygen (openssh-client)")
def test_workers_racing_on_an_empty_cache_share_one_lab_key(tmp_path):
    """Two pytest workers on a fresh machine both found no key, and the second
    ssh-keygen stopped at its overwrite prompt (34 hostlab errors in one run)."""
    cache = tmp_path / "cache"

    def make() -> str:
        key = Lab(LabConfig(cache_dir=cache, run_dir=tmp_path / "run")).ensure_key()
        return f"{Path(f'{key}.pub').read_text()}|{key.read_text()}"

    got = _run_racers(make)
    assert len(set(got)) == 1, "racers ended with different keys"
    key = cache / "ssh" / "id_ed25519"
    assert key.stat().st_mode & 0o077 == 0
    check = subprocess.run(["ssh-keygen", "-y", "-f", str(key)], capture_output=True, text=True, timeout=30)
    assert check.returncode == 0 and check.stdout.split()[:2] == got[0].split("|")[0].split()[:2]
    assert sorted(p.name for p in key.parent.iterdir()) == [".lock", "id_ed25519", "id_ed25519.pub"]


@pytest.mark.skipif(shutil.which("gpg") is None, reason="needs gpg (gnupg)")
def test_workers_racing_on_an_empty_cache_share_one_repository_key(tmp_path):
    from tests.hostlab.aptrepo import AptRepo

    def make() -> str:
        return AptRepo(repos=[], cache_dir=tmp_path).ensure_key()

    got = _run_racers(make)
    assert len(set(got)) == 1, f"racers made {len(set(got))} signing keys"
    listed = subprocess.run(["gpg", "--homedir", str(tmp_path / "gpg"), "--batch", "--with-colons",
                             "--list-secret-keys"], capture_output=True, text=True, timeout=60)
    assert [line for line in listed.stdout.splitlines() if line.startswith("fpr:")] == [
        f"fpr:::::::::{got[0]}:"]
    subprocess.run(["gpgconf", "--homedir", str(tmp_path / "gpg"), "--kill", "all"], check=False, timeout=20)


def test_unreachable_mirror_is_named_in_the_error(tmp_path):
    from tests.hostlab import LabError
    lab = Lab(LabConfig(cache_dir=tmp_path, mirror="http://127.0.0.1:9/debian"))
    with pytest.raises(LabError, match=r"mirror http://127\.0\.0\.1:9/debian is unreachable"):
        lab._check_mirror()


# --------------------------------------------------------------------------
# real hosts
# --------------------------------------------------------------------------

def _alive(pid: int) -> bool:
    """Running (not gone, not a zombie waiting for PID 1 to reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _lab_leftovers(bridge: str, run_dir: Path) -> list[str]:
    """Everything a lab on `bridge` could leave behind, described."""
    left = []
    if Path(f"/sys/class/net/{bridge}").exists():
        left.append(f"bridge {bridge}")
    if _mounted_under(run_dir / bridge):
        left.append(f"mounts {_mounted_under(run_dir / bridge)}")
    rules = subprocess.run(["iptables-save"], capture_output=True, text=True).stdout
    left += [r for r in rules.splitlines() if _RULE_COMMENT_PREFIX + bridge in r]
    for hier in ("systemd", "unified", "memory", "cpu"):
        for d in Path("/sys/fs/cgroup", hier).rglob(f"corral-hostlab-{bridge}"):
            left.append(f"cgroup {d}")
    if (run_dir / bridge).exists():
        left.append(f"dir {run_dir / bridge}")
    return left


@pytest.fixture
def selftest_run_dir():
    """Run dir for the extra labs these tests start.

    Not under tmp_path: pytest deletes old tmp dirs with rm -rf, which must
    never walk into a lab's overlay mount if a test left one behind.
    """
    run_dir = Path(f"/run/corral-hostlab-selftest-{os.getpid()}")
    yield run_dir
    from tests.hostlab.lab import cleanup_all
    cleanup_all(run_dir)
    if run_dir.exists() and not _mounted_under(run_dir):
        shutil.rmtree(run_dir, ignore_errors=True)


@pytest.mark.hostlab
def test_three_hosts_ssh_apt_fakes_stop_and_restart(hostlab, hostlab_repo, hostlab_hosts, tmp_path):
    names = ["gpu-001.sf1.internal", "gpu-002.sf1.internal", "gpu-003.sf1.internal"]
    hosts = hostlab_hosts(names)
    assert [h.name for h in hosts] == names
    for h in hosts:
        assert h.state == "running", h.failed_units
        assert h.run("hostname").stdout.strip() == h.hostname
        assert h.run("hostname -f").stdout.strip() == h.name

    def install(h):
        hostlab_repo.configure_host(h)
        h.run("DEBIAN_FRONTEND=noninteractive apt-get install -y -q nvidia-driver", timeout=180)
        return h.run("nvidia-smi --query-gpu=name,count --format=csv,noheader").stdout

    with ThreadPoolExecutor(3) as ex:
        outputs = list(ex.map(install, hosts))
    assert all(o.splitlines() == ["NVIDIA H100 80GB HBM3, 8"] * 8 for o in outputs)
    # the repo really was signed and fetched over HTTP from the lab
    assert any("InRelease 200" in r for r in hostlab_repo.requests)
    assert "signed-by=" in hosts[0].path("/etc/apt/sources.list.d/corral-hostlab.list").read_text()
    assert hosts[0].run("nvidia-smi --query-gpu=driver_version --format=csv,noheader").stdout.split()[0] == "550.127.05"
    # a test can change the GPUs a host reports by writing a file through its root
    hosts[1].path("/etc/corral-fakes").mkdir(parents=True, exist_ok=True)
    hosts[1].path("/etc/corral-fakes/gpus").write_text("model=NVIDIA A100-SXM4-80GB\ncount=4\n")
    assert len(hosts[1].run("nvidia-smi -L").stdout.splitlines()) == 4
    assert "nvidia-smi -L" in hosts[1].path("/var/log/corral-fakes/nvidia-smi.log").read_text()

    # the inventory works for Ansible (when ansible-core is installed)
    inv = hosts.write_inventory(tmp_path / "inventory.yml", groups={"gpu_nodes": hosts})
    if shutil.which("ansible"):
        res = subprocess.run(["ansible", "-i", str(inv), "gpu_nodes", "-m", "ping", "-o"],
                             capture_output=True, text=True, timeout=120, env=hostlab.ansible_env())
        assert res.returncode == 0, res.stdout + res.stderr
        assert res.stdout.count("SUCCESS") == 3

    # take one host away mid-run
    victim = hosts[2]
    victim.stop()
    assert not victim.running and not victim.reachable()
    assert subprocess.run(victim.ssh_args + ["true"], capture_output=True, timeout=30).returncode == 255
    assert not _mounted_under(victim.root)
    assert hosts[0].reachable() and hosts[1].run("true").returncode == 0
    # ...and bring it back: same disk, like a reboot
    victim.start()
    assert victim.run("dpkg-query -W -f='${Version}' nvidia-driver").stdout == "550.127.05-1"
    assert victim.run("systemctl is-enabled nvidia-persistenced").stdout.strip() == "enabled"


@pytest.mark.hostlab
def test_version_pinning_and_hold_behave_like_upstream(hostlab_repo_factory, hostlab_hosts):
    repo = hostlab_repo_factory(driver_versions=["550.90.07", "550.127.05"])
    (h,) = hostlab_hosts(["pin-001"])
    repo.configure_host(h, repos=["cuda"])
    h.path("/etc/apt/preferences.d/nvidia-driver").write_text(
        "Package: cuda-drivers cuda-drivers-* nvidia-driver nvidia-smi nvidia-persistenced "
        "nvidia-kernel-open-dkms nvidia-fabricmanager-*\nPin: version 550.90.07-1\nPin-Priority: 1001\n")
    h.run("DEBIAN_FRONTEND=noninteractive apt-get install -y -q cuda-drivers nvidia-fabricmanager-550")
    ver = "dpkg-query -W -f='${Version}' "
    assert h.run(ver + "nvidia-driver").stdout == "550.90.07-1"
    assert h.run("nvidia-smi --query-gpu=driver_version --format=csv,noheader").stdout.split()[0] == "550.90.07"
    # fabric manager ships disabled, like upstream
    assert h.run("systemctl is-enabled nvidia-fabricmanager", check=False).stdout.strip() == "disabled"
    # hold + no pin: upgrade keeps the held version
    h.path("/etc/apt/preferences.d/nvidia-driver").unlink()
    h.run("apt-mark hold nvidia-driver nvidia-smi cuda-drivers cuda-drivers-550 nvidia-persistenced "
          "nvidia-kernel-open-dkms nvidia-fabricmanager-550")
    h.run("DEBIAN_FRONTEND=noninteractive apt-get upgrade -y -q")
    assert h.run(ver + "nvidia-driver").stdout == "550.90.07-1"
    h.run("apt-mark unhold nvidia-driver nvidia-smi cuda-drivers cuda-drivers-550 nvidia-persistenced "
          "nvidia-kernel-open-dkms nvidia-fabricmanager-550")
    h.run("DEBIAN_FRONTEND=noninteractive apt-get install -y -q cuda-drivers")
    assert h.run(ver + "nvidia-driver").stdout == "550.127.05-1"


@pytest.mark.hostlab
def test_kubelet_crashloops_until_kubeadm_join_and_nvidia_ctk_on_host(hostlab_repo, hostlab_hosts):
    (h,) = hostlab_hosts(["k8s-001.sf1.internal"])
    hostlab_repo.configure_host(h)
    h.run("DEBIAN_FRONTEND=noninteractive apt-get install -y -q kubeadm kubelet kubectl "
          "nvidia-container-toolkit")
    assert h.run("kubeadm version -o short").stdout.strip() == "v1.31.4"
    assert h.run("kubelet --version").stdout.strip() == "Kubernetes v1.31.4"
    assert h.run("systemctl is-enabled kubelet").stdout.strip() == "enabled"
    assert h.run("systemctl is-active kubelet", check=False).stdout.strip() in ("activating", "failed")
    h.run("sysctl -w net.ipv4.ip_forward=1")
    h.path("/root/join.yaml").write_text(textwrap.dedent("""\
        apiVersion: kubeadm.k8s.io/v1beta3
        kind: JoinConfiguration
        discovery:
          bootstrapToken:
            apiServerEndpoint: 10.77.0.1:6443
            token: abcdef.0123456789abcdef
            unsafeSkipCAVerification: true
        """))
    h.run("kubeadm join --config /root/join.yaml")
    deadline = time.monotonic() + 20
    while h.run("systemctl is-active kubelet", check=False).stdout.strip() != "active":
        assert time.monotonic() < deadline, h.run("systemctl status kubelet", check=False).stdout
        time.sleep(0.5)
    assert h.path("/etc/kubernetes/kubelet.conf").exists()
    assert h.run("kubeadm join --config /root/join.yaml", check=False).returncode == 1
    h.run("nvidia-ctk runtime configure --runtime=containerd --set-as-default")
    cfg = tomllib.loads(h.path("/etc/containerd/config.toml").read_text())
    assert cfg["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["default_runtime_name"] == "nvidia"


@pytest.mark.hostlab
def test_degraded_host_reports_failed_units(hostlab_hosts):
    def broken_unit(host):
        unit = host.path("/etc/systemd/system/corral-broken.service")
        unit.write_text("[Service]\nType=oneshot\nExecStart=/bin/false\n"
                        "[Install]\nWantedBy=multi-user.target\n")
        wants = host.path("/etc/systemd/system/multi-user.target.wants")
        wants.mkdir(parents=True, exist_ok=True)
        (wants / "corral-broken.service").symlink_to("/etc/systemd/system/corral-broken.service")

    with pytest.warns(UserWarning, match="corral-broken.service"):
        (h,) = hostlab_hosts(["broken-001"], prepare=broken_unit)
    assert h.state == "degraded" and h.failed_units == ["corral-broken.service"]


@pytest.mark.hostlab
@hostlab_only
def test_teardown_leaves_nothing_behind(selftest_run_dir):
    """A second lab on its own bridge: boot, tear down, look for leftovers."""
    cpu = lab_module._cpu_hierarchy()  # None: no cpu controller, no quota to test
    cfg = LabConfig(bridge="corralbr9", subnet="10.78.9.0/24", run_dir=selftest_run_dir,
                    machine_prefix="t9-", host_cpus=0.3 if cpu else None)
    alone = not lab_module.forward_users()  # other labs (xdist workers) may share ip_forward
    forward_before = lab_module.IP_FORWARD.read_text()
    lab = Lab(cfg)
    try:
        hosts = lab.boot(2)
        assert all(h.run("true").returncode == 0 for h in hosts)
        assert _lab_leftovers("corralbr9", cfg.run_dir)  # sanity: the probe sees a live lab
        pids = [h.proc.pid for h in hosts]
        # host_cpus: every process of each host (nspawn, the container's
        # systemd, the sshd that ran `true`, ...) sits in a cpu cgroup of
        # its own with a 0.3-core quota.
        if cpu is not None:
            for h in hosts:
                group = f"corral-hostlab-corralbr9/{h.machine}"
                d = cpu[1] / group
                if cpu[0] == "v1":
                    period = int((d / "cpu.cfs_period_us").read_text())
                    assert int((d / "cpu.cfs_quota_us").read_text()) == int(0.3 * period)
                else:
                    assert (d / "cpu.max").read_text().split() == ["30000", "100000"]
                limited = lab_module._cgroup_pids([d])
                everything = lab_module._cgroup_pids([b / group for _, b in lab_module._cgroup_hierarchies()])
                assert len(limited) > 2 and limited == everything, (limited, everything)
    finally:
        lab.teardown()
    assert _lab_leftovers("corralbr9", cfg.run_dir) == []
    still_running = lab_module.forward_users()
    assert cfg.lab_dir not in still_running
    if still_running:  # the other labs still route their hosts
        assert lab_module.IP_FORWARD.read_text() == "1\n"
    else:  # the last lab put the machine's own value back
        assert not (lab_module.FORWARD_DIR / "original").exists()
        if alone:
            assert lab_module.IP_FORWARD.read_text() == forward_before
    assert not any(_alive(p) for p in pids)


@pytest.mark.hostlab
@hostlab_only
def test_a_killed_lab_is_cleaned_up_by_the_next_one(selftest_run_dir):
    """SIGKILL a process that owns a lab; the next lab on that bridge cleans up."""
    run_dir = selftest_run_dir
    script = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(_ROOT)!r})
        from tests.hostlab import Lab, LabConfig
        lab = Lab(LabConfig(bridge="corralbr8", subnet="10.78.8.0/24", machine_prefix="t8-",
                                run_dir=__import__("pathlib").Path({str(run_dir)!r})))
        (h,) = lab.boot(1)
        print(h.proc.pid, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert res.returncode == -9, res.stderr
    nspawn_pid = int(res.stdout.split()[0])
    assert _alive(nspawn_pid)  # the orphaned host is still running
    assert _lab_leftovers("corralbr8", run_dir)
    lab = Lab(LabConfig(bridge="corralbr8", subnet="10.78.8.0/24", run_dir=run_dir, machine_prefix="t8-"))
    lab.start()
    lab.teardown()
    deadline = time.monotonic() + 10
    while _alive(nspawn_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(nspawn_pid)
    assert _lab_leftovers("corralbr8", run_dir) == []


# --------------------------------------------------------------------------
# the Debian mirror comes from the machine's own apt sources
# --------------------------------------------------------------------------

def test_mirror_read_from_deb822_sources_skipping_security_and_disabled(tmp_path):
    d = tmp_path / "sources.list.d"
    d.mkdir()
    (d / "a-security.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n"
        "Components: main\n")
    (d / "b-debian.sources").write_text(
        "Types: deb-src\nURIs: http://src.example/debian\nSuites: bookworm\n\n"
        "Enabled: no\nTypes: deb\nURIs: http://off.example/debian\nSuites: bookworm\n\n"
        "# comment\nTypes: deb\nURIs: http://mirror.example/debian/\nSuites: bookworm bookworm-updates\n"
        "Components: main\n")
    assert lab_module.machine_debian_mirror(tmp_path) == "http://mirror.example/debian"


def test_mirror_read_from_one_line_sources_list(tmp_path):
    (tmp_path / "sources.list").write_text(
        "# deb http://commented.example/debian bookworm main\n"
        "deb [signed-by=/k.gpg arch=amd64] http://one.example/debian-security bookworm-security main\n"
        "deb [signed-by=/k.gpg] http://one.example/debian bookworm main\n")
    assert lab_module.machine_debian_mirror(tmp_path) == "http://one.example/debian"


def test_mirror_missing_is_a_clear_error(tmp_path):
    with pytest.raises(lab_module.LabError, match="CORRAL_HOSTLAB_MIRROR"):
        lab_module.machine_debian_mirror(tmp_path)


def test_read_only_proc_sys_is_the_reason_given(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda tool: f"/usr/bin/{tool}")
    monkeypatch.setattr(lab_module, "_proc_sys_read_only", lambda: True)
    ok, reason = lab_module.available()
    assert not ok and "read-only" in reason and "container" in reason
