"""Boot scripts that converge: every wait and every kubeadm run is bounded, retries
reset what a failed attempt left, giving up fails cloud-init visibly, etcd starts
without blocking the boot on quorum, its keys are its own from the first write, and
its data disk can neither stop the boot nor let etcd start on the root disk.

The API server and pool node scripts run with bash; kubeadm, curl, systemctl,
sleep and corral's other boot scripts are fakes on PATH (fake_* recorders), and
the scripts' absolute paths point into tmp_path. The same scripts under real
cloud-init: tests/bootstrap_lab.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from corral.machine import api_server, data_disk, pool_node
from corral.machine.api_server import (
    ETCD_WAIT_SECONDS,
    INIT_ATTEMPTS,
    ControlPlaneTls,
    api_server_secret_files,
    render_kubeadm_init_config,
)
from corral.machine.apt import APT_ATTEMPTS, APT_LOCK_TIMEOUT_SECONDS
from corral.machine.cloud_init import render_api_server_cloud_init, render_etcd_cloud_init, render_pool_cloud_init
from corral.machine.data_disk import DATA_DISK_DEVICE_TIMEOUT
from corral.machine.etcd_member import ETCD_PKI_DIR, EtcdMemberTls, etcd_secret_files
from corral.machine.files import bundle, unbundle
from corral.machine.kubeadm import JOIN_RETRY_SECONDS, KUBEADM_DIR, JoinToken
from corral.machine.pool_node import pool_secret_files
from corral.machine.secret_fetch import FETCH_SCRIPT, SecretRef
from corral.model import load_fleet
from corral.model.layout import layout

from .conftest import EXAMPLES

TOKEN, DIGEST = "abcdef.0123456789abcdef", "sha256:" + "ab" * 32


def example(name: str):
    return load_fleet([EXAMPLES]).clusters[name]


def user_data(document: str) -> dict:
    return yaml.safe_load(document)


def files_of(document: dict) -> dict[str, dict]:
    return {f["path"]: f for f in document["write_files"]}


class FakeMachine:
    """tmp_path as the machine: kubeadm's directory, sbin and fakes on PATH, a log of what ran."""

    def __init__(self, tmp_path: Path):
        self.root = tmp_path
        self.kubeadm_dir, self.sbin, self.bin = tmp_path / "kubeadm", tmp_path / "sbin", tmp_path / "bin"
        for folder in (self.kubeadm_dir, self.sbin, self.bin):
            folder.mkdir()
        self.calls = tmp_path / "calls.log"
        self.calls.touch()
        for name in ("systemctl", "sleep"):
            self.fake(f"bin/{name}", f'echo "{name} $*" >> {self.calls}')
        self.fake("sbin/corral-node-prep", "true")
        self.fake("sbin/corral-provider-id", "echo gce://fake-project/us-central1-a/the-machine")

    def fake(self, where: str, body: str) -> None:
        path = self.root / where
        path.write_text(f"#!/bin/bash\n# fake_{path.name}\n{body}\n")
        path.chmod(0o755)

    def kubeadm(self, fail_first: int) -> None:
        """fake_kubeadm: `init`/`join` fail the first `fail_first` times; records each call and
        whether a config it was given still had an unfilled placeholder."""
        self.fake("bin/kubeadm", f"""
count=$(grep -c '^kubeadm \\(init\\|join\\)' {self.calls} || true)
if [ "$1" = init ] || [ "$1" = join ]; then
  if grep -q __CORRAL_ "$3"; then echo "kubeadm $1 placeholder-left" >> {self.calls}; else echo "kubeadm $1" >> {self.calls}; fi
  [ "$count" -ge {fail_first} ] || exit 1
  exit 0
fi
echo "kubeadm $*" >> {self.calls}
""")

    def lines(self) -> list[str]:
        return self.calls.read_text().splitlines()

    def run(self, script: str) -> subprocess.CompletedProcess:
        text = (script.replace(KUBEADM_DIR, str(self.kubeadm_dir))
                .replace("/usr/local/sbin/", f"{self.sbin}/").replace("/etc/kubernetes/", f"{self.root}/"))
        env = {"PATH": f"{self.bin}:{os.environ['PATH']}", "TMPDIR": str(self.root)}
        return subprocess.run(["bash", "-c", text], capture_output=True, text=True, timeout=60, env=env)


