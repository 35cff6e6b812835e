"""`corral join`: run the join playbook on a cluster's on-prem nodes.

ansible-runner drives `ansible/playbooks/join.yml` with the inventory built
from the cluster file. The join material: the API endpoint and the CA hash
come from the cluster's Pulumi stack outputs, or from a JSON file for
air-gapped runs; the bootstrap token is created fresh for every run
(`fresh_bootstrap_token`: a `bootstrap.kubernetes.io/token` Secret that
expires after `--token-ttl`, deleted again when the run ends), with a cluster
credential from `--kubeconfig`, `$KUBECONFIG` or the stack's admin
kubeconfig (`ClusterAccess`). The token is a secret: it goes to kubectl on
stdin, to Ansible only in a 0600 file outside the runner's private data dir,
passed as `-e @file`, deleted after the run; the roles mark every task that
handles it `no_log`, and the run's artifacts are scanned for it before corral
returns.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from corral.model import Cluster

from . import inventory as inv

PLAYBOOK = "playbooks/join.yml"
# Stack output keys (see corral/infra/outputs.py) -> the roles' variables.
# No bootstrap token among them: every run creates its own (see below).
OUTPUT_KEYS = {
    "apiEndpoint": "corral_join_api_endpoint",
    "caCertHash": "corral_join_ca_cert_hashes",
}
# The stack output holding a credential that may create the token Secret.
CREDENTIAL_OUTPUT = "adminKubeconfig"


class JoinError(Exception):
    """A join that cannot start; the message says what to do."""


def default_runs_dir(cluster: str) -> Path:
    """Per-user artifacts folder (0700 all the way down, unlike /tmp)."""
    base = Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local" / "state"))
    return base / "corral" / "runs" / cluster


def ansible_dir() -> Path:
    """The repository's `ansible/` folder (env CORRAL_ANSIBLE_DIR overrides)."""
    override = os.environ.get("CORRAL_ANSIBLE_DIR")
    candidates = [Path(override)] if override else [
        Path(__file__).resolve().parents[2] / "ansible",
        Path.cwd() / "ansible",
    ]
    for candidate in candidates:
        if (candidate / PLAYBOOK).is_file():
            return candidate
    raise JoinError(f"cannot find {PLAYBOOK} under {', '.join(map(str, candidates))} (set CORRAL_ANSIBLE_DIR)")


# What to do instead of reading the stack, by what the command reads from it:
# only `corral join` has --outputs; every command that needs a cluster
# credential has --kubeconfig.
INSTEAD_OF_STACK_OUTPUTS = ("pass --outputs FILE (a JSON object with the stack outputs apiEndpoint and "
                            "caCertHash) and --kubeconfig FILE")
INSTEAD_OF_STACK_CREDENTIAL = "pass --kubeconfig FILE or set KUBECONFIG (a credential for the cluster)"


def _pulumi_or_error(instead: str) -> None:
    if shutil.which("pulumi") is None:
        raise JoinError(f"the pulumi CLI is not installed: install it, or {instead}")


def stack_output(cluster: str, key: str, secret: bool = False,
                  instead: str = INSTEAD_OF_STACK_OUTPUTS) -> Any:
    """One stack output, read into memory (never printed, never a file)."""
    _pulumi_or_error(instead)
    result = subprocess.run(
        ["pulumi", "stack", "output", key, "--json", *(["--show-secrets"] if secret else []), "-s", cluster],
        capture_output=True, text=True,
    )
    if result.returncode != 0:
        raise JoinError(f"pulumi stack output {key} -s {cluster} failed: {result.stderr.strip()}")
    try:
        return json.loads(result.stdout)
    except json.JSONDecodeError:
        raise JoinError(f"pulumi stack output {key} -s {cluster} did not print JSON") from None


