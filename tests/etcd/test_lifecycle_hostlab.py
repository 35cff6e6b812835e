"""The etcd lifecycle on throwaway hosts: scheduled snapshots to object storage, restore after
losing two of three members (`corral etcd restore --all`), replacing a member, growing 3 -> 5 and
shrinking 5 -> 3 (`corral etcd add|remove`) while writes continue.

Real etcd 3.4 (Debian), real systemd timers, corral's own etcd.conf/etcd.service and
snapshot templates; the object store is moto's S3 server and the instance
metadata a fake, both on the lab's gateway (tests/etcd/lab.py).
"""

from __future__ import annotations

import base64
import shutil
import threading
import time
from pathlib import Path

import pytest

from corral.etcd import EtcdError, cluster_status, replace_member
from corral.machine.etcd_snapshot import METRICS_FILE, SERVICE, TIMER, SnapshotJob, SnapshotLocation, snapshot_files

from .lab import BRIDGE, SUBNET, EtcdLab, fake_instance_metadata, fake_object_storage, shell

pytestmark = [
    pytest.mark.hostlab,
    pytest.mark.skipif(shutil.which("etcdctl") is None, reason="etcdctl not installed (apt-get install etcd-client)"),
]

BUCKET = "corral-lab-etcd-snapshots"
CLUSTERS = str(Path(__file__).resolve().parents[2] / "clusters")
INTERVAL_SECONDS = 15


@pytest.fixture(scope="module")
def lab():
    from tests.hostlab.fixtures import own_lab

    with own_lab(BRIDGE, SUBNET, machine_prefix="etcd-") as lab:
        yield lab


@pytest.fixture(scope="module")
def storage(lab):
    store = fake_object_storage(lab.gateway)
    store.s3.create_bucket(Bucket=BUCKET)
    yield store
    store.stop()


@pytest.fixture(scope="module")
def imds(lab):
    fake = fake_instance_metadata(lab.gateway)
    yield fake
    fake.stop()


@pytest.fixture(scope="module")
def etcd(lab, tmp_path_factory):
    cluster = EtcdLab(lab, tmp_path_factory.mktemp("etcd-lab"))
    cluster.form(["etcd-0", "etcd-1", "etcd-2"])
    return cluster


def put(ctl, key: str, value: str) -> None:
    ctl._exec(ctl.command("put", key, value, json_output=False), 20)


def keys(ctl, prefix: str) -> set[str]:
    data = ctl._call("get", prefix, "--prefix", "--keys-only", timeout=60)
    return {base64.b64decode(kv["key"]).decode() for kv in data.get("kvs", [])}


class Writer:
    """Writes /w/<n> in a loop; a failed put is retried until acknowledged (as any
    client does). `lost` = acknowledged keys that are not in etcd afterwards."""

    def __init__(self, ctl):
        self.ctl, self.acked, self.failures = ctl, [], 0
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        i = 0
        while not self.stop_event.is_set():
            key = f"/w/{i:06d}"
            try:
                put(self.ctl, key, "x")
                self.acked.append(key)
                i += 1
            except EtcdError:
                self.failures += 1
                time.sleep(0.2)

    def __enter__(self) -> Writer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop_event.set()
        self.thread.join(60)

    def lost(self, ctl) -> set[str]:
        return set(self.acked) - keys(ctl, "/w/")


def install_snapshot_job(etcd: EtcdLab, storage, imds) -> None:
    job = SnapshotJob(
        location=SnapshotLocation("aws", "us-east-1", BUCKET), prefix="etcd",
        interval_minutes=1, quota_backend_gib=2,
        bucket_url=f"{storage.url}/{BUCKET}", metadata_url=imds.url, interval=f"{INTERVAL_SECONDS}s",
    )
    for member in etcd.members.values():
        for f in snapshot_files(job):
            path = member.host.path(f.path)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f.content)
            path.chmod(int(f.mode, 8))
        member.run(f"systemctl daemon-reload && systemctl enable -q --now {TIMER}")