def api_server_machine(tmp_path: Path, index: int, healthy_etcd: set[int], peer_ready: bool, fail_first: int):
    """API server `index` of ibis on a FakeMachine: its script, the fetched secret's files, fake curl."""
    ibis = example("ibis")
    lay = layout(ibis)
    files = files_of(user_data(render_api_server_cloud_init(ibis, lay, index, SecretRef("gcp", "", "ibis-apiserver"))))
    machine = FakeMachine(tmp_path)
    init = render_kubeadm_init_config(ibis, lay, [JoinToken(TOKEN, "")])
    (machine.kubeadm_dir / "join.yaml").write_text(files[f"{KUBEADM_DIR}/join.yaml"]["content"])
    # corral-fetch-secrets: writes what the secret holds (init.yaml with its placeholders, the token, the pin).
    machine.fake("sbin/corral-fetch-secrets", f"""echo fetch >> {machine.calls}
cat > {machine.kubeadm_dir}/init.yaml <<'INIT'
{init}INIT
echo {TOKEN} > {machine.kubeadm_dir}/bootstrap-token
echo {DIGEST} > {machine.kubeadm_dir}/ca-cert-hash""")
    subprocess.run([str(machine.sbin / "corral-fetch-secrets")], check=True)
    machine.calls.write_text("")
    healthy_urls = " ".join(f"{url}/health" for i, url in enumerate(lay.etcd_client_urls()) if i in healthy_etcd)
    machine.fake("bin/curl", f"""url="${{*: -1}}"
echo "curl $url" >> {machine.calls}
case "$url" in
  */readyz) {'exit 0' if peer_ready else 'exit 7'} ;;
esac
for healthy in {healthy_urls}; do
  [ "$url" = "$healthy" ] && {{ echo '{{"health":"true"}}'; exit 0; }}
done
exit 7""")
    machine.kubeadm(fail_first)
    return machine, files["/usr/local/sbin/corral-api-server"]["content"], lay


def test_first_api_server_inits_once_any_etcd_member_is_healthy_and_retries_with_reset(tmp_path):
    # Member 0 never answers: member 2 being healthy is enough.
    machine, script, lay = api_server_machine(tmp_path, 0, healthy_etcd={2}, peer_ready=False, fail_first=2)
    result = machine.run(script)
    assert result.returncode == 0, result.stderr
    calls = machine.lines()
    assert f"curl {lay.etcd_client_urls()[2]}/health" in calls
    kubeadm_calls = [c for c in calls if c.startswith(("kubeadm", "fetch"))]
    # Each failed init is reset; the reset empties the pki directory, so the secret is fetched
    # again and its init.yaml filled in anew (no placeholder reaches kubeadm).
    assert kubeadm_calls == ["kubeadm init", "kubeadm reset -f", "fetch", "kubeadm init", "kubeadm reset -f", "fetch", "kubeadm init"]
    assert "corral: kubeadm init failed (attempt 2 of 3)" in result.stderr
    assert not (machine.kubeadm_dir / "bootstrap-token").exists() and not (machine.kubeadm_dir / "init.yaml").exists()


def test_first_api_server_gives_up_after_its_init_attempts(tmp_path):
    machine, script, _ = api_server_machine(tmp_path, 0, healthy_etcd={0, 1, 2}, peer_ready=False, fail_first=99)
    result = machine.run(script)
    assert result.returncode == 1
    assert result.stderr.strip().endswith(f"corral: FAILED: kubeadm init failed {INIT_ATTEMPTS} times")
    assert [c for c in machine.lines() if c.startswith("kubeadm")].count("kubeadm init") == INIT_ATTEMPTS
    assert [c for c in machine.lines() if c.startswith("kubeadm")].count("kubeadm reset -f") == INIT_ATTEMPTS - 1


