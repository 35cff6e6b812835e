"""The on-prem hosts' ssh host keys: recorded for review, checked on every connection.

`corral hosts trust CLUSTER` scans the hosts' keys (ssh-keyscan, by address
where the cluster file gives one, through the site's jump host where it has
one) and records them in `clusters/<cluster>.known_hosts`, beside the
cluster file, to be reviewed and committed like it. Every ssh connection
corral's Ansible makes checks the host against that file and nothing else
(`StrictHostKeyChecking=yes`, `UserKnownHostsFile=<file>`: ssh_config(5)),
and `corral join` compares the keys its hosts present now with the file
before it runs any task, so a changed key stops the join with the host, the
file and the command that re-trusts it named.

The file is OpenSSH's known_hosts format (sshd(8), "SSH_KNOWN_HOSTS FILE
FORMAT"): one line per host and key type, `NAME KEYTYPE BASE64`. Hosts are
named by their inventory name, however they are reached: ssh looks them up
under that name because corral sets `HostKeyAlias` (ssh_config(5): "an alias
that should be used instead of the real host name when looking up or saving
the host key"; OpenSSH's sshconnect.c uses the alias as the whole lookup
name, with no port appended). Jump hosts are named as the cluster file
writes them. Lines are sorted, so a second run with the same keys writes
nothing, and a review diff shows exactly what changed.

A key the file has for a host is never replaced silently: `trust` reports a
changed (or additional) key and keeps the old one until `--replace HOST`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import shlex
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from corral.model import Cluster
from corral.model.schema import JumpHost
from corral.util import write_atomic

# Seconds ssh-keyscan waits for a host (its -T): a host that does not answer
# is reported as not scanned, not waited for.
SCAN_TIMEOUT = 5
# Key types are names of letters, digits and '-', '@', '.' (ssh-ed25519,
# ecdsa-sha2-nistp256, sk-ssh-ed25519@openssh.com); keys base64.
KeySet = frozenset  # of (key type, base64 key)
Runner = Callable[..., subprocess.CompletedProcess]


class KnownHostsError(Exception):
    """The known hosts file cannot be read or used; the message says what to do."""


def trust_command(cluster: str, replace: Iterable[str] = ()) -> str:
    return shlex.join(["corral", "hosts", "trust", cluster, *(a for h in replace for a in ("--replace", h))])


def fingerprint(key: str) -> str:
    """OpenSSH's SHA256 fingerprint of a base64 key (what `ssh-keygen -l` and ssh's warnings print)."""
    digest = hashlib.sha256(base64.b64decode(key)).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def _valid_key(key_type: str, key: str) -> bool:
    if not key_type or not all(c.isalnum() or c in "-@." for c in key_type):
        return False
    try:
        blob = base64.b64decode(key, validate=True)
    except (binascii.Error, ValueError):
        return False
    # The blob starts with its own type, length-prefixed (RFC 4253, section 6.6).
    length = int.from_bytes(blob[:4], "big")
    return blob[4:4 + length].decode("ascii", "replace") == key_type.removesuffix("-cert-v01@openssh.com")


# ------------------------------------------------------------------ the file


def read(path: Path) -> dict[str, KeySet]:
    """Host name -> its recorded keys. A missing file is empty; a bad line is an error naming file and line."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as err:
        raise KnownHostsError(f"cannot read {path}: {getattr(err, 'strerror', None) or err}") from None
    keys: dict[str, set] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        fields = line.split()
        if len(fields) != 3 or fields[0].startswith("@") or not _valid_key(fields[1], fields[2]):
            raise KnownHostsError(
                f"{path}:{number}: expected 'HOST KEYTYPE BASE64-KEY' (as `corral hosts trust` writes it), "
                f"got {line.strip()[:80]!r}")
        keys.setdefault(fields[0], set()).add((fields[1], fields[2]))
    return {host: frozenset(found) for host, found in keys.items()}