def test_disk_preflight_ran_before_each_member_started(etcd):
    for member in etcd.members.values():
        journal = member.run("journalctl -u etcd --no-pager -o cat").stdout
        line = next(line for line in journal.splitlines() if line.startswith("corral etcd disk preflight:"))
        assert "fdatasync p99" in line and "etcd needs p99 < 10 ms" in line
        # Before etcd: systemd reports the unit started (etcd's READY) after the preflight.
        assert journal.index("corral etcd disk preflight:") < journal.index("Started etcd.service")
        metrics = member.run("cat /var/lib/node_exporter/textfile_collector/corral_etcd_disk.prom").stdout
        assert "corral_etcd_disk_fsync_p99_seconds " in metrics


def test_snapshots_on_a_timer_land_in_the_bucket_from_the_leader_only(etcd, storage, imds, tmp_path):
    ctl = etcd.ctl()
    for i in range(200):
        put(ctl, f"/registry/configmaps/default/cm-{i:03d}", f"before-snapshot-{i}")
    install_snapshot_job(etcd, storage, imds)
    deadline = time.monotonic() + 4 * INTERVAL_SECONDS + 30
    while time.monotonic() < deadline and len(storage.objects(BUCKET, "etcd/")) < 2:
        time.sleep(2)
    objects = storage.objects(BUCKET, "etcd/")
    assert len(objects) >= 2, "the timer did not upload twice"
    # Only the leader uploads: every object came from the same member, and the
    # others' metrics say they ran and were not the leader.
    leader = cluster_status(ctl).leader
    metrics = {name: m.run(f"cat {METRICS_FILE}").stdout for name, m in etcd.members.items()}
    assert 'corral_etcd_snapshot_leader{prefix="etcd"} 1' in metrics[leader.name]
    for name, text in metrics.items():
        if name != leader.name:
            assert 'corral_etcd_snapshot_leader{prefix="etcd"} 0' in text
            assert "corral_etcd_snapshot_last_run_timestamp_seconds" in text
    success = [float(line.split()[-1]) for line in metrics[leader.name].splitlines()
               if line.startswith("corral_etcd_snapshot_last_success_timestamp_seconds")]
    assert success and time.time() - success[0] < 3 * INTERVAL_SECONDS + 30
    # Uploaded with the machine's role credentials from the metadata service.
    assert any(r.startswith("GET /latest/meta-data/iam/security-credentials/") for r in imds.requests)
    # The newest object is a valid snapshot holding the keys.
    newest = max(objects, key=lambda o: o["LastModified"])
    local = tmp_path / "newest.db"
    storage.s3.download_file(BUCKET, newest["Key"], str(local))
    status = ctl.snapshot_status(str(local))
    assert status.total_keys >= 200
    assert newest["Key"].endswith(f"-rev{status.revision}.db")
    head = storage.s3.head_object(Bucket=BUCKET, Key=newest["Key"])
    import hashlib
    assert head["Metadata"]["sha256"] == hashlib.sha256(local.read_bytes()).hexdigest()
    # Stop the timers: later tests change the membership under them.
    for m in etcd.members.values():
        m.run(f"systemctl disable -q --now {TIMER}; systemctl stop {SERVICE}", check=False)


def restore_cli(etcd, snapshot, *extra: str):
    """`corral etcd restore heron SNAPSHOT --all` against the lab's members (their names and addresses)."""
    from typer.testing import CliRunner

    from corral.cli import app

    addresses = [arg for m in etcd.members.values() for arg in ("--member-address", f"{m.name}={m.ip}")]
    return CliRunner().invoke(app, [
        "etcd", "restore", "heron", str(snapshot), "--all", "--clusters", CLUSTERS, *addresses,
        "--ssh", shell("ssh", *etcd.lab.ssh_options()), "--ssh-user", "root", "--timeout", "120", *extra])


def cluster_id(ctl) -> int:
    return int(ctl._call("endpoint", "status", endpoints=ctl.endpoints[:1])[0]["Status"]["header"]["cluster_id"])