def test_first_api_server_gives_up_when_no_etcd_member_gets_healthy(tmp_path, monkeypatch):
    monkeypatch.setattr(api_server, "ETCD_WAIT_ATTEMPTS", 4)
    machine, script, lay = api_server_machine(tmp_path, 0, healthy_etcd=set(), peer_ready=False, fail_first=0)
    result = machine.run(script)
    assert result.returncode == 1
    assert "corral: FAILED: no etcd member healthy after 4 checks 10s apart" in result.stderr
    health_checks = [c for c in machine.lines() if c.endswith("/health")]
    assert len(health_checks) == 4 * len(lay.etcd_members)  # every member, every round
    assert machine.lines().count(f"sleep {ETCD_WAIT_SECONDS}") == 3
    assert not [c for c in machine.lines() if c.startswith("kubeadm")]


def test_other_api_servers_give_up_without_a_ready_peer(tmp_path, monkeypatch):
    monkeypatch.setattr(api_server, "PEER_WAIT_ATTEMPTS", 3)
    machine, script, _ = api_server_machine(tmp_path, 1, healthy_etcd={0, 1, 2}, peer_ready=False, fail_first=0)
    result = machine.run(script)
    assert result.returncode == 1
    assert "corral: FAILED: no API server ready to join through after 3 checks 15s apart" in result.stderr
    assert not [c for c in machine.lines() if c.startswith("kubeadm")]


def test_other_api_servers_join_with_retries_and_reset(tmp_path):
    machine, script, _ = api_server_machine(tmp_path, 2, healthy_etcd=set(), peer_ready=True, fail_first=1)
    result = machine.run(script)
    assert result.returncode == 0, result.stderr
    kubeadm_calls = [c for c in machine.lines() if c.startswith(("kubeadm", "fetch"))]
    assert kubeadm_calls == ["kubeadm join", "kubeadm reset -f", "fetch", "kubeadm join"]


@pytest.mark.parametrize("fail_first, joins, code", [(2, 3, 0), (99, 4, 1)])
def test_pool_nodes_join_with_bounded_retries(tmp_path, monkeypatch, fail_first, joins, code):
    monkeypatch.setattr(pool_node, "JOIN_ATTEMPTS", 4)
    ibis = example("ibis")
    pool = ibis.cloud_pools[0]
    files = files_of(user_data(render_pool_cloud_init(ibis, layout(ibis), pool, SecretRef("gcp", "", "p"))))
    machine = FakeMachine(tmp_path)
    (machine.kubeadm_dir / "join.yaml").write_text(files[f"{KUBEADM_DIR}/join.yaml"]["content"])
    for secret_file in pool_secret_files(TOKEN, DIGEST):
        (machine.kubeadm_dir / Path(secret_file.path).name).write_text(secret_file.content)
    machine.kubeadm(fail_first)
    result = machine.run(files["/usr/local/sbin/corral-pool-node"]["content"])
    assert result.returncode == code, result.stderr
    kubeadm_calls = [c for c in machine.lines() if c.startswith("kubeadm")]
    assert kubeadm_calls.count("kubeadm join") == joins and kubeadm_calls.count("kubeadm reset -f") == min(fail_first, joins - 1)
    if code:
        assert result.stderr.strip().endswith("corral: FAILED: kubeadm join failed 4 times")
    assert machine.lines().count(f"sleep {JOIN_RETRY_SECONDS}") == joins - 1


# --- cloud-init: one runcmd script that stops at the first failure ----------------------


