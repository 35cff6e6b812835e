"""corral's etcd user data under REAL cloud-init on three throwaway hosts.

Each host is a Debian bookworm systemd-nspawn machine (tests/hostlab) at the
address corral's layout gives an etcd member of the example cluster ibis (GCP,
10.202.0.10 / 10.202.1.10 / 10.202.2.10 on a 10.202.0.0/22 lab bridge), with:
- cloud-init (Debian's package) and a NoCloud seed holding the user data
  `render_etcd_cloud_init` renders, unedited;
- a 512 MiB file-backed loop device as the data disk, at the path the GCP
  disk locator waits for (/dev/disk/by-id/google-etcd-data), given by a
  udev stand-in (nspawn has no udev; see fakes.py);
- the GCP metadata server, Secret Manager and the etcd release download
  faked at the network boundary (fakes.py): github.com,
  secretmanager.googleapis.com and metadata.google.internal resolve to the
  lab gateway, whose HTTPS certificate a throwaway CA in the hosts signs.
  The secret store holds each member's bundle as `machine_secrets` stores
  it (`bundle(etcd_secret_files(...))`), readable by that member only.

The members boot minutes apart; the test then checks TLS, quorum, a stopped
member, reboots (cloud-init per-instance: nothing changes), and a reboot
with the data disk gone.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import yaml

from corral.infra import bootstrap
from corral.machine.cloud_init import render_etcd_cloud_init
from corral.machine.data_disk import GCP_ETCD_DEVICE_NAME
from corral.machine.etcd_member import ETCD_CONFIG, ETCD_DATA_DIR, ETCD_PKI_DIR, ETCD_VERSION, EtcdMemberTls, etcd_secret_files
from corral.machine.files import bundle
from corral.machine.secret_fetch import FETCH_SCRIPT, SecretRef
from corral.model import load_cluster
from corral.model.layout import layout
from tests.gobuild import GoBuildUnavailable
from tests.hostlab.lab import Host, Lab, LabConfig, available

from .fakes import (
    FAKE_FSTAB_GENERATOR,
    FAKE_FSTAB_GENERATOR_TEXT,
    FAKE_UDEV_CONFIG,
    FAKE_UDEV_SCRIPT,
    FAKE_UDEV_SCRIPT_TEXT,
    FAKE_UDEV_UNIT,
    FAKE_UDEV_UNIT_TEXT,
    METADATA_HOST,
    RELEASE_HOST,
    SECRET_MANAGER_HOST,
    FakeGcp,
    FakeGcpServers,
    LabCa,
    release_files,
)

pytestmark = pytest.mark.hostlab

CLUSTER_FILE = Path(__file__).resolve().parents[2] / "clusters" / "ibis.yaml"
BRIDGE, SUBNET = "corralbr-boot", "10.202.0.0/22"
DISK_LINK = f"/dev/disk/by-id/google-{GCP_ETCD_DEVICE_NAME}"
DISK_SIZE = "512M"
# Member 0 boots alone; member 1 when member 0's etcd has waited for a quorum
# longer than the host's default start timeout (systemd's DefaultTimeoutStartSec:
# 90 s on a cloud image; the lab's hosts set it to START_TIMEOUT_S, so the test
# waits seconds, not minutes, for the same proof); member 2 after it.
START_TIMEOUT_S = 30
BOOT_OFFSETS = (0, START_TIMEOUT_S + 10, START_TIMEOUT_S + 25)
CLIENT_DIR = "/root/lab-etcd-client"  # the checks' own client certificate, not corral's
# corral's files on a member (user data and secret); a second boot must leave them as they are.
CORRAL_FILES = (
    ETCD_CONFIG, "/etc/systemd/system/etcd.service", "/etc/fstab",
    "/usr/local/sbin/corral-etcd-data-disk", "/usr/local/sbin/corral-install-etcd", FETCH_SCRIPT,
    *(f"{ETCD_PKI_DIR}/{name}" for name in ("ca.crt", "server.crt", "server.key", "peer.crt", "peer.key")),
    "/usr/local/bin/etcd", "/usr/local/bin/etcdctl",
)


def log(message: str) -> None:
    print(f"[bootstrap-lab {time.strftime('%H:%M:%S')}] {message}", flush=True)


class Member:
    """An etcd member of the layout: its host (once booted), data disk and first-boot seed."""

    def __init__(self, name: str, ip: str, loop: str, prepare):
        self.name, self.ip, self.loop = name, ip, loop
        self.prepare = prepare  # writes the seed into the host's disk before its first boot
        self.host: Host | None = None
        self.booted_at = 0.0
        self.cloud_init_seconds = 0.0

    def sh(self, command: str, check: bool = True, timeout: float = 120) -> str:
        return self.host.run(command, check=check, timeout=timeout).stdout.strip()

    def etcdctl(self, args: str, endpoints: list[str], check: bool = True) -> subprocess.CompletedProcess:
        client = (f"--cacert {CLIENT_DIR}/ca.crt --cert {CLIENT_DIR}/client.crt --key {CLIENT_DIR}/client.key "
                  f"--endpoints {','.join(endpoints)} --dial-timeout 5s --command-timeout 10s")
        return self.host.run(f"ETCDCTL_API=3 /usr/local/bin/etcdctl {client} {args}", check=check, timeout=60)

    def file_digests(self) -> dict[str, str]:
        """corral's files: path -> 'sha256 owner:group mode'."""
        paths = " ".join(CORRAL_FILES)
        sums = dict(line.split("  ", 1)[::-1] for line in self.sh(f"sha256sum {paths}").splitlines())
        modes = dict(line.split(" ", 1) for line in self.sh(f"stat -c '%n %U:%G %a' {paths}").splitlines())
        return {path: f"{sums[path]} {modes[path]}" for path in CORRAL_FILES}