def render(cluster: str, keys: dict[str, KeySet]) -> str:
    lines = [
        f"# ssh host keys of cluster {cluster}'s on-prem hosts and jump hosts, by inventory name.",
        f"# Written by `{trust_command(cluster)}`; review and commit changes like the cluster file.",
        "# corral's ssh checks every host against this file only (StrictHostKeyChecking=yes).",
    ]
    for host in sorted(keys):
        lines += [f"{host} {key_type} {key}" for key_type, key in sorted(keys[host])]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ scanning


@dataclass(frozen=True)
class Target:
    """One host to scan: what the file calls it, where it answers, and how to reach it."""

    name: str
    address: str
    port: int = 22
    jump: JumpHost | None = None
    # The hosts' login, which the jump host's login defaults to.
    user: str | None = None
    private_key_file: str | None = None


def targets(cluster: Cluster, hosts: Iterable[str] | None = None, site: str | None = None) -> list[Target]:
    """The on-prem hosts to scan: all, or those named, or a site's."""
    wanted = set(hosts) if hosts is not None else None
    found: list[Target] = []
    for pool in cluster.onprem_pools:
        if site is not None and pool.site != site:
            continue
        ssh = cluster.ssh_for(pool)
        found += [Target(name, pool.host_addresses.get(name, name), ssh.port or 22, ssh.jump_host, ssh.user,
                         ssh.private_key_file)
                  for name in pool.host_names if wanted is None or name in wanted]
    return found


def jump_targets(found: list[Target]) -> list[Target]:
    """The jump hosts `found` are reached through, scanned directly, named as the cluster file writes them."""
    jumps = {t.jump.host: Target(t.jump.host, t.jump.host, t.jump.port) for t in found if t.jump is not None}
    return [jumps[name] for name in sorted(jumps)]


def _parse_scan(output: str, by_address: dict[str, list[str]], port: int) -> dict[str, set]:
    """ssh-keyscan's lines (`HOST KEYTYPE KEY`, HOST `[addr]:port` off port 22) by target name."""
    keys: dict[str, set] = {}
    for line in output.splitlines():
        fields = line.split()
        if len(fields) != 3 or line.startswith("#") or not _valid_key(fields[1], fields[2]):
            continue
        host = fields[0]
        if port != 22 and host.startswith("[") and host.endswith(f"]:{port}"):
            host = host[1:-len(f"]:{port}")]
        for name in by_address.get(host, []):
            keys.setdefault(name, set()).add((fields[1], fields[2]))
    return keys


def jump_login(jump: JumpHost, user: str | None, private_key_file: str | None, known_hosts: Path | None) -> list[str]:
    """ssh to a jump host (append the command), the jump host itself checked
    against `known_hosts` under its own name (or ssh's own files when None)."""
    argv = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes"]
    if known_hosts is not None:
        argv += ["-o", f"UserKnownHostsFile={ssh_path(known_hosts)}"]
    argv += ["-o", f"HostKeyAlias={jump.host}", "-p", str(jump.port)]
    if private_key_file:
        # `~` as the join's own connection reads it: ansible-core's ssh plugin expands IdentityFile
        # with os.path.expanduser ($HOME; plugins/connection/ssh.py), while ssh(1) would take the
        # passwd entry's home (ssh.c: tilde_expand_filename): another key whenever $HOME is set
        # elsewhere, so the jump host and the host would be reached with different keys.
        argv += ["-i", os.path.expanduser(private_key_file), "-o", "IdentitiesOnly=yes"]
    if jump.user or user:
        argv += ["-l", jump.user or user]
    return argv + [jump.host]


def ssh_path(path: Path) -> str:
    """A path for an ssh option that expands %-tokens (UserKnownHostsFile: ssh_config(5),
    TOKENS), where a literal '%' is written '%%'."""
    return str(path).replace("%", "%%")