def read_outputs_file(outputs_file: Path) -> Any:
    """The stack outputs saved as JSON (`pulumi stack output --json > FILE`), as parsed; errors name file:line:column."""
    try:
        return json.loads(Path(outputs_file).read_text(encoding="utf-8"))
    except OSError as err:
        raise JoinError(f"cannot read {outputs_file}: {err.strerror}") from None
    except UnicodeDecodeError:
        raise JoinError(f"{outputs_file}: not UTF-8 text") from None
    except json.JSONDecodeError as err:
        raise JoinError(f"{outputs_file}:{err.lineno}:{err.colno}: not JSON: {err.msg}") from None


def join_material(cluster: str, outputs_file: Path | None) -> dict[str, Any]:
    """The join variables but the token, from `--outputs FILE` or `pulumi stack output`.

    Only the outputs a join needs are read, one by one, so the admin
    kubeconfig and VPN keys never pass through here; a `bootstrapToken` in
    the file is ignored (every run creates its own).
    """
    if outputs_file is not None:
        outputs, source = read_outputs_file(outputs_file), str(outputs_file)
    else:
        _pulumi_or_error(INSTEAD_OF_STACK_OUTPUTS)
        outputs, source = {key: stack_output(cluster, key) for key in OUTPUT_KEYS}, f"stack {cluster}"
    if not isinstance(outputs, dict):
        raise JoinError(f"{source}: expected a JSON object of stack outputs")
    missing = [key for key in OUTPUT_KEYS if not outputs.get(key)]
    if missing:
        raise JoinError(f"{source}: missing stack output(s) {', '.join(missing)}")
    if not isinstance(outputs["apiEndpoint"], str):
        raise JoinError(f"{source}: apiEndpoint must be a string")
    hashes = outputs["caCertHash"]
    return {
        "corral_join_api_endpoint": outputs["apiEndpoint"],
        "corral_join_ca_cert_hashes": hashes if isinstance(hashes, list) else [hashes],
    }


# ------------------------------------------------------------ bootstrap token
# kubeadm's token format and the Secret the API server's bootstrap
# authenticator reads (kubernetes.io/docs/reference/access-authn-authz/
# bootstrap-tokens/): kube-system/bootstrap-token-<id>.
TOKEN_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"
TOKEN_NAMESPACE = "kube-system"
# The group a pool's join token authenticates in (auth-extra-groups), one per
# pool and never kubeadm's default group (system:bootstrappers:kubeadm:
# default-node-token), which kubeadm's `kubeadm:node-autoapprove-bootstrap`
# binding lets kube-controller-manager approve for ANY node name
# (cmd/kubeadm/app/phases/bootstraptoken/node/tlsbootstrap.go). Requests from
# these groups are approved only by corral-node-approver, only for the pool's
# own machines (corral/certs/node_approver.py); corral-node-approver's add-on
# binds them what `kubeadm join` needs. Extra groups must match
# `system:bootstrappers:[a-z0-9:-]{0,255}[a-z0-9]` (k8s.io/cluster-bootstrap
# token/api/types.go BootstrapGroupPattern): pool names are DNS labels of at
# most 40 characters, so every pool's group does.
POOL_TOKEN_GROUP_PREFIX = "system:bootstrappers:corral:pool:"


def pool_token_group(pool: str) -> str:
    return f"{POOL_TOKEN_GROUP_PREFIX}{pool}"


def onprem_token_groups(cluster: Cluster, hosts: list[str]) -> tuple[str, ...]:
    """The groups of one `corral join` run's token: the pools of the hosts it joins."""
    owners = inv.host_pool(cluster)
    return tuple(sorted({pool_token_group(owners[host]) for host in hosts if host in owners}))