def test_a_failing_boot_step_stops_the_rest_and_fails_cloud_init(tmp_path):
    """runcmd as cloud-init runs it (one /bin/sh script of the items): a failed
    secret fetch stops the boot before the data disk or etcd are touched."""
    ibis = example("ibis")
    lay = layout(ibis)
    document = user_data(render_etcd_cloud_init(ibis, lay.etcd_members[0], lay.etcd_members, SecretRef("gcp", "", "x")))
    machine = FakeMachine(tmp_path)
    machine.fake("sbin/corral-fetch-secrets", f"echo fetch >> {machine.calls}; exit 1")
    for name in ("corral-etcd-data-disk", "corral-install-etcd"):
        machine.fake(f"sbin/{name}", f"echo {name} >> {machine.calls}")
    runcmd = "#!/bin/sh\n" + "\n".join(document["runcmd"]) + "\n"  # cloud-init's shellify of string items
    result = subprocess.run(["sh", "-c", runcmd.replace("/usr/local/sbin/", f"{machine.sbin}/")], capture_output=True, text=True)
    assert result.returncode != 0
    assert machine.lines() == ["fetch"]


# --- etcd: no blocking on quorum, keys etcd's own, the data disk --------------------------


def etcd_files(name: str = "ibis") -> tuple[dict, dict[str, dict]]:
    cluster = example(name)
    lay = layout(cluster)
    document = user_data(render_etcd_cloud_init(cluster, lay.etcd_members[0], lay.etcd_members, SecretRef("gcp", "", "x")))
    return document, files_of(document)


def test_etcd_starts_without_blocking_the_boot_on_quorum():
    _, files = etcd_files()
    install = files["/usr/local/sbin/corral-install-etcd"]["content"]
    assert "systemctl enable etcd\n" in install and "systemctl start --no-block etcd\n" in install
    assert "--now" not in install
    unit = files["/etc/systemd/system/etcd.service"]["content"]
    assert "Type=notify" in unit and "TimeoutStartSec=infinity" in unit


def test_etcd_keys_belong_to_etcd_from_their_first_write():
    document, files = etcd_files()
    # bootcmd runs before write_files and before runcmd's fetch: the user and its key directory first.
    boot = document["bootcmd"]
    assert boot[0].startswith("id etcd >/dev/null 2>&1 || useradd --system")
    assert boot[1] == f"install -d -o etcd -g etcd -m 0700 {ETCD_PKI_DIR}"
    keys = unbundle(bundle(etcd_secret_files(EtcdMemberTls(*["pem\n"] * 5))))
    assert {f.owner for f in keys.values()} == {"etcd"}
    assert {path: f.mode for path, f in keys.items() if path.endswith(".key")} == {
        f"{ETCD_PKI_DIR}/server.key": "0600", f"{ETCD_PKI_DIR}/peer.key": "0600"}
    fetch = files[FETCH_SCRIPT]["content"]
    assert "tar -xzp --same-owner" in fetch and "--no-same-owner" not in fetch
    # Nothing in the user data is etcd's to read but its (public) configuration.
    assert all(f["owner"] == "root:root" for f in document["write_files"])


def test_other_roles_files_stay_roots(tmp_path):
    tls = ControlPlaneTls(*["pem\n"] * 9)
    ibis = example("ibis")
    files = api_server_secret_files(ibis, layout(ibis), tls, TOKEN, TOKEN, DIGEST, "A" * 44)
    assert {f.owner for f in unbundle(bundle(files)).values()} == {"root"}
    assert "bootcmd" not in user_data(render_pool_cloud_init(ibis, layout(ibis), ibis.cloud_pools[0], SecretRef("gcp", "", "p")))


def test_the_data_disk_cannot_stop_the_boot_nor_let_etcd_start_on_the_root_disk():
    _, files = etcd_files()
    disk = files["/usr/local/sbin/corral-etcd-data-disk"]["content"]
    assert (f"/var/lib/etcd ext4 defaults,noatime,nofail,x-systemd.device-timeout={DATA_DISK_DEVICE_TIMEOUT} 0 2"
            in disk)
    unit = files["/etc/systemd/system/etcd.service"]["content"]
    assert "RequiresMountsFor=/var/lib/etcd" in unit and "ExecStartPre=/usr/bin/mountpoint /var/lib/etcd" in unit


