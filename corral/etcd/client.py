"""etcd at the process boundary: `etcdctl` (and `etcdutl`) subprocesses with JSON output.

corral never links an etcd client library: the operators' own tool is what
runs on the members, its JSON output is stable across 3.4 and 3.5, and every
call is one command an operator can repeat by hand (`Etcdctl.command`).

Versions: etcd 3.4 (Debian bookworm's etcd-client, what the tests run) has
`etcdctl snapshot status|restore`; etcd 3.5 moved the offline snapshot
commands to `etcdutl` and deprecated them in etcdctl (3.6 removes them).
`Etcdctl` uses `etcdutl` for offline work when it is installed, else
etcdctl's own commands; `snapshot save` (online) is etcdctl in both.

Commands can run on another machine: `prefix` is prepended to every command
(e.g. `["ssh", "root@10.0.0.5"]`), so the same code restores a member's data
directory over SSH that runs locally on the member.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

DEFAULT_COMMAND_TIMEOUT_SECONDS = 10
# A member that does not answer costs this long per command: more over a slow
# link, less where members are known to be dead (the tests).
COMMAND_TIMEOUT_ENV = "CORRAL_ETCD_COMMAND_TIMEOUT"
# A whole `snapshot save` of an 8 GiB database takes minutes, not seconds.
SNAPSHOT_TIMEOUT_SECONDS = 900


class EtcdError(Exception):
    """An etcd operation failed or a health gate refused; the message says which and why."""


def default_command_timeout() -> int:
    """etcdctl's --command-timeout: $CORRAL_ETCD_COMMAND_TIMEOUT seconds, else DEFAULT_COMMAND_TIMEOUT_SECONDS."""
    value = os.environ.get(COMMAND_TIMEOUT_ENV, "").strip()
    if not value:
        return DEFAULT_COMMAND_TIMEOUT_SECONDS
    if not value.isdigit() or int(value) < 1:
        raise EtcdError(f"${COMMAND_TIMEOUT_ENV} is {value!r}: a whole number of seconds, 1 or more")
    return int(value)


@dataclass(frozen=True)
class Tls:
    """Client TLS files (paths where the command runs): CA, certificate, key."""

    cacert: str
    cert: str
    key: str

    def flags(self) -> list[str]:
        return [f"--cacert={self.cacert}", f"--cert={self.cert}", f"--key={self.key}"]


@dataclass(frozen=True)
class Member:
    """One entry of `member list`. An added member that has not started yet has no name."""

    id: int
    name: str
    peer_urls: tuple[str, ...]
    client_urls: tuple[str, ...]
    is_learner: bool = False

    @property
    def hex_id(self) -> str:
        """The form etcdctl takes (`member remove 2e0e...`) and prints in tables."""
        return f"{self.id:x}"

    @property
    def started(self) -> bool:
        return bool(self.name) and bool(self.client_urls)

    @classmethod
    def from_json(cls, data: dict) -> Member:
        return cls(
            id=int(data["ID"]),
            name=data.get("name", ""),
            peer_urls=tuple(data.get("peerURLs", ())),
            client_urls=tuple(data.get("clientURLs", ())),
            is_learner=bool(data.get("isLearner", False)),
        )


@dataclass(frozen=True)
class EndpointStatus:
    """One entry of `endpoint status`: what the member at `endpoint` says about itself."""

    endpoint: str
    member_id: int
    leader: int
    version: str
    revision: int
    raft_term: int
    raft_index: int
    raft_applied_index: int
    db_size: int
    db_size_in_use: int
    errors: tuple[str, ...] = ()

    @property
    def is_leader(self) -> bool:
        return self.member_id == self.leader

    @classmethod
    def from_json(cls, data: dict) -> EndpointStatus:
        status = data["Status"]
        header = status.get("header", {})
        return cls(
            endpoint=data["Endpoint"],
            member_id=int(header.get("member_id", 0)),
            leader=int(status.get("leader", 0)),
            version=status.get("version", ""),
            revision=int(header.get("revision", 0)),
            raft_term=int(status.get("raftTerm", 0)),
            raft_index=int(status.get("raftIndex", 0)),
            raft_applied_index=int(status.get("raftAppliedIndex", 0)),
            db_size=int(status.get("dbSize", 0)),
            db_size_in_use=int(status.get("dbSizeInUse", 0)),
            errors=tuple(status.get("errors", ()) or ()),
        )


