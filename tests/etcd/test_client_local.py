"""The client layer and membership logic against real etcd processes on loopback (TLS)."""

from __future__ import annotations

import base64
import shutil
import threading
import time

import pytest

from corral.etcd import EtcdError, add_member, cluster_status, replace_member, require_healthy
from corral.etcd.client import Tls

from .local import LocalCluster, etcd_installed

pytestmark = pytest.mark.skipif(not etcd_installed(), reason="etcd not installed (apt-get install etcd-server etcd-client)")


def put(ctl, key: str, value: str) -> None:
    ctl._exec(ctl.command("put", key, value, json_output=False), 15)


def keys(ctl, prefix: str) -> set[str]:
    data = ctl._call("get", prefix, "--prefix", "--keys-only")
    return {base64.b64decode(kv["key"]).decode() for kv in data.get("kvs", [])}


def get_count(ctl, prefix: str) -> int:
    data = ctl._call("get", prefix, "--prefix", "--keys-only", "--limit=1")  # "count" is the total
    return int(data.get("count", 0))


def test_status_names_members_leader_and_versions(local3):
    status = cluster_status(local3.ctl())
    assert sorted(m.name for m in status.members) == ["m0", "m1", "m2"]
    assert all(m.started for m in status.members)
    assert len(status.statuses) == 3 and all(s.version.startswith("3.") for s in status.statuses)
    assert status.leader is not None and status.leader.name in {"m0", "m1", "m2"}
    assert status.problems() == []


def test_health_gate_names_the_dead_member(local3):
    local3.members["m2"].kill()
    with pytest.raises(EtcdError) as err:
        # a dead member costs a command timeout: the knob, shorter than an operator's default
        require_healthy(local3.ctl(command_timeout=3), action="add m3")
    assert "refusing to add m3" in str(err.value)
    assert "m2 is unhealthy" in str(err.value)
    assert "m0" not in str(err.value).split("\n", 1)[1]


def test_wrong_client_certificate_is_a_clear_error(local3, tmp_path):
    other = LocalCluster(tmp_path / "other")
    ctl = local3.ctl()
    ctl.tls = Tls(local3.client_tls.cacert, other.client_tls.cert, other.client_tls.key)
    ctl.command_timeout = 3
    with pytest.raises(EtcdError) as err:
        ctl.members()
    assert "member list" in str(err.value) and "failed" in str(err.value)


def test_snapshot_save_status_and_restore_roundtrip(local3, tmp_path):
    ctl = local3.ctl()
    for i in range(50):
        put(ctl, f"/registry/pods/p{i}", f"v{i}")
    snap = str(tmp_path / "snap.db")
    ctl.snapshot_save(snap)
    status = ctl.snapshot_status(snap)
    assert status.revision >= 51 and status.total_keys >= 50 and status.total_size > 0
    # A corrupted copy does not restore: `snapshot save` appends the file's
    # SHA-256, and restore checks it (status alone reads the database, not the hash).
    data = bytearray(open(snap, "rb").read())
    data[len(data) // 2: len(data) // 2 + 64] = b"\xff" * 64
    bad = tmp_path / "bad.db"
    bad.write_bytes(bytes(data))
    with pytest.raises(EtcdError, match="snapshot restore"):
        ctl.snapshot_restore(str(bad), name="x", initial_cluster="x=https://127.0.0.1:1", cluster_token="t",
                             peer_url="https://127.0.0.1:1", data_dir=str(tmp_path / "bad-restore"))
    # Restore into a one-member cluster and read the keys back.
    local3.stop()
    restored = LocalCluster(tmp_path / "restored", ca=local3.ca)
    member = restored.member("r0")
    ctl.snapshot_restore(snap, name="r0", initial_cluster=f"r0={member.peer_url}", cluster_token="restored",
                         peer_url=member.peer_url, data_dir=str(member.data_dir))
    member.start(f"r0={member.peer_url}", "new", "restored")
    try:
        restored.wait_healthy()
        assert get_count(restored.ctl(), "/registry/pods/") == 50
    finally:
        restored.stop()


def _writer(ctl, stop: threading.Event, acked: list[str], failed: list[str]) -> None:
    i = 0
    while not stop.is_set():
        key = f"/w/{i:06d}"
        try:
            put(ctl, key, "x")
            acked.append(key)
        except EtcdError as err:
            failed.append(str(err))
        i += 1


def test_replace_leader_while_writing_loses_no_acknowledged_write(local3):
    ctl = local3.ctl()
    leader = cluster_status(ctl).leader
    assert leader is not None
    stop, acked, failed = threading.Event(), [], []
    writer = threading.Thread(target=_writer, args=(local3.ctl(), stop, acked, failed))
    writer.start()
    try:
        old = local3.members.pop(leader.name)
        # The new machine listens elsewhere (new ports) and starts with an empty data dir.
        new_member = local3.member(leader.name)
        local3.members[leader.name] = old

        def start_new(name: str, initial_cluster: str) -> None:
            old.kill()
            shutil.rmtree(old.data_dir, ignore_errors=True)
            local3.members[name] = new_member
            new_member.start(initial_cluster, "existing", local3.token)

        time.sleep(2)  # writes before, during and after the change
        change = replace_member(ctl, leader.name, new_member.peer_url, start_new, timeout=60)
        time.sleep(2)
    finally:
        stop.set()
        writer.join(30)
    assert [s for s, _ in change.steps][:2] == ["health gate", "move leader"]
    status = cluster_status(local3.ctl())
    assert status.problems() == []
    assert sorted(m.name for m in status.members) == ["m0", "m1", "m2"]
    # Every acknowledged write is there, read through the NEW member too.
    new_ctl = local3.ctl()
    new_ctl.endpoints = [local3.members[leader.name].client_url]
    present = keys(new_ctl, "/w/")
    assert len(acked) > 10
    lost = set(acked) - present
    assert not lost, f"{len(lost)} acknowledged writes lost"


def test_add_member_behind_the_gate(local3):
    ctl = local3.ctl()
    new = local3.member("m3")
    change = add_member(ctl, "m3", new.peer_url,
                        lambda name, initial: new.start(initial, "existing", local3.token), timeout=60)
    assert change.member == "m3"
    status = cluster_status(local3.ctl())
    assert sorted(m.name for m in status.members) == ["m0", "m1", "m2", "m3"]
    assert status.problems() == []
    with pytest.raises(EtcdError, match="already a member"):
        add_member(local3.ctl(), "m3", new.peer_url, lambda *a: None)