def test_a_data_disk_that_never_appears_fails_the_boot_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.setattr(data_disk, "DATA_DISK_WAIT_ATTEMPTS", 3)
    _, files = etcd_files()
    disk = files["/usr/local/sbin/corral-etcd-data-disk"]["content"]
    missing = tmp_path / "no-such-disk"
    machine = FakeMachine(tmp_path)
    for tool in ("mkfs.ext4", "mount", "blkid"):
        machine.fake(f"bin/{tool}", f'echo "{tool} $*" >> {machine.calls}')
    text = disk.replace("/dev/disk/by-id/google-etcd-data", str(missing)).replace("/etc/fstab", str(tmp_path / "fstab"))
    result = machine.run(text)
    assert result.returncode == 1
    assert f"corral: FAILED: etcd data disk {missing} did not appear within 15s" in result.stderr
    assert machine.lines() == ["sleep 5"] * 3
    assert not (tmp_path / "fstab").exists()


def test_apt_waits_for_the_dpkg_lock_and_the_download_dir_goes():
    _, files = etcd_files()
    install = files["/usr/local/sbin/corral-install-etcd"]["content"]
    assert 'DOWNLOAD=$(mktemp -d)\ntrap \'rm -rf "$DOWNLOAD"\' EXIT\ncd "$DOWNLOAD"\n' in install
    ibis = example("ibis")
    pool = files_of(user_data(render_pool_cloud_init(ibis, layout(ibis), ibis.cloud_pools[0], SecretRef("gcp", "", "p"))))
    prep = pool["/usr/local/sbin/corral-node-prep"]["content"]
    for script in (install, prep):
        assert f"apt-get -o DPkg::Lock::Timeout={APT_LOCK_TIMEOUT_SECONDS} \"$@\"" in script
        assert not [line for line in script.splitlines() if line.lstrip().startswith("apt-get ")]


def test_apt_retries_a_held_lock_a_bounded_number_of_times(tmp_path):
    _, files = etcd_files()
    install = files["/usr/local/sbin/corral-install-etcd"]["content"]
    helper = install[install.index("apt_get() {"):install.index("\n}\n") + 3]
    machine = FakeMachine(tmp_path)
    machine.fake("bin/apt-get", f'echo "apt-get $*" >> {machine.calls}; exit 100')
    result = machine.run(f"set -euo pipefail\n{helper}\napt_get update -q")
    assert result.returncode == 1
    attempts = [c for c in machine.lines() if c.startswith("apt-get")]
    assert attempts == [f"apt-get -o DPkg::Lock::Timeout={APT_LOCK_TIMEOUT_SECONDS} update -q"] * APT_ATTEMPTS
    assert f"corral: FAILED: apt-get update -q did not succeed after {APT_ATTEMPTS} attempts" in result.stderr


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed (scripts/install --test adds it)")
def test_shellcheck_is_clean_on_every_rendered_boot_script(tmp_path):
    scripts = []
    for name in ("jaguar", "heron", "ibis"):
        cluster = example(name)
        lay = layout(cluster)
        ref = SecretRef(cluster.control_plane.cloud, "store", f"{name}-role")
        for document in (
            render_etcd_cloud_init(cluster, lay.etcd_members[0], lay.etcd_members, ref),
            render_api_server_cloud_init(cluster, lay, 0, ref),
            render_api_server_cloud_init(cluster, lay, 1, ref),
            render_pool_cloud_init(cluster, lay, cluster.cloud_pools[0], ref),
        ):
            for path, file in files_of(user_data(document)).items():
                if file["content"].startswith("#!/bin/bash"):
                    script = tmp_path / f"{len(scripts)}-{Path(path).name}.sh"
                    script.write_text(file["content"])
                    scripts.append(str(script))
    result = subprocess.run(["shellcheck", "--severity=info", *scripts], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout
