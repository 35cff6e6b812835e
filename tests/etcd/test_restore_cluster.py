"""`corral etcd restore --all`: what it refuses before touching a member, and how it reaches them.

The restore itself runs on real members in tests/etcd/test_lifecycle_hostlab.py
(test_restore_after_losing_two_members_and_their_data).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from corral.cli import app
from corral.etcd.restore import RestoreMember, Ssh, initial_cluster, restored_token

CLUSTERS = str(Path(__file__).resolve().parents[2] / "clusters")


def invoke(*args: str):
    return CliRunner().invoke(app, ["etcd", "restore", "heron", *args, "--clusters", CLUSTERS])


def test_restore_says_which_mode_and_refuses_mixing_them(tmp_path):
    snap = tmp_path / "s.db"
    snap.write_bytes(b"not touched")
    result = invoke(str(snap))
    assert result.exit_code == 1 and "--all (the whole cluster, over ssh) or --member NAME --data-dir DIR" in result.output
    result = invoke(str(snap), "--all", "--member", "heron-etcd-0")
    assert result.exit_code == 1 and "--member and --data-dir are for one member" in result.output
    result = invoke(str(snap), "--all", "--member-address", "heron-etcd-0")
    assert result.exit_code == 1 and "expected NAME=ADDRESS" in result.output
    result = invoke(str(snap), "--all", "--member-address", "a=10.0.0.1", "--member-address", "a=10.0.0.2")
    assert result.exit_code == 1 and "a member is named twice" in result.output


def test_a_snapshot_with_another_hash_is_refused_before_any_member_is_reached(tmp_path):
    snap = tmp_path / "s.db"
    snap.write_bytes(b"partial download")
    # An ssh that would fail loudly if it were run: the hash check comes first.
    result = invoke(str(snap), "--all", "--sha256", "ab" * 32, "--ssh", str(tmp_path / "no-such-ssh"))
    assert result.exit_code == 1
    actual = hashlib.sha256(b"partial download").hexdigest()
    assert f"SHA-256 {actual} is not the expected {'ab' * 32}" in result.output
    assert "no-such-ssh" not in result.output


def test_unreachable_members_stop_the_restore_with_every_name(tmp_path):
    snap = tmp_path / "s.db"
    snap.write_bytes(b"x")
    fake_ssh = tmp_path / "fake_ssh"  # the process boundary: an ssh that cannot connect
    fake_ssh.write_text("#!/bin/sh\necho \"ssh: connect to host $2 port 22: No route to host\" >&2\nexit 255\n")
    fake_ssh.chmod(0o755)
    result = invoke(str(snap), "--all", "--ssh", f"{fake_ssh} -o X=1", "--member-address", "m0=10.9.0.1",
                    "--member-address", "m1=10.9.0.2")
    assert result.exit_code == 1
    assert "m0 (10.9.0.1): ssh: connect to host" in result.output and "m1 (10.9.0.2)" in result.output
    assert "restoring 2 members (m0, m1)" in result.output


def test_ssh_as_another_user_goes_through_sudo_without_a_prompt():
    assert Ssh(("ssh", "-J", "bastion"), "admin").argv("10.0.0.5") == [
        "ssh", "-J", "bastion", "admin@10.0.0.5", "sudo", "-n"]
    assert Ssh().argv("10.0.0.5") == ["ssh", "root@10.0.0.5"]


@pytest.mark.parametrize("user", ["-oProxyCommand=touch /tmp/pwned", "admin@evil", "a b", "x" * 33, "r\u00f6ot"])
def test_an_ssh_user_that_is_not_a_posix_name_is_refused_before_any_member_is_reached(tmp_path, monkeypatch, user):
    """--ssh-user and $CORRAL_ETCD_SSH_USER become ssh's `user@host`: a name starting with '-' would be an
    ssh option (issue 25, item 12)."""
    snap = tmp_path / "s.db"
    snap.write_bytes(b"x")
    fake_ssh = tmp_path / "fake_ssh"  # records that it ran: it must not
    fake_ssh.write_text(f"#!/bin/sh\ntouch {tmp_path / 'ran'}\nexit 255\n")
    fake_ssh.chmod(0o755)
    monkeypatch.setenv("CORRAL_ETCD_SSH_USER", user)
    result = invoke(str(snap), "--all", "--ssh", str(fake_ssh), "--member-address", "m0=10.9.0.1")
    assert result.exit_code == 2 and "is not a POSIX user name" in result.output, result.output
    assert not (tmp_path / "ran").exists()
    with pytest.raises(ValueError, match="not a POSIX user name"):
        Ssh(("ssh",), user)
    # the renewal's --etcd-members takes the same option
    result = CliRunner().invoke(app, ["upgrade", "heron", "--renew-certs", "--etcd-members", "--ssh-user", user,
                                      "--clusters", CLUSTERS])
    assert result.exit_code == 2 and "is not a POSIX user name" in result.output, result.output


def test_posix_user_names_are_accepted():
    for user in ("root", "admin", "ops.team", "svc_etcd", "a-b", "_apt", "x" * 32):
        assert Ssh(("ssh",), user).user == user
    with pytest.raises(ValueError, match="not a POSIX user name"):
        Ssh(("ssh",), "")


def test_the_new_token_is_new_and_the_same_for_a_rerun_of_the_same_snapshot():
    members = [RestoreMember("a", "10.0.0.1"), RestoreMember("b", "10.0.0.2")]
    assert initial_cluster(members) == "a=https://10.0.0.1:2380,b=https://10.0.0.2:2380"
    token = restored_token("heron-etcd", "0123456789abcdef" * 4)
    assert token == "heron-etcd-restored-0123456789ab" != "heron-etcd"
    assert restored_token("heron-etcd", "f" * 64) != token