def scan(found: list[Target], known_hosts: Path, jump_keys: dict[str, KeySet] | None = None,
         run: Runner = subprocess.run) -> dict[str, KeySet]:
    """Each target's keys as it presents them now (targets that did not answer are left out).

    Targets behind a jump host are scanned from the jump host (ssh-keyscan
    cannot go through one), over an ssh connection that checks the jump
    host's key: against `jump_keys` when given (a first `trust` has only just
    scanned it), else against the known hosts file.
    """
    keys: dict[str, set] = {}
    groups: dict[tuple, list[Target]] = {}
    for target in found:
        jump = target.jump
        login = (jump.host, jump.user, jump.port, target.user, target.private_key_file) if jump else None
        groups.setdefault((login, target.port), []).append(target)
    for (login, port), members in groups.items():
        by_address: dict[str, list[str]] = {}
        for target in members:
            by_address.setdefault(target.address, []).append(target.name)
        keyscan = ["ssh-keyscan", "-T", str(SCAN_TIMEOUT), "-p", str(port), "-f", "-"]
        stdin = "".join(f"{address}\n" for address in by_address)
        if login is None:
            result = _run(run, keyscan, stdin, timeout=60 + len(by_address))
        else:
            first = members[0]   # the group shares its jump host and login
            jump = first.jump
            with _jump_known_hosts(known_hosts, jump, jump_keys) as checked_against:
                argv = jump_login(jump, first.user, first.private_key_file, checked_against)
                result = _run(run, [*argv, shlex.join(keyscan)], stdin, timeout=60 + len(by_address))
            if result.returncode == 255 and not result.stdout.strip():
                raise KnownHostsError(
                    f"cannot reach jump host {jump.host} (its key checked against {known_hosts}): "
                    f"{result.stderr.strip()[:300]}")
        for name, found_keys in _parse_scan(result.stdout, by_address, port).items():
            keys.setdefault(name, set()).update(found_keys)
    return {name: frozenset(found_keys) for name, found_keys in keys.items()}


class _jump_known_hosts:
    """The file the jump login checks the jump host against: the known hosts
    file, or a private temporary one holding keys `trust` has just scanned."""

    def __init__(self, known_hosts: Path, jump: JumpHost, jump_keys: dict[str, KeySet] | None):
        self.known_hosts, self.jump, self.jump_keys = known_hosts, jump, jump_keys
        self.folder = None

    def __enter__(self) -> Path:
        if self.jump_keys is None:
            return self.known_hosts
        import tempfile

        self.folder = tempfile.TemporaryDirectory(prefix="corral-jump-keys-")
        path = Path(self.folder.name) / "known_hosts"
        name = self.jump.host
        path.write_text(render("-", {name: self.jump_keys.get(name, frozenset())}))
        return path

    def __exit__(self, *exc) -> None:
        if self.folder is not None:
            self.folder.cleanup()


