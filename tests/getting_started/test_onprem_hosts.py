"""The on-prem guide's `corral join`, run for real on throwaway hosts that are the guide's own.

The unit tier (test_guides.py) runs every other command of the guides on
fakes and leaves this one to here (ON_HOSTS there). This test runs the AWS
guide and then the on-prem guide, in one reader's shell, up to and including
its `corral join` line, against four systemd-nspawn Debian 12 hosts
(tests/hostlab, marker hostlab) named gpu-001..004.dc1.internal at the
guide's addresses 10.60.1.11..14 (a lab of its own on 10.60.1.0/24, inside
the site's 10.60.0.0/16), with the guide's ssh user `corral` (passwordless
sudo) and key `~/.ssh/corral_dc1`. `corral hosts trust` and `corral doctor`
reach them with the real ssh-keyscan and ssh. What a real site provides
comes from the same places the guide says: the package mirror the guide's
site-dc1.yaml names (mirror.dc1.internal, which the hosts resolve as a
site's DNS would) serves the lab's signed apt repository of TEST FAKE
NVIDIA/Kubernetes packages, whose key each host carries where the guide's
file says, as the site's provisioning would put it; the cluster's API endpoint, CA hash and the
kubectl that takes the run's bootstrap token are the guide test's fakes.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import subprocess
import threading
from pathlib import Path

import pytest

from corral.model import load_fleet
from corral.nodes.known_hosts import read as read_known_hosts

from .test_guides import DC1_ADDRESSES, FAKE_BIN, GUIDES, Reader

pytestmark = pytest.mark.hostlab

# The command the unit tier leaves to this test (test_guides.ON_HOSTS).
GUIDE_COMMAND = "corral join kite --pool gpu-h100-dc1 -e site-dc1.yaml"
DC1_HOSTS = [f"gpu-{n:03d}.dc1.internal" for n in range(1, 5)]   # onprem.md's gpu-[001:004].dc1.internal
POOL = "gpu-h100-dc1"
MIRROR = "mirror.dc1.internal"            # site-dc1.yaml's mirror
MIRROR_KEY = "/etc/apt/keyrings/dc1-mirror.asc"   # site-dc1.yaml's key, put there by the site's provisioning
# The driver the guide's `corral nodepool add ... --gpu-driver` names (read from the guide).
GUIDE_DRIVER = re.search(r"--gpu-driver (\S+)", (GUIDES / "onprem.md").read_text()).group(1)
# A lab of its own, so it runs beside the session lab (tests/hostlab/fixtures.py, own_lab).
LAB_BRIDGE, LAB_SUBNET, LAB_PREFIX = "crlgsdc1", "10.60.1.0/24", "gs-"
SITE_USER = "corral"


class QuietFiles(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:   # apt's requests are not the test's output
        pass


class SiteMirror:
    """TEST FAKE of dc1's package mirror at the network boundary: the lab's signed repository
    of fake packages (the vendors' layouts), served on the lab bridge at port 80."""

    def __init__(self, repo, folder: Path, bind: str) -> None:
        folder.mkdir()
        for entry in repo.root.iterdir():
            (folder / entry.name).symlink_to(entry)
        handler = functools.partial(QuietFiles, directory=str(folder))
        self.server = http.server.ThreadingHTTPServer((bind, 80), handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def site_host(lab_gateway: str, mirror_key: str):
    """What dc1's hosts are before a join: the site's DNS name for its mirror, and the
    mirror's signing key from the site's provisioning."""
    def prepare(host) -> None:
        with host.path("/etc/hosts").open("a") as hosts:
            hosts.write(f"{lab_gateway}\t{MIRROR}\n")
        key = host.path(MIRROR_KEY)
        key.parent.mkdir(parents=True, exist_ok=True)
        key.write_text(mirror_key)
    return prepare


def add_site_user(host, public_key: str) -> None:
    """The guide's login: user `corral`, passwordless sudo, the reader's key."""
    host.run(f"useradd --create-home --shell /bin/bash {SITE_USER} && "
             f"install -d -m 700 -o {SITE_USER} -g {SITE_USER} /home/{SITE_USER}/.ssh && "
             f"echo '{public_key}' > /home/{SITE_USER}/.ssh/authorized_keys && "
             f"chown {SITE_USER}: /home/{SITE_USER}/.ssh/authorized_keys && "
             f"echo '{SITE_USER} ALL=(ALL) NOPASSWD:ALL' > /etc/sudoers.d/{SITE_USER} && "
             f"chmod 440 /etc/sudoers.d/{SITE_USER}")


def real_ssh_path(reader: Reader) -> str:
    """The reader's PATH with the guide test's fakes except ssh and ssh-keyscan: the real ones reach the hosts."""
    folder = reader.tmp / "fake-bin-but-ssh"
    folder.mkdir()
    for fake in FAKE_BIN.iterdir():
        if fake.name not in ("ssh", "ssh-keyscan"):
            (folder / fake.name).symlink_to(fake)
    return os.pathsep.join([str(folder), "/usr/local/bin", "/usr/bin", "/bin"])


@pytest.fixture(scope="module")
def dc1(tmp_path_factory):
    from corral.model.versions import NEW_CLUSTER_VERSION
    from tests.hostlab.aptrepo import AptRepo
    from tests.hostlab.fixtures import own_lab

    with own_lab(LAB_BRIDGE, LAB_SUBNET, LAB_PREFIX) as lab:
        tmp = tmp_path_factory.mktemp("dc1")
        # The guide's cluster runs what `corral cluster new` writes (the version catalog's
        # new-cluster version) and its pool the driver the guide's `corral nodepool add` names.
        repo = AptRepo(lab, k8s_versions=(NEW_CLUSTER_VERSION,), driver_versions=(GUIDE_DRIVER,)).build()
        mirror = SiteMirror(repo, tmp / "mirror", lab.gateway)
        hosts = []
        try:
            hosts = lab.boot(DC1_HOSTS, ips=DC1_ADDRESSES, prepare=site_host(lab.gateway, repo.key_armored))
            reader = Reader(tmp)
            ssh_dir = reader.home / ".ssh"
            ssh_dir.mkdir(mode=0o700)
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "alice@corral-guide",
                            "-f", str(ssh_dir / "corral_dc1")], check=True)
            public_key = (ssh_dir / "corral_dc1.pub").read_text().strip()
            for host in hosts:
                add_site_user(host, public_key)
            reader.env["PATH"] = real_ssh_path(reader)
            del reader.env["FAKE_SSH_NETWORK"]
            reader.run(GUIDES / "aws.md", GUIDES / "onprem.md", until=GUIDE_COMMAND, on_hosts=True)
            yield reader, {h.name: h for h in hosts}
        finally:
            mirror.close()
            for host in hosts:
                lab.remove_host(host)