def test_restore_after_losing_two_members_and_their_data(etcd, storage, tmp_path):
    ctl = etcd.ctl()
    objects = storage.objects(BUCKET, "etcd/")
    assert objects, "needs the snapshot test's uploads"
    newest = max(objects, key=lambda o: o["LastModified"])
    local = tmp_path / "restore.db"
    storage.s3.download_file(BUCKET, newest["Key"], str(local))
    sha256 = storage.s3.head_object(Bucket=BUCKET, Key=newest["Key"])["Metadata"]["sha256"]
    # A healthy cluster is never wiped without --wipe-healthy: refused, nothing stopped.
    refused = restore_cli(etcd, local, "--sha256", sha256)
    assert refused.exit_code == 1 and "refusing to restore: etcd is healthy" in refused.output, refused.output
    put(ctl, "/after-snapshot", "lost")  # written after the newest snapshot: gone after the restore
    old_cluster = cluster_id(ctl)
    # A wrong hash (a partial download) is refused before anything is touched.
    bad = restore_cli(etcd, local, "--sha256", "0" * 64)
    assert bad.exit_code == 1 and "is not the expected" in bad.output
    survivors = list(etcd.members.values())
    for m in survivors[1:]:
        m.run("systemctl kill -s KILL etcd; systemctl stop etcd; rm -rf /var/lib/etcd/member")
    with pytest.raises(EtcdError):
        put(etcd.ctl(command_timeout=3), "/no-quorum", "x")
    # The survivor still runs (without a quorum); the command stops it, restores every
    # member from the same file with a new cluster token, and starts them all.
    result = restore_cli(etcd, local, "--sha256", sha256)
    assert result.exit_code == 0, result.output
    print(result.output)  # the step times, for docs/etcd.md's figures
    assert "restored: revision" in result.output and "3 members healthy, leader etcd-" in result.output
    assert f"new cluster token heron-etcd-restored-{sha256[:12]}" in result.output
    # Only the survivor had data left: it is kept aside, not deleted.
    assert "etcd-0: its previous data is kept in /var/lib/etcd/corral-restore/previous-" in result.output
    assert "etcd-1: its previous data" not in result.output
    ctl = etcd.ctl()
    restored = keys(ctl, "/registry/configmaps/")
    assert len(restored) == 200
    assert keys(ctl, "/after-snapshot") == set()
    assert cluster_status(ctl).problems() == []
    assert cluster_id(ctl) != old_cluster  # a new cluster, not the old one resurrected
    for m in survivors:
        assert m.run("stat -c %U:%a /var/lib/etcd/member").stdout.split() == ["etcd:700"]
        assert m.run("ls /var/lib/etcd/corral-restore").stdout.split()[-1] == "restored.json"
    # Idempotent: the same command again finds the cluster healthy and restored from
    # this snapshot, and changes nothing (a write made since survives).
    put(ctl, "/after-restore", "kept")
    again = restore_cli(etcd, local, "--sha256", sha256)
    assert again.exit_code == 0 and "already restored from this snapshot" in again.output, again.output
    assert keys(etcd.ctl(), "/after-restore") == {"/after-restore"}
    assert cluster_status(etcd.ctl()).problems() == []


def test_replace_member_while_writing_loses_no_write(etcd):
    ctl = etcd.ctl()
    (new,) = etcd.provision(["etcd-1-new"])
    new.name = "etcd-1"
    old = etcd.members["etcd-1"]

    def start_new(name: str, initial_cluster: str) -> None:
        # The old machine is gone (its disk with it); the new one joins the running cluster.
        old.run("systemctl stop etcd", check=False)
        etcd.lab.remove_host(old.host)
        # Rendered as the cloud renders it (first-boot `new`, the layout's members):
        # the drop-in's join-state check finds the cluster and switches to `existing`.
        others = [m for n, m in etcd.members.items() if n != "etcd-1"]
        etcd.configure(new, [*others, new])
        etcd.members["etcd-1"] = new
        new.run("systemctl start --no-block etcd")

    with Writer(etcd.ctl()) as writer:
        time.sleep(2)
        change = replace_member(ctl, "etcd-1", new.peer_url, start_new, timeout=120)
        time.sleep(2)
    assert len(writer.acked) > 20
    assert writer.lost(etcd.ctl()) == set()
    status = cluster_status(etcd.ctl())
    assert status.problems() == []
    assert sorted(m.name for m in status.members) == ["etcd-0", "etcd-1", "etcd-2"]
    assert any(new.ip in url for m in status.members for url in m.peer_urls)
    assert change.seconds < 120
    config = new.run("cat /etc/etcd/etcd.conf.yaml").stdout
    assert "initial-cluster-state: existing" in config
    assert "corral etcd join: etcd-1 joins the running cluster" in new.run("journalctl -u etcd -o cat").stdout