def _run(run: Runner, argv: list[str], stdin: str, timeout: float) -> subprocess.CompletedProcess:
    try:
        return run(argv, input=stdin, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise KnownHostsError(f"{argv[0]} is not installed (OpenSSH's client tools: apt install openssh-client)") \
            from None
    except subprocess.TimeoutExpired:
        raise KnownHostsError(f"{argv[0]} did not finish within {timeout:.0f} s") from None


# ------------------------------------------------------------------ trust and verify


def conflicts(recorded: KeySet, presented: KeySet) -> bool:
    """Whether ssh would refuse the host: a recorded key type now has another key,
    or the host presents keys and none of its types is recorded."""
    if not presented:
        return False
    recorded_types = dict(recorded)
    if not recorded_types.keys() & dict(presented).keys():
        return True
    return any(recorded_types.get(key_type, key) != key for key_type, key in presented)


def describe_change(name: str, recorded: KeySet, presented: KeySet) -> str:
    old = ", ".join(f"{t} {fingerprint(k)}" for t, k in sorted(recorded)) or "none"
    new = ", ".join(f"{t} {fingerprint(k)}" for t, k in sorted(presented)) or "none"
    return f"{name}: recorded {old}; presents {new}"


@dataclass
class TrustResult:
    path: Path
    added: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    # Host -> what changed: keys kept as they were until --replace.
    changed: dict[str, str] = field(default_factory=dict)
    not_scanned: list[str] = field(default_factory=list)
    written: bool = False


def trust(cluster: Cluster, site: str | None = None, replace: Iterable[str] = (),
          run: Runner = subprocess.run) -> TrustResult:
    """Scan the hosts and record keys the file lacks; report (never overwrite) changed ones."""
    path = _file_of(cluster)
    replace = set(replace)
    hosts = targets(cluster, site=site)
    jumps = jump_targets(hosts)
    names = {t.name for t in hosts + jumps}
    unknown = sorted(replace - names)
    if unknown:
        raise KnownHostsError(f"--replace {', '.join(unknown)}: not a host or jump host"
                              f"{' of site ' + site if site else ''} of cluster {cluster.name}")
    recorded = read(path)
    # Jump hosts first, directly: the hosts behind them are scanned through them.
    jump_keys = scan(jumps, path, run=run) if jumps else {}
    for name, keys in jump_keys.items():
        if name in recorded and conflicts(recorded[name], keys) and name not in replace:
            raise KnownHostsError(
                f"jump host {describe_change(name, recorded[name], keys)}: nothing is scanned through a jump host "
                f"whose key changed; check it out of band, then `{trust_command(cluster.name, [name])}`")
    trusted_jumps = {name: (keys if name in replace or name not in recorded else recorded[name])
                     for name, keys in jump_keys.items()}
    presented = {**jump_keys, **scan(hosts, path, jump_keys=trusted_jumps, run=run)}
    result = TrustResult(path)
    updated = dict(recorded)
    for name in sorted(names):
        keys = presented.get(name)
        if not keys:
            result.not_scanned.append(name)
        elif name not in recorded:
            updated[name] = keys
            result.added.append(name)
        elif keys <= recorded[name]:
            result.unchanged.append(name)
        elif name in replace:
            updated[name] = keys
            result.replaced.append(name)
        else:
            result.changed[name] = describe_change(name, recorded[name], keys)
    text = render(cluster.name, updated)
    if updated != recorded or not path.exists():
        write_atomic(path, text)
        result.written = True
    return result


def _file_of(cluster: Cluster) -> Path:
    path = cluster.known_hosts_file
    if path is None:
        raise KnownHostsError(f"cluster {cluster.name} was not read from a file: it has no known hosts file")
    return path


def verify(cluster: Cluster, hosts: list[str], run: Runner = subprocess.run) -> None:
    """Raise KnownHostsError unless every host and its jump host have recorded keys and none presents a changed one.

    Run before a join touches any host: ssh itself refuses a changed key
    (StrictHostKeyChecking=yes), but host by host, in the middle of a run.
    Hosts that do not answer now are left to the join (it reports them
    unreachable).
    """
    path = _file_of(cluster)
    command = trust_command(cluster.name)
    if not path.exists():
        raise KnownHostsError(
            f"no recorded ssh host keys for cluster {cluster.name}: {path} does not exist; run `{command}`, "
            "review the keys it records and commit the file")
    recorded = read(path)
    hosts_found = targets(cluster, hosts)
    jumps = jump_targets(hosts_found)
    missing = [t.name for t in jumps + hosts_found if t.name not in recorded]
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise KnownHostsError(f"no recorded ssh host key for {shown} in {path}: run `{command}`, review the "
                              "keys it adds and commit the file")
    # Jump hosts first: the hosts behind them are scanned through them.
    for group in (jumps, hosts_found):
        presented = scan(group, path, run=run) if group else {}
        changed = [t.name for t in group if conflicts(recorded[t.name], presented.get(t.name, frozenset()))]
        if changed:
            details = "; ".join(describe_change(name, recorded[name], presented[name]) for name in changed[:5])
            raise KnownHostsError(
                f"ssh host key changed for {', '.join(changed[:5])}{' and more' if len(changed) > 5 else ''} "
                f"(the keys recorded in {path} differ from what the host presents: {details}). Nothing was run. "
                "A reinstalled host has new keys; anything else answering at its address could be an attacker. "
                f"Check the host out of band, then `{trust_command(cluster.name, changed)}` and commit the file")