DEFAULT_TOKEN_TTL = "4h"
MIN_TOKEN_TTL, MAX_TOKEN_TTL = timedelta(minutes=5), timedelta(hours=24)
# `--check` joins nothing, so it creates no token; the roles only check the format.
CHECK_MODE_TOKEN = "check0.0000000000000000"
_TTL = re.compile(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?\Z")


def parse_ttl(text: str) -> timedelta:
    """`4h`, `90m`, `2h30m`, `3600s`: how long a join's token stays valid."""
    match = _TTL.match(text)
    if not text or match is None:
        raise JoinError(f"--token-ttl {text!r}: expected a duration like 4h, 90m or 2h30m")
    hours, minutes, seconds = (int(g or 0) for g in match.groups())
    ttl = timedelta(hours=hours, minutes=minutes, seconds=seconds)
    if not MIN_TOKEN_TTL <= ttl <= MAX_TOKEN_TTL:
        raise JoinError(f"--token-ttl {text}: must be between 5m and 24h (the token must outlive the run, "
                        "and no longer)")
    return ttl


@dataclass(frozen=True)
class BootstrapToken:
    token_id: str
    secret: str = field(repr=False)
    expiration: datetime

    @property
    def value(self) -> str:
        return f"{self.token_id}.{self.secret}"

    @property
    def name(self) -> str:
        return f"bootstrap-token-{self.token_id}"

    def manifest(self, description: str, groups: tuple[str, ...]) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": self.name, "namespace": TOKEN_NAMESPACE,
                         "labels": {"app.kubernetes.io/managed-by": "corral"}},
            "type": "bootstrap.kubernetes.io/token",
            "stringData": {
                "description": description,
                "token-id": self.token_id,
                "token-secret": self.secret,
                "expiration": self.expiration.strftime("%Y-%m-%dT%H:%M:%SZ"),
                "usage-bootstrap-authentication": "true",
                "usage-bootstrap-signing": "true",
                "auth-extra-groups": ",".join(groups),
            },
        }


def new_bootstrap_token(ttl: timedelta, now: datetime | None = None) -> BootstrapToken:
    """A random token (kubeadm's [a-z0-9]{6}.[a-z0-9]{16}) expiring `ttl` from now."""
    now = (now or datetime.now(timezone.utc)).replace(microsecond=0)
    pick = lambda n: "".join(secrets.choice(TOKEN_ALPHABET) for _ in range(n))  # noqa: E731
    return BootstrapToken(pick(6), pick(16), now + ttl)


class ClusterAccess:
    """kubectl with the credential that creates the join's token.

    The credential, first found: `--kubeconfig FILE`; `$KUBECONFIG` (as
    kubectl reads it); the stack's admin kubeconfig, when the join reads the
    stack (no `--outputs`). The stack's is kept in memory and written, 0600 in
    a private temporary folder, only for each kubectl call.
    """

    def __init__(self, kubeconfig: Path | None = None, kubeconfig_text: str | None = None):
        self.kubeconfig, self.kubeconfig_text = kubeconfig, kubeconfig_text

    @classmethod
    def resolve(cls, cluster: str, kubeconfig: Path | None, from_stack: bool) -> ClusterAccess:
        if kubeconfig is not None:
            if not Path(kubeconfig).is_file():
                raise JoinError(f"--kubeconfig {kubeconfig}: no such file")
            return cls(kubeconfig=Path(kubeconfig))
        if os.environ.get("KUBECONFIG"):
            return cls()
        if from_stack:
            text = stack_output(cluster, CREDENTIAL_OUTPUT, secret=True, instead=INSTEAD_OF_STACK_CREDENTIAL)
            if not isinstance(text, str) or not text.strip():
                raise JoinError(f"stack {cluster}: stack output {CREDENTIAL_OUTPUT} is missing or empty")
            return cls(kubeconfig_text=text)
        raise JoinError(
            "creating the join's bootstrap token needs a credential for the cluster that may create "
            "Secrets in kube-system: pass --kubeconfig FILE or set KUBECONFIG "
            "(or leave out --outputs to use the stack's)"
        )

    def kubectl(self, args: list[str], stdin: str = "") -> subprocess.CompletedProcess:
        exe = shutil.which("kubectl")
        if exe is None:
            raise JoinError("kubectl is not installed: it creates the join's bootstrap token")
        if self.kubeconfig_text is None:
            prefix = [exe] + (["--kubeconfig", str(self.kubeconfig)] if self.kubeconfig else [])
            return subprocess.run(prefix + args, input=stdin, capture_output=True, text=True, timeout=120)
        with tempfile.TemporaryDirectory(prefix="corral-kubeconfig-") as folder:
            path = Path(folder) / "kubeconfig"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(self.kubeconfig_text)
            return subprocess.run([exe, "--kubeconfig", str(path), *args], input=stdin,
                                  capture_output=True, text=True, timeout=120)