def wait_for_ssh(member: Member, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not member.host.reachable(timeout=0.5):
        if time.monotonic() > deadline:
            raise AssertionError(f"{member.name}: no sshd {timeout:.0f}s after boot")
        time.sleep(0.2)


def wait_cloud_init(member: Member, timeout: float = 240) -> subprocess.CompletedProcess:
    """`cloud-init status --wait --long` on the member (exit 0: done without error)."""
    wait_for_ssh(member)
    deadline = time.monotonic() + timeout
    while True:  # sshd may come up before cloud-init's first stage has run
        result = member.host.run("cloud-init status --wait --long", check=False, timeout=timeout)
        if "status: not run" not in result.stdout or time.monotonic() > deadline:
            return result
        time.sleep(1)


def boot(lab: Lab, member: Member) -> None:
    """Power the member on without waiting: its etcd keeps systemd "starting" until a quorum forms."""
    member.booted_at = time.monotonic()
    if member.host is None:
        member.host, = lab.boot([member.name], ips=[member.ip], wait=False, prepare=lambda host: member.prepare(host.root))
    else:
        member.host.start(wait=False)


def seed(root: Path, member_name: str, user_data: str, ca_pem: str, gateway: str, client_pems: dict[str, str], loop: str) -> None:
    """A cloud image's view of its first boot: NoCloud seed, image settings, trusted CA, names, the disk."""
    def write(path: str, text: str, mode: int = 0o644) -> None:
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        target.chmod(mode)

    seed_dir = "/var/lib/cloud/seed/nocloud"
    write(f"{seed_dir}/user-data", user_data, 0o600)
    write(f"{seed_dir}/meta-data", f"instance-id: {member_name}-{uuid.uuid4().hex[:8]}\nlocal-hostname: {member_name}\n")
    # Image settings, not user data: the datasource, no network rendering (the
    # lab configures host0), a locale the minimal image has, and the lab's own
    # ssh access left alone.
    write("/etc/cloud/cloud.cfg.d/90-bootstrap-lab.cfg", yaml.safe_dump({
        "datasource_list": ["NoCloud"], "network": {"config": "disabled"}, "locale": "C.UTF-8",
        "disable_root": False, "ssh_deletekeys": False, "apt": {"preserve_sources_list": True},
    }))
    # The image's default start timeout, shorter than a cloud image's 90 s (see BOOT_OFFSETS).
    write("/etc/systemd/system.conf.d/90-bootstrap-lab.conf", f"[Manager]\nDefaultTimeoutStartSec={START_TIMEOUT_S}s\n")
    (root / "etc/cloud/cloud-init.disabled").unlink(missing_ok=True)
    write("/usr/local/share/ca-certificates/corral-bootstrap-lab.crt", ca_pem)
    subprocess.run(["chroot", str(root), "update-ca-certificates"], check=True, capture_output=True, timeout=120)
    with open(root / "etc/hosts", "a") as hosts:
        hosts.write(f"{gateway}\t{RELEASE_HOST} {SECRET_MANAGER_HOST} {METADATA_HOST}\n")
    write(FAKE_UDEV_SCRIPT, FAKE_UDEV_SCRIPT_TEXT, 0o755)
    write(f"/etc/systemd/system/{FAKE_UDEV_UNIT}", FAKE_UDEV_UNIT_TEXT)
    wants = root / "etc/systemd/system/sysinit.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    (wants / FAKE_UDEV_UNIT).unlink(missing_ok=True)
    (wants / FAKE_UDEV_UNIT).symlink_to(f"/etc/systemd/system/{FAKE_UDEV_UNIT}")
    write(FAKE_UDEV_CONFIG, f"{loop.removeprefix('/dev/loop')} {DISK_LINK}\n")
    write(FAKE_FSTAB_GENERATOR, FAKE_FSTAB_GENERATOR_TEXT, 0o755)
    for name, pem in client_pems.items():
        write(f"{CLIENT_DIR}/{name}", pem, 0o600)


@pytest.fixture(scope="module")
def bootstrap_lab(tmp_path_factory):
    ok, reason = available()
    if not ok:
        pytest.skip(f"hostlab unavailable: {reason}")
    cluster = load_cluster(CLUSTER_FILE)
    lay = layout(cluster)
    lab = Lab(LabConfig(bridge=BRIDGE, subnet=SUBNET, machine_prefix="b"))
    lab.start()
    work = tmp_path_factory.mktemp("bootstrap-lab")
    loops: list[str] = []
    servers = None
    try:
        release = f"/etcd-io/etcd/releases/download/v{ETCD_VERSION}"
        try:
            files = release_files(ETCD_VERSION)
        except GoBuildUnavailable as why:
            pytest.skip(f"the real etcd {ETCD_VERSION} cannot be built here: {why}")
        state = FakeGcp(release, files)
        https_ca, etcd_ca = LabCa("corral bootstrap lab HTTPS CA"), LabCa("etcd-ca")
        servers = FakeGcpServers(state, lab.gateway, https_ca)
        client = etcd_ca.issue("bootstrap-lab-client", server=False)
        client_pems = {"ca.crt": etcd_ca.cert, "client.crt": client.cert, "client.key": client.key}
        members = []
        for machine in lay.etcd_members:
            # As machine_secrets stores it: the member's bundle under its own name (GCP: <cluster>-<key>).
            ref = SecretRef("gcp", "", f"{cluster.name}-{bootstrap.etcd_secret_key(machine.name)}")
            server = etcd_ca.issue(machine.name, [machine.name, "localhost"], [machine.ip, "127.0.0.1"])
            peer = etcd_ca.issue(machine.name, [machine.name], [machine.ip])
            tls = EtcdMemberTls(etcd_ca.cert, server.cert, server.key, peer.cert, peer.key)
            state.secrets[ref.name] = bundle(etcd_secret_files(tls))
            state.grants[machine.ip] = ref.name
            user_data = render_etcd_cloud_init(cluster, machine, lay.etcd_members, ref)
            image = work / f"{machine.name}.img"
            subprocess.run(["truncate", "-s", DISK_SIZE, str(image)], check=True)
            loop = subprocess.run(["losetup", "--find", "--show", str(image)], check=True, capture_output=True,
                                  text=True).stdout.strip()
            loops.append(loop)
            members.append(Member(machine.name, machine.ip, loop, lambda root, name=machine.name, data=user_data, loop=loop:
                                  seed(root, name, data, https_ca.cert, lab.gateway, client_pems, loop)))
        yield lab, state, members
    finally:
        if servers is not None:
            servers.close()
        lab.teardown()
        for loop in loops:
            subprocess.run(["losetup", "-d", loop], check=False)


def endpoints(members: list[Member]) -> list[str]:
    return [f"https://{m.ip}:2379" for m in members]


def healthy(member: Member, targets: list[Member]) -> list[str]:
    result = member.etcdctl("endpoint health -w json", endpoints(targets), check=False)
    try:
        return sorted(e["endpoint"] for e in yaml.safe_load(result.stdout or "[]") if e.get("health"))
    except (yaml.YAMLError, TypeError, AttributeError):
        return []


def wait_healthy(member: Member, targets: list[Member], timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while healthy(member, targets) != sorted(endpoints(targets)):
        if time.monotonic() > deadline:
            up = healthy(member, targets)
            journals = {t.name: t.sh("journalctl -u etcd --no-pager -n 25", check=False)
                        for t in targets if endpoints([t])[0] not in up}
            raise AssertionError(f"etcd endpoints not healthy after {timeout:.0f}s: {up} of {endpoints(targets)}; "
                                 f"journals of the others: {journals}")
        time.sleep(2)


def test_etcd_members_boot_under_cloud_init_and_form_a_tls_cluster(bootstrap_lab):
    lab, state, members = bootstrap_lab
    started = time.monotonic()
    figures: list[str] = []
    # --- staggered first boots: each member's cloud-init finishes without a quorum ---
    for member, offset in zip(members, BOOT_OFFSETS):
        time.sleep(max(0.0, started + offset - time.monotonic()))
        if member is members[1]:
            # Alone past the host's default start timeout: still starting, never killed and restarted.
            etcd_state = members[0].sh("systemctl show etcd -p ActiveState -p NRestarts")
            assert sorted(etcd_state.split()) == ["ActiveState=activating", "NRestarts=0"], etcd_state
        boot(lab, member)
        result = wait_cloud_init(member)
        member.cloud_init_seconds = time.monotonic() - member.booted_at
        assert result.returncode == 0 and "status: done" in result.stdout, (member.name, result.stdout, result.stderr)
        output = member.sh("cat /var/log/cloud-init-output.log")
        assert "corral: FAILED" not in output and "corral: etcd enabled and starting" in output, output[-3000:]
        figures.append(f"{member.name} booted at +{member.booted_at - started:.0f}s, cloud-init done in {member.cloud_init_seconds:.0f}s")
        log(figures[-1])
        if member is members[0]:
            # Alone, it cannot have a quorum: etcd is still starting, and cloud-init said done anyway.
            assert member.sh("systemctl is-active etcd", check=False) == "activating"
    wait_healthy(members[0], members)
    log(f"3 members healthy at +{time.monotonic() - started:.0f}s")

    # --- TLS everywhere: client certificates required, peers over https ---
    listed = yaml.safe_load(members[0].etcdctl("member list -w json", endpoints(members)).stdout)["members"]
    assert sorted(m["name"] for m in listed) == sorted(m.name for m in members)
    assert all(url.startswith("https://") for m in listed for url in m["peerURLs"] + m["clientURLs"])
    no_client_cert = members[0].host.run(f"curl -sS --max-time 5 --cacert {CLIENT_DIR}/ca.crt https://{members[1].ip}:2379/health",
                                         check=False)
    assert no_client_cert.returncode != 0  # client-cert-auth: the handshake fails without one
    assert members[0].host.run(f"curl -sS --max-time 5 http://{members[1].ip}:2379/health", check=False).returncode != 0

    # --- what the boot left on each member ---
    for member in members:
        keys = member.sh(f"stat -c '%U:%G %a %n' {ETCD_PKI_DIR}/server.key {ETCD_PKI_DIR}/peer.key "
                         f"{ETCD_PKI_DIR}")
        assert keys.splitlines() == [f"etcd:etcd 600 {ETCD_PKI_DIR}/server.key",
                                     f"etcd:etcd 600 {ETCD_PKI_DIR}/peer.key",
                                     f"etcd:etcd 700 {ETCD_PKI_DIR}"], keys
        mount = member.sh(f"findmnt -n -o SOURCE,FSTYPE {ETCD_DATA_DIR}")
        assert mount.split() == [member.loop, "ext4"], mount
        fstab = [line for line in member.sh("cat /etc/fstab").splitlines() if ETCD_DATA_DIR in line]
        assert len(fstab) == 1 and "nofail" in fstab[0] and "x-systemd.device-timeout=" in fstab[0], fstab
        assert member.sh(f"ls {ETCD_DATA_DIR}").split() == ["lost+found", "member"]  # on the data disk's filesystem
        # The download directory went with the script (trap), so did no etcd tarball stay anywhere in /tmp.
        assert member.sh("find /tmp /var/tmp -name 'etcd-v*' -o -name SHA256SUMS") == ""
        assert state.reads_by(member.ip) == 1
    assert state.problems == [], state.problems
    assert members[0].etcdctl("put /lab/first written-with-3-members", endpoints(members)).stdout.strip() == "OK"

    # --- a stopped member: the other two keep serving writes; back, it catches up; its second boot changes nothing ---
    stopped = members[2]

    def while_stopped() -> None:
        assert members[0].etcdctl("put /lab/while-2-was-down yes", endpoints(members[:2])).stdout.strip() == "OK"
        wait_healthy(members[0], members[:2])

    restart(lab, state, members, stopped, while_stopped)
    log(f"{stopped.name} back after a stop in {time.monotonic() - stopped.booted_at:.0f}s")
    local = stopped.etcdctl("get /lab/while-2-was-down --print-value-only --consistency=s", endpoints([stopped]))
    assert local.stdout.strip() == "yes"

    # --- the data disk missing at a reboot: the VM boots (sshd), etcd does not start on the root disk ---
    gone = members[1]
    gone.sh(f"true > {FAKE_UDEV_CONFIG}")  # the cloud "detached" the disk: no device, no links
    gone.host.stop()
    boot(lab, gone)
    wait_for_ssh(gone)
    # The boot finishes (no job left waiting), degraded by the data disk's mount alone.
    assert gone.sh("systemctl is-system-running --wait", check=False, timeout=150) == "degraded"
    assert gone.sh("systemctl --failed --no-legend --plain | cut -d' ' -f1") == "var-lib-etcd.mount"
    assert gone.sh("systemctl is-active ssh", check=False) == "active"
    assert gone.sh("systemctl is-active etcd", check=False) != "active"
    assert gone.host.run(f"mountpoint -q {ETCD_DATA_DIR}", check=False).returncode != 0
    assert gone.sh(f"ls -A {ETCD_DATA_DIR}") == ""  # nothing written on the root disk
    assert gone.host.run("pgrep -x etcd", check=False).returncode != 0
    wait_healthy(members[0], [members[0], members[2]])  # the other two keep the quorum
    log(f"{gone.name} up without its data disk, etcd stopped ({gone.sh('systemctl is-active etcd', check=False)})")

    # --- the disk back, a reboot: the member rejoins with its data ---
    gone.sh(f"echo {shlex.quote(gone.loop.removeprefix('/dev/loop') + ' ' + DISK_LINK)} > {FAKE_UDEV_CONFIG}")
    restart(lab, state, members, gone)
    log(f"{gone.name} rebooted with its disk, healthy in {time.monotonic() - gone.booted_at:.0f}s")
    local = gone.etcdctl("get /lab/first --print-value-only --consistency=s", endpoints([gone]))
    assert local.stdout.strip() == "written-with-3-members"
    assert state.problems == [], state.problems
    log("figures: " + "; ".join(figures) + f"; whole lab {time.monotonic() - started:.0f}s")


def restart(lab: Lab, state: FakeGcp, members: list[Member], member: Member, while_down=lambda: None) -> None:
    """Power `member` off (then `while_down()`) and on again: it rejoins, and its
    second boot changes nothing."""
    before = member.file_digests()
    member.host.stop()
    while_down()
    boot(lab, member)
    wait_for_ssh(member)
    wait_healthy(members[0], members)
    assert_second_boot_changed_nothing(member, before, state)


def assert_second_boot_changed_nothing(member: Member, before: dict[str, str], state: FakeGcp) -> None:
    """cloud-init ran once per instance: no second fetch, no second run, the files as they were."""
    result = wait_cloud_init(member, timeout=60)
    assert result.returncode == 0 and "status: done" in result.stdout, result.stdout
    assert member.file_digests() == before
    assert state.reads_by(member.ip) == 1  # the secret was not fetched again
    output = member.sh("cat /var/log/cloud-init-output.log")
    assert output.count("corral: etcd enabled and starting") == 1
    assert member.sh("systemctl is-active etcd") == "active"


def test_the_lab_sees_a_boot_loop_when_the_fstab_line_lacks_nofail(bootstrap_lab):
    """Control: corral's fstab line for the data disk without `nofail`, disk missing:
    the host never gets to sshd (emergency mode). So the lab can tell, and the
    member that booted without its disk above did so thanks to `nofail`."""
    lab, _, _ = bootstrap_lab
    cluster = load_cluster(CLUSTER_FILE)
    lay = layout(cluster)
    document = yaml.safe_load(render_etcd_cloud_init(cluster, lay.etcd_members[0], lay.etcd_members, SecretRef("gcp", "", "x")))
    disk_script = next(f["content"] for f in document["write_files"] if f["path"] == "/usr/local/sbin/corral-etcd-data-disk")
    options = re.search(r'echo "UUID=\$UUID \S+ ext4 (\S+) 0 2"', disk_script).group(1)
    assert "nofail" in options.split(",")
    without = ",".join(o for o in options.split(",") if o != "nofail")
    uuid_of_disk = uuid.uuid4()  # a filesystem no disk attached to the host holds

    def prepare(host: Host) -> None:
        root = host.root
        for path, text, mode in ((FAKE_FSTAB_GENERATOR, FAKE_FSTAB_GENERATOR_TEXT, 0o755),
                                 ("/etc/fstab", f"UUID={uuid_of_disk} {ETCD_DATA_DIR} ext4 {without} 0 2\n", 0o644)):
            target = root / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            target.chmod(mode)

    host, = lab.boot(["fstab-control"], ips=["10.202.3.10"], wait=False, prepare=prepare)
    deadline = time.monotonic() + 20  # a host that boots normally has sshd up in ~2-5 s
    while time.monotonic() < deadline:
        assert not host.reachable(timeout=0.5), "booted to sshd with a missing disk and no nofail"
        time.sleep(0.5)
    host.stop(timeout=5)
