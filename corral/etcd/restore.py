"""Rebuild a whole etcd cluster from one snapshot (quorum lost), driving every member over SSH.

What `corral etcd restore CLUSTER SNAPSHOT --all` runs (docs/etcd.md, Restore):

1. the snapshot's SHA-256 (and, given, the bucket's `sha256` metadata must match);
2. every member reachable; if a quorum answers (the cluster is healthy),
   refuse unless `wipe_healthy` (or say "already restored" when every member
   carries this snapshot's restore marker: a second run changes nothing);
3. the file copied to every member's data disk, its SHA-256 and its
   database (`snapshot status`) checked there;
4. etcd stopped on every member;
5. on every member, `snapshot restore` of the same file with the member's
   name and address and a NEW cluster token (`<token>-restored-<sha256[:12]>`),
   into a staging dir on the data disk; the old `member/` is moved aside
   (never deleted), the restored one moved into place, owned by etcd;
6. etcd started on every member at once (each waits for a quorum);
7. wait until every member is healthy, agrees on one leader and holds at
   least the snapshot's revision.

Every step is one shell command per member, run in parallel over plain
`ssh` (the operator's own, with their options: ProxyJump, keys), as root or
with `sudo -n`. Why not an Ansible playbook: the steps are gated across
members (all stopped before any restores, all restored before any starts,
then a cluster-wide health wait through etcdctl), which is Python's job
here anyway (the client layer's `prefix` runs etcdctl over the same ssh),
and the operator needs no inventory for a cluster that is down.

Re-running is safe: an interrupted restore leaves a cluster without a
quorum, so the next run starts over (the same token: the same snapshot);
a finished one leaves a healthy cluster, which is never wiped without the
explicit flag.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import subprocess
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from corral.machine.etcd_member import ETCD_DATA_DIR, ETCD_PKI_DIR, ETCD_USER
from corral.machine.etcd_snapshot import LOCAL_ENDPOINT

from .client import Etcdctl, EtcdError, Tls

# On the data disk (the mount at ETCD_DATA_DIR), so moving the restored
# member/ into place is a rename, and an 8 GiB snapshot does not fill the root disk.
WORK_DIR = f"{ETCD_DATA_DIR}/corral-restore"
MARKER = f"{WORK_DIR}/restored.json"
DEFAULT_WAIT_SECONDS = 300
POLL_SECONDS = 1.0
# Copying the snapshot: at least this rate before the copy counts as stuck.
MIN_COPY_BYTES_PER_SECOND = 5 * 1024**2


# A POSIX portable user name (IEEE Std 1003.1, 3.437: the portable filename
# characters, not starting with a hyphen), at most 32 characters (useradd's
# limit). It becomes part of ssh's `user@host` argument: a name that starts
# with "-" would be read as an ssh option.
SSH_USER = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.-]{0,31}")


def check_ssh_user(name: str) -> str:
    if not SSH_USER.fullmatch(name):
        raise ValueError(f"ssh user {name!r} is not a POSIX user name (letters, digits, '.', '_', '-', "
                         "not starting with '-', at most 32)")
    return name


@dataclass(frozen=True)
class Ssh:
    """How to reach a member: the operator's ssh command (with its options) and user."""

    command: tuple[str, ...] = ("ssh",)
    user: str = "root"

    def __post_init__(self) -> None:
        check_ssh_user(self.user)

    def argv(self, address: str) -> list[str]:
        """ssh to `address`, then root: directly, or through `sudo -n` (never a password prompt)."""
        return [*self.command, f"{self.user}@{address}", *([] if self.user == "root" else ["sudo", "-n"])]


@dataclass(frozen=True)
class RestoreMember:
    name: str
    address: str

    @property
    def peer_url(self) -> str:
        return f"https://{self.address}:2380"


def initial_cluster(members: Sequence[RestoreMember]) -> str:
    return ",".join(f"{m.name}={m.peer_url}" for m in members)


def restored_token(base_token: str, sha256: str) -> str:
    """A new cluster's token, the same for every run restoring the same snapshot (resumable)."""
    return f"{base_token}-restored-{sha256[:12]}"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1024**2), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass
class Remote:
    """One member over ssh: shell scripts as root, and etcdctl with the member's own certificate."""

    member: RestoreMember
    ssh: Ssh
    run: Callable[..., subprocess.CompletedProcess] = field(default=subprocess.run, repr=False)

    def sh(self, script: str, timeout: float = 60, stdin=subprocess.DEVNULL) -> str:
        argv = self.ssh.argv(self.member.address) + ["bash -c " + shlex.quote("set -euo pipefail\n" + script)]
        try:
            proc = self.run(argv, stdin=stdin, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise EtcdError(f"{self.member.name} ({self.member.address}): no answer within {timeout:.0f} s") from None
        except FileNotFoundError:
            raise EtcdError(f"{self.ssh.command[0]} is not installed") from None
        if proc.returncode != 0:
            lines = [line for line in proc.stderr.splitlines() if line.strip()]
            detail = lines[-1] if lines else f"exit status {proc.returncode}"
            raise EtcdError(f"{self.member.name} ({self.member.address}): {detail}")
        return proc.stdout

    def ctl(self, command_timeout: int = 5, etcdutl: str = "") -> Etcdctl:
        """etcdctl on the member against its own loopback listener, as its server certificate
        (which is also a client certificate, PEER_USES): no client certificate on the operator's side."""
        pki = ETCD_PKI_DIR
        return Etcdctl([LOCAL_ENDPOINT], tls=Tls(f"{pki}/ca.crt", f"{pki}/server.crt", f"{pki}/server.key"),
                       prefix=self.ssh.argv(self.member.address), etcdutl=etcdutl,
                       command_timeout=command_timeout, run=self.run)


@dataclass
class MemberState:
    healthy: bool
    marker: dict | None


@dataclass
class RestoreResult:
    token: str
    sha256: str
    revision: int
    total_keys: int
    leader: str = ""
    already_done: bool = False
    kept: dict[str, str] = field(default_factory=dict)  # member -> where its old member/ went
    steps: list[tuple[str, float]] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return sum(t for _, t in self.steps)


def _each(remotes: list[Remote], fn: Callable[[Remote], object]) -> list:
    """`fn` on every member in parallel; all errors, one line per member."""
    with ThreadPoolExecutor(len(remotes)) as pool:
        futures = [pool.submit(fn, r) for r in remotes]
    results, errors = [], []
    for future in futures:
        try:
            results.append(future.result())
        except EtcdError as error:
            errors.append(str(error))
    if errors:
        raise EtcdError("\n  ".join(errors))
    return results


def _state(remote: Remote) -> MemberState:
    marker = remote.sh(f"cat {MARKER} 2>/dev/null || true").strip()
    health = remote.ctl(command_timeout=3).endpoint_health()
    try:
        parsed = json.loads(marker) if marker else None
    except json.JSONDecodeError:
        parsed = None
    return MemberState(healthy=bool(health) and all(h.healthy for h in health), marker=parsed)


def _copy(remote: Remote, snapshot: Path, sha256: str) -> None:
    size = snapshot.stat().st_size
    with open(snapshot, "rb") as data:
        remote.sh(f"mkdir -p -m 700 {WORK_DIR} && cat > {WORK_DIR}/snapshot.db.part", stdin=data,
                  timeout=60 + size / MIN_COPY_BYTES_PER_SECOND)
    # The same bytes arrived; only then the file gets its name.
    remote.sh(f"cd {WORK_DIR} && echo {shlex.quote(sha256 + '  snapshot.db.part')} | sha256sum -c --quiet - "
              "&& mv snapshot.db.part snapshot.db", timeout=60 + size / MIN_COPY_BYTES_PER_SECOND)


def _etcdutl(remote: Remote) -> str:
    """etcd 3.5 members have etcdutl for the offline commands; 3.4 has them in etcdctl."""
    return remote.sh("command -v etcdutl || true").strip()


MOVE_INTO_PLACE = """
D={data_dir}; W={work}
mountpoint -q "$D" || {{ echo "$D is not a mount point: the data disk is missing" >&2; exit 1; }}
kept=""
if [ -e "$D/member" ]; then
  kept="$W/previous-$(date -u +%Y%m%dT%H%M%SZ)"
  mkdir -p "$kept" && mv "$D/member" "$kept/member"
fi
mv "$W/staging/member" "$D/member" && rm -rf "$W/staging"
chown -R {user}:{user} "$D/member" && chmod 700 "$D" "$D/member"
printf '%s\\n' {marker} > "$W/restored.json.tmp" && mv "$W/restored.json.tmp" "$W/restored.json"
echo "$kept"
"""


def _restore_one(remote: Remote, members: Sequence[RestoreMember], token: str, marker: dict) -> str:
    """The member's new data dir from the copied snapshot; returns where its old data went ("" if none)."""
    remote.sh(f"rm -rf {WORK_DIR}/staging")
    ctl = remote.ctl(etcdutl=_etcdutl(remote))
    ctl.snapshot_restore(f"{WORK_DIR}/snapshot.db", name=remote.member.name, initial_cluster=initial_cluster(members),
                         cluster_token=token, peer_url=remote.member.peer_url, data_dir=f"{WORK_DIR}/staging")
    return remote.sh(MOVE_INTO_PLACE.format(data_dir=ETCD_DATA_DIR, work=WORK_DIR, user=ETCD_USER,
                                            marker=shlex.quote(json.dumps(marker, sort_keys=True)))).strip()


def _problems(remotes: list[Remote], revision: int) -> tuple[list[str], str]:
    """Why the restored cluster is not ready yet (empty when it is), and its leader's name."""
    problems, leaders, names = [], set(), {}
    for remote in remotes:
        ctl = remote.ctl(command_timeout=3)
        health = ctl.endpoint_health()
        if not (health and all(h.healthy for h in health)):
            problems.append(f"{remote.member.name}: {(health[0].error if health else '') or 'not healthy'}")
            continue
        statuses = ctl.endpoint_status()
        if not statuses:
            problems.append(f"{remote.member.name}: no status")
            continue
        status = statuses[0]
        names[status.member_id] = remote.member.name
        leaders.add(status.leader)
        if status.revision < revision:
            problems.append(f"{remote.member.name}: revision {status.revision} < the snapshot's {revision}")
    if not problems and len(leaders) != 1:
        problems.append(f"members see {len(leaders)} leaders")
    return problems, names.get(next(iter(leaders)), "") if len(leaders) == 1 else ""


def restore_cluster(members: Sequence[RestoreMember], snapshot: Path, base_token: str, ssh: Ssh, *,
                    expected_sha256: str | None = None, wipe_healthy: bool = False,
                    timeout: float = DEFAULT_WAIT_SECONDS, progress: Callable[[str], None] = lambda _: None,
                    run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> RestoreResult:
    remotes = [Remote(m, ssh, run) for m in members]
    steps: list[tuple[str, float]] = []

    def timed(step: str, fn: Callable[[], object]):
        progress(f"{step}...")
        start = time.monotonic()
        value = fn()
        steps.append((step, time.monotonic() - start))
        return value

    sha256 = timed("hash the snapshot", lambda: file_sha256(snapshot))
    if expected_sha256 and expected_sha256.lower() != sha256:
        raise EtcdError(f"{snapshot}: SHA-256 {sha256} is not the expected {expected_sha256} "
                        "(a partial download or another object)")
    token = restored_token(base_token, sha256)
    states = timed("reach every member", lambda: _each(remotes, _state))
    healthy = [r.member.name for r, s in zip(remotes, states) if s.healthy]
    if healthy and not wipe_healthy:
        if all(s.marker and s.marker.get("sha256") == sha256 and s.marker.get("token") == token for s in states):
            marker = states[0].marker or {}
            return RestoreResult(token, sha256, int(marker.get("revision", 0)), int(marker.get("keys", 0)),
                                 already_done=True, steps=steps)
        raise EtcdError(
            f"refusing to restore: etcd is healthy (a quorum answers through {', '.join(healthy)}); a restore "
            "replaces everything written since the snapshot. If that is what you want, pass --wipe-healthy")
    timed("copy and verify on every member", lambda: _each(remotes, lambda r: _copy(r, snapshot, sha256)))
    statuses = _each(remotes, lambda r: r.ctl(etcdutl=_etcdutl(r)).snapshot_status(f"{WORK_DIR}/snapshot.db"))
    status = statuses[0]
    timed("stop etcd on every member",
          lambda: _each(remotes, lambda r: r.sh("systemctl stop etcd && ! systemctl is-active -q etcd", timeout=120)))
    marker = {"sha256": sha256, "token": token, "revision": status.revision, "keys": status.total_keys,
              "members": initial_cluster(members), "restored_at": int(time.time())}
    kept = timed("restore on every member", lambda: _each(remotes, lambda r: _restore_one(r, members, token, marker)))
    timed("start etcd on every member", lambda: _each(remotes, lambda r: r.sh("systemctl start --no-block etcd")))

    def wait() -> str:
        deadline = time.monotonic() + timeout
        while True:
            problems, leader = _problems(remotes, status.revision)
            if not problems:
                return leader
            if time.monotonic() > deadline:
                raise EtcdError(f"the restored cluster is not healthy after {timeout:.0f} s (journalctl -u etcd "
                                "on the members):\n  " + "\n  ".join(problems))
            time.sleep(POLL_SECONDS)

    leader = timed("wait for a quorum and health", wait)
    _each(remotes, lambda r: r.sh(f"rm -f {WORK_DIR}/snapshot.db"))
    return RestoreResult(token, sha256, status.revision, status.total_keys, leader=leader,
                         kept={r.member.name: k for r, k in zip(remotes, kept) if k}, steps=steps)