def test_the_guides_join_converges_every_host_of_the_pool(dc1):
    reader, hosts = dc1
    assert reader.outcomes[-1].step.text == GUIDE_COMMAND and reader.outcomes[-1].returncode == 0
    report = reader.output_of(GUIDE_COMMAND)
    assert "4 of 4 hosts ok" in report and "0 up to date (not run)" in report, report
    for name in DC1_HOSTS:
        assert any(name in line and "changed" in line for line in report.splitlines()), report

    cluster = load_fleet([reader.project / "clusters"]).clusters["kite"]
    pool = next(p for p in cluster.node_pools if p.name == POOL)
    labels = cluster.node_labels(pool)
    assert labels["corral.dev/pool"] == POOL and labels["corral.dev/site"] == "dc1"
    outputs = json.loads(Path(f"{reader.env['FAKE_PULUMI_OUTPUTS']}.kite").read_text())
    for name, host in hosts.items():
        assert host.path("/etc/kubernetes/kubelet.conf").exists(), name
        # what kubeadm joined with, as the fake kubeadm recorded it (the JoinConfiguration holds the token and is gone)
        joined = host.path("/var/lib/corral-fakes/kubeadm-join.json").read_text()
        assert outputs["apiEndpoint"] in joined, name
        missing = [f"{key}={value}" for key, value in labels.items() if f"{key}={value}" not in joined]
        assert not missing, (name, missing)
        assert not host.path("/etc/kubernetes/bootstrap-kubelet.conf").exists(), name
        driver = host.run("dpkg-query -W -f '${Version}' nvidia-driver").stdout
        assert driver == f"{GUIDE_DRIVER}-1", name
        # The cluster's containerd (the new-cluster version's default), the real one.
        assert "v2.3.6 " in host.run("containerd --version").stdout + " ", name


def test_trust_recorded_the_keys_the_guides_hosts_really_have(dc1):
    reader, hosts = dc1
    recorded = read_known_hosts(reader.project / "clusters" / "kite.known_hosts")
    assert set(recorded) == set(DC1_HOSTS)
    for name, host in hosts.items():
        assert host.ip == DC1_ADDRESSES[DC1_HOSTS.index(name)]
        real = {tuple(host.path(f"/etc/ssh/ssh_host_{kind}_key.pub").read_text().split()[:2])
                for kind in ("ed25519", "ecdsa")}
        assert recorded[name] == real, name