def _masked(text: str, token: BootstrapToken) -> str:
    return text.strip().replace(token.secret, "<token-secret>")


@contextmanager
def fresh_bootstrap_token(
    access: ClusterAccess, ttl: timedelta, description: str,
    on_warning: Callable[[str], None] = lambda message: None,
    groups: tuple[str, ...] = (),
) -> Iterator[BootstrapToken]:
    """A new bootstrap token for one join run, deleted when the run ends.

    `groups`: the run's pools' token groups (`onprem_token_groups`); a token
    without one could join nothing, so none is refused.

    Created with `kubectl create` (not `apply`, whose last-applied annotation
    would keep the secret in plain text), from stdin (never argv). Should the
    deletion fail, the token still expires at its `expiration`, and the
    API server's token cleaner removes it.
    """
    if not groups:
        raise JoinError("the join's bootstrap token needs the token group of at least one on-prem pool")
    token = new_bootstrap_token(ttl)
    result = access.kubectl(["create", "-f", "-", "-o", "name"], json.dumps(token.manifest(description, groups)))
    if result.returncode != 0:
        raise JoinError(f"could not create the join's bootstrap token in {TOKEN_NAMESPACE}: "
                        f"{_masked(result.stderr or result.stdout, token)}")
    try:
        yield token
    finally:
        result = access.kubectl(["delete", "secret", token.name, "--namespace", TOKEN_NAMESPACE,
                                 "--ignore-not-found"])
        if result.returncode != 0:
            on_warning(f"could not delete bootstrap token {token.token_id} "
                       f"({_masked(result.stderr, token)}); it expires at "
                       f"{token.expiration:%Y-%m-%dT%H:%M:%SZ}")


_SHARD = re.compile(r"([1-9][0-9]*)/([1-9][0-9]*)\Z")


def shard_hosts(hosts: list[str], shard: str) -> list[str]:
    """The hosts of shard `K/N`: fan a fleet out over N controllers.

    A host's shard is a hash of its name alone, so every controller computes
    the same split without talking to the others, and adding hosts to the
    cluster file moves no existing host to another shard.
    """
    match = _SHARD.match(shard)
    if match is None or int(match.group(1)) > int(match.group(2)):
        raise JoinError(f"--shard {shard!r}: expected K/N with 1 <= K <= N, e.g. 3/8")
    index, count = int(match.group(1)) - 1, int(match.group(2))
    return [h for h in hosts if int.from_bytes(hashlib.sha256(h.encode()).digest()[:8], "big") % count == index]


def select_hosts(cluster: Cluster, pool: str | None, limit: list[str]) -> list[str]:
    """The hosts a run touches: a pool's, or named ones, or all on-prem hosts."""
    owners = inv.host_pool(cluster)
    if pool is not None:
        if not any(p.name == pool for p in cluster.onprem_pools):
            known = ", ".join(p.name for p in cluster.onprem_pools) or "none"
            raise JoinError(f"cluster {cluster.name} has no on-prem pool '{pool}' (on-prem pools: {known})")
        hosts = [h for h, p in owners.items() if p == pool]
    else:
        hosts = list(owners)
    if limit:
        unknown = [h for h in limit if h not in owners]
        if unknown:
            raise JoinError(f"not an on-prem host of {cluster.name}: {', '.join(unknown)}")
        outside = [h for h in limit if h not in hosts]
        if outside:
            raise JoinError(f"not in pool {pool}: {', '.join(outside)}")
        hosts = [h for h in hosts if h in set(limit)]
    if not hosts:
        raise JoinError(f"cluster {cluster.name} has no on-prem hosts to join")
    return hosts