def membership_cli(etcd, *args: str):
    """`corral etcd add|remove jaguar ...` (jaguar's file says 5 members; the lab's names are not
    its layout's, so `add` takes --peer-url) against the lab's members with the client certificate."""
    from typer.testing import CliRunner

    from corral.cli import app

    tls = etcd.client_tls
    endpoints = ",".join(m.client_url for m in etcd.members.values())
    return CliRunner().invoke(app, ["etcd", *args, "--clusters", CLUSTERS, "--endpoints", endpoints,
                                    "--cacert", tls.cacert, "--cert", tls.cert, "--key", tls.key])


def test_grow_three_to_five_one_at_a_time_while_writing(etcd):
    new_hosts = etcd.provision(["etcd-3", "etcd-4"])
    # The new machines boot first, as `pulumi up` creates them, rendered as a first boot
    # (`new`, the grown list): their join-state check refuses until `member add` lists
    # them, and systemd retries.
    grown = list(etcd.members.values()) + new_hosts
    for eh in new_hosts:
        etcd.configure(eh, grown)
        eh.run("systemctl start --no-block etcd")
    for eh in new_hosts:
        deadline = time.monotonic() + 60
        while "does not list" not in eh.run("journalctl -u etcd -o cat").stdout:
            assert time.monotonic() < deadline, f"{eh.name}'s join-state check never ran"
            time.sleep(1)
    outputs = []
    with Writer(etcd.ctl()) as writer:
        for eh in new_hosts:
            result = membership_cli(etcd, "add", "jaguar", eh.name, "--peer-url", eh.peer_url, "--timeout", "120")
            assert result.exit_code == 0, result.output
            outputs.append(result.output)
            etcd.members[eh.name] = eh
    # One at a time: the second was added only after the first had joined (4 healthy members).
    assert "etcd-3: add done" in outputs[0] and "4 members, healthy" in outputs[0]
    assert "The cluster file says 5: add the next member" in outputs[0]
    assert "etcd-4: add done" in outputs[1] and "5 members, healthy" in outputs[1]
    assert len(writer.acked) > 20
    assert writer.lost(etcd.ctl()) == set()
    for eh in new_hosts:
        assert "initial-cluster-state: existing" in eh.run("cat /etc/etcd/etcd.conf.yaml").stdout
        assert f"corral etcd join: {eh.name} joins the running cluster" in eh.run("journalctl -u etcd -o cat").stdout
    status = cluster_status(etcd.ctl())
    assert len(status.members) == 5 and status.problems() == []


def test_shrink_five_to_three_one_at_a_time_while_writing(etcd):
    removed = [etcd.members["etcd-4"], etcd.members["etcd-3"]]
    with Writer(etcd.ctl()) as writer:
        for eh in removed:
            result = membership_cli(etcd, "remove", "jaguar", eh.name)
            assert result.exit_code == 0, result.output
            assert f"{eh.name}: remove done" in result.output
            # Its machine is deleted after it left (`pulumi up` in the cloud).
            del etcd.members[eh.name]
            eh.run("systemctl disable -q --now etcd", check=False)
    assert len(writer.acked) > 20
    assert writer.lost(etcd.ctl()) == set()
    status = cluster_status(etcd.ctl())
    assert sorted(m.name for m in status.members) == ["etcd-0", "etcd-1", "etcd-2"] and status.problems() == []
    refused = membership_cli(etcd, "remove", "jaguar", "etcd-2")
    assert refused.exit_code == 1 and "2 members would be left" in refused.output