@dataclass(frozen=True)
class EndpointHealth:
    endpoint: str
    healthy: bool
    took: str = ""
    error: str = ""


@dataclass(frozen=True)
class SnapshotStatus:
    """`snapshot status` of a snapshot file: its integrity hash, revision and size."""

    hash: int
    revision: int
    total_keys: int
    total_size: int


@dataclass
class Etcdctl:
    """etcdctl against `endpoints` (client URLs), with client TLS when given.

    `run` is subprocess.run's signature (tests and the CLI pass the real
    one); `prefix` runs every command elsewhere (ssh). `etcdutl` is None to
    look it up on PATH (local commands only), "" to never use it.
    """

    endpoints: Sequence[str]
    tls: Tls | None = None
    etcdctl: str = "etcdctl"
    etcdutl: str | None = None
    prefix: Sequence[str] = ()
    command_timeout: int = field(default_factory=default_command_timeout)
    run: Callable[..., subprocess.CompletedProcess] = field(default=subprocess.run, repr=False)

    def __post_init__(self) -> None:
        if self.etcdutl is None:
            self.etcdutl = "" if self.prefix else (shutil.which("etcdutl") or "")

    # --- the commands ------------------------------------------------------------------

    def command(self, *args: str, endpoints: Sequence[str] | None = None, json_output: bool = True) -> list[str]:
        """The etcdctl command line for `args` (what `_call` runs, for logs and docs)."""
        eps = ",".join(endpoints if endpoints is not None else self.endpoints)
        cmd = [self.etcdctl, f"--endpoints={eps}", f"--command-timeout={self.command_timeout}s"]
        if self.tls:
            cmd += self.tls.flags()
        if json_output:
            cmd += ["-w", "json"]
        return cmd + list(args)

    def _exec(self, cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
        full = list(self.prefix) + ([shlex.join(cmd)] if self.prefix else cmd)
        try:
            proc = self.run(full, capture_output=True, text=True, timeout=timeout,
                            env=None if self.prefix else _etcdctl_env())
        except FileNotFoundError:
            raise EtcdError(f"{cmd[0]} is not installed (Debian: apt-get install etcd-client)") from None
        except subprocess.TimeoutExpired:
            raise EtcdError(f"`{_shown(cmd)}` did not finish within {timeout:.0f} s") from None
        if proc.returncode != 0:
            detail = _last_error(proc.stderr) or proc.stdout.strip() or f"exit status {proc.returncode}"
            raise EtcdError(f"`{_shown(cmd)}` failed: {detail}")
        return proc

    def _call(self, *args: str, endpoints: Sequence[str] | None = None, timeout: float | None = None):
        cmd = self.command(*args, endpoints=endpoints)
        proc = self._exec(cmd, timeout or self.command_timeout + 5)
        try:
            return json.loads(proc.stdout)
        except json.JSONDecodeError:
            raise EtcdError(f"`{_shown(cmd)}` printed no JSON: {proc.stdout[:200]!r}") from None

    # --- cluster -----------------------------------------------------------------------

    def members(self) -> list[Member]:
        return [Member.from_json(m) for m in self._call("member", "list").get("members", [])]

    def endpoint_status(self, endpoints: Sequence[str] | None = None) -> list[EndpointStatus]:
        """Each endpoint's own status. An endpoint that does not answer makes etcdctl
        fail as a whole, so ask them one at a time and leave the silent ones out."""
        result = []
        for endpoint in endpoints if endpoints is not None else self.endpoints:
            try:
                result += [EndpointStatus.from_json(s) for s in self._call("endpoint", "status", endpoints=[endpoint])]
            except EtcdError:
                continue
        return result

    def endpoint_health(self, endpoints: Sequence[str] | None = None) -> list[EndpointHealth]:
        """Health (a quorum read through each endpoint): one entry per endpoint, healthy or not."""
        result = []
        for endpoint in endpoints if endpoints is not None else self.endpoints:
            try:
                entries = self._call("endpoint", "health", endpoints=[endpoint])
            except EtcdError as err:
                result.append(EndpointHealth(endpoint, False, error=str(err)))
                continue
            for entry in entries:
                result.append(EndpointHealth(
                    entry.get("endpoint", endpoint), bool(entry.get("health")),
                    entry.get("took", ""), entry.get("error", ""),
                ))
        return result

    def member_add(self, name: str, peer_url: str) -> tuple[Member, str]:
        """Add `name` at `peer_url`; returns the new member and the `initial-cluster`
        it must start with (every member's name=peer URL, itself included)."""
        data = self._call("member", "add", name, f"--peer-urls={peer_url}")
        new = Member.from_json(data["member"])
        pairs = []
        for entry in data.get("members", []):
            member = Member.from_json(entry)
            member_name = name if member.id == new.id else member.name
            pairs += [f"{member_name}={url}" for url in member.peer_urls]
        return new, ",".join(pairs)

    def member_remove(self, member: Member) -> None:
        self._call("member", "remove", member.hex_id)

    def move_leader(self, target: Member, leader_endpoint: str) -> None:
        """Hand leadership to `target`; etcdctl must talk to the current leader."""
        self._exec(self.command("move-leader", target.hex_id, endpoints=[leader_endpoint], json_output=False),
                   self.command_timeout + 5)

    # --- snapshots ---------------------------------------------------------------------

    def snapshot_save(self, path: str, endpoint: str | None = None) -> None:
        """A snapshot of one member's database (etcdctl refuses several endpoints)."""
        endpoint = endpoint or self.endpoints[0]
        self._exec(self.command("snapshot", "save", path, endpoints=[endpoint], json_output=False),
                   SNAPSHOT_TIMEOUT_SECONDS)

    def _offline(self, *args: str, json_output: bool) -> list[str]:
        """An offline snapshot command: etcdutl when installed (3.5+), else etcdctl (3.4)."""
        tool = [self.etcdutl] if self.etcdutl else [self.etcdctl]
        return tool + (["-w", "json"] if json_output else []) + list(args)

    def snapshot_status(self, path: str) -> SnapshotStatus:
        """Reads the whole file and checks its integrity hash; fails on a corrupt snapshot."""
        cmd = self._offline("snapshot", "status", path, json_output=True)
        proc = self._exec(cmd, SNAPSHOT_TIMEOUT_SECONDS)
        try:
            data = json.loads(proc.stdout)
        except json.JSONDecodeError:
            raise EtcdError(f"`{_shown(cmd)}` printed no JSON: {proc.stdout[:200]!r}") from None
        return SnapshotStatus(int(data["hash"]), int(data["revision"]), int(data["totalKey"]), int(data["totalSize"]))

    def snapshot_restore(self, path: str, *, name: str, initial_cluster: str, cluster_token: str,
                         peer_url: str, data_dir: str) -> None:
        """A new data directory for member `name` from the snapshot (a NEW cluster's
        identity: every member of the restored cluster restores the same file)."""
        cmd = self._offline(
            "snapshot", "restore", path, f"--name={name}", f"--initial-cluster={initial_cluster}",
            f"--initial-cluster-token={cluster_token}", f"--initial-advertise-peer-urls={peer_url}",
            f"--data-dir={data_dir}", json_output=False,
        )
        self._exec(cmd, SNAPSHOT_TIMEOUT_SECONDS)


def _etcdctl_env() -> dict[str, str]:
    import os

    env = dict(os.environ)
    env["ETCDCTL_API"] = "3"  # 3.4's default already; explicit for older clients
    return env


def _shown(cmd: Sequence[str]) -> str:
    """The command for a message: key paths are fine to show, nothing secret is on it."""
    return shlex.join(cmd[:1] + [c for c in cmd[1:] if not c.startswith(("--cacert", "--cert", "--key"))])


def _last_error(stderr: str) -> str:
    """etcdctl's own last error line ("Error: ..."), else the last non-empty line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith("Error:"):
            return line
    return lines[-1] if lines else ""