@dataclass
class HostResult:
    host: str
    ok: int = 0
    changed: int = 0
    failed: int = 0
    skipped: int = 0
    unreachable: bool = False
    task: str = ""
    message: str = ""

    @property
    def status(self) -> str:
        if self.unreachable:
            return "unreachable"
        if self.failed:
            return "failed"
        if not self.ok:
            # Selected but no task ran on it: the run cannot vouch for it.
            return "not run"
        return "changed" if self.changed else "ok"


@dataclass
class JoinReport:
    hosts: dict[str, HostResult] = field(default_factory=dict)
    rc: int = 0
    artifacts: Path | None = None

    @property
    def succeeded(self) -> bool:
        return self.rc == 0 and all(r.status in ("ok", "changed") for r in self.hosts.values())


# What ssh prints when a host's key is not the recorded one (its first line is
# a row of '@'); the report says so in words instead.
HOST_KEY_FAILURES = ("REMOTE HOST IDENTIFICATION HAS CHANGED", "Host key verification failed")
HOST_KEY_MESSAGE = ("ssh host key verification failed: the host presents a key that is not the one in the "
                    "cluster's known hosts file (check the host, then `corral hosts trust CLUSTER --replace HOST`)")


def _message(res: dict[str, Any]) -> str:
    for key in ("msg", "stderr", "reason"):
        value = res.get(key)
        if value:
            if any(marker in str(value) for marker in HOST_KEY_FAILURES):
                return HOST_KEY_MESSAGE
            return str(value).strip().splitlines()[0][:300] if isinstance(value, str) else str(value)[:300]
    return ""


class EventTracker:
    """Folds ansible-runner events into per-host results as they arrive."""

    def __init__(self, hosts: list[str], on_update: Callable[[JoinReport], None] | None = None,
                 on_event: Callable[[dict[str, Any]], None] | None = None):
        self.report = JoinReport(hosts={h: HostResult(h) for h in hosts})
        self.on_update, self.on_event = on_update, on_event

    def __call__(self, event: dict[str, Any]) -> bool:
        if self.on_event is not None:
            self.on_event(event)
        kind = event.get("event", "")
        data = event.get("event_data", {}) or {}
        host = data.get("host")
        result = self.report.hosts.get(host) if host else None
        if result is not None:
            task = data.get("task", "")
            res = data.get("res", {}) or {}
            if kind == "runner_on_start":
                result.task = task
            elif kind == "runner_on_ok":
                result.ok += 1
                result.changed += bool(res.get("changed"))
            elif kind == "runner_on_skipped":
                result.skipped += 1
            elif kind == "runner_on_failed" and not data.get("ignore_errors"):
                result.failed += 1
                result.task, result.message = task, _message(res)
            elif kind == "runner_on_unreachable":
                result.unreachable = True
                result.task, result.message = task, _message(res)
        if kind == "playbook_on_stats":
            self._apply_stats(data)
        if self.on_update is not None:
            self.on_update(self.report)
        return True  # keep the event in the artifacts (secrets are no_log there)

    def _apply_stats(self, stats: dict[str, Any]) -> None:
        """The play recap is authoritative for the counts."""
        for host, result in self.report.hosts.items():
            result.ok = stats.get("ok", {}).get(host, result.ok)
            result.changed = stats.get("changed", {}).get(host, result.changed)
            result.failed = stats.get("failures", {}).get(host, result.failed)
            result.skipped = stats.get("skipped", {}).get(host, result.skipped)
            result.unreachable = result.unreachable or bool(stats.get("dark", {}).get(host))


def _leaked(artifacts: Path, secret: str) -> list[Path]:
    leaks = []
    for path in artifacts.rglob("*"):
        if path.is_file():
            try:
                if secret in path.read_text(errors="ignore"):
                    leaks.append(path)
            except OSError:
                continue
    return leaks


def prepare_runs_dir(cluster: Cluster, runs_dir: Path | None) -> Path:
    """The artifacts folder, created owner-only (the default is per user)."""
    runs_dir = Path(runs_dir or default_runs_dir(cluster.name))
    missing = [runs_dir, *(p for p in runs_dir.parents if not p.exists())]
    for folder in reversed(missing):
        folder.mkdir(exist_ok=True, mode=0o700)  # every folder corral creates: owner only
    return runs_dir


def run_join(
    cluster: Cluster,
    material: dict[str, Any],
    hosts: list[str],
    check: bool = False,
    runs_dir: Path | None = None,
    on_update: Callable[[JoinReport], None] | None = None,
    forks: int = 50,
    extra_vars: list[Path] = (),
    on_event: Callable[[dict[str, Any]], None] | None = None,
) -> JoinReport:
    """Run the join playbook on `hosts`; the per-host report.

    `extra_vars` are YAML/JSON files of site-specific overrides (repository
    URLs, `corral_reboot_batch`, ...), passed as `-e @FILE` after the cluster's
    own variables, so they win. `on_event` sees every ansible-runner event
    (corral.nodes.converge learns from them what the roles manage).
    """
    playbooks = ansible_dir()
    runs_dir = prepare_runs_dir(cluster, runs_dir)
    tracker = EventTracker(hosts, on_update, on_event)
    try:
        runner = _run_playbook(cluster, material, hosts, check, runs_dir, tracker, forks, extra_vars, playbooks)
    finally:
        # Scan even when the run was interrupted: artifacts outlive the run.
        # The secret half alone is the secret (the id is public); `--check`'s
        # placeholder is no secret.
        token = str(material["corral_join_token"])
        leaks = _leaked(runs_dir, token.rsplit(".", 1)[-1]) if token != CHECK_MODE_TOKEN else []
        for path in leaks:
            path.unlink()
    if leaks:
        raise JoinError(
            "the bootstrap token appeared in run artifacts (removed): "
            + ", ".join(str(p) for p in leaks)
            + "; a task that handles it is missing no_log"
        )
    report = tracker.report
    report.rc = runner.rc
    report.artifacts = Path(runner.config.artifact_dir)
    return report


def _run_playbook(
    cluster: Cluster, material: dict[str, Any], hosts: list[str], check: bool, runs_dir: Path,
    tracker: EventTracker, forks: int, extra_vars: list[Path], playbooks: Path, playbook: str = PLAYBOOK,
):
    """One ansible-runner run of `playbook` (the join's by default; `corral upgrade`
    runs its own); the run's variables live only in a 0600 temp file."""
    import ansible_runner  # heavy: only when a join really runs

    with tempfile.TemporaryDirectory(prefix="corral-join-secret-") as secret_dir:
        secret_file = Path(secret_dir) / "join.json"
        fd = os.open(secret_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(material, handle)
        cmdline = " ".join(
            [f"-e @{shlex.quote(str(Path(f).resolve()))}" for f in (*extra_vars, secret_file)]
            + (["--check", "--diff"] if check else [])
        )
        runner = ansible_runner.run(
            private_data_dir=str(runs_dir),
            playbook=str(playbooks / playbook),
            # JSON with Ansible's unsafe mark on every value: never templated.
            inventory=inv.to_ansible_json(inv.as_yaml_inventory(inv.build(cluster))),
            # No limit when every on-prem host runs: thousands of names on a
            # command line buy nothing.
            limit=None if len(hosts) == len(inv.host_pool(cluster)) else ",".join(hosts),
            cmdline=cmdline,
            forks=forks,
            envvars={"ANSIBLE_CONFIG": str(playbooks / "ansible.cfg")},
            event_handler=tracker,
            quiet=True,
            suppress_env_files=True,
            rotate_artifacts=10,
        )
        return runner
