"""`corral join`: run the join playbook on a cluster's on-prem nodes.

ansible-runner drives `ansible/playbooks/join.yml` with the inventory built
from the cluster file. The join material (API endpoint, bootstrap token, CA
hash) comes from the cluster's Pulumi stack outputs, or from a JSON file for
air-gapped runs. The token is a secret: it travels only in a 0600 file
outside the runner's private data dir, passed as `-e @file`, deleted after
the run; the roles mark every task that handles it `no_log`, and the run's
artifacts are scanned for it before corral returns.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corral.model import Cluster

from . import inventory as inv

PLAYBOOK = "playbooks/join.yml"
# Stack output keys (see corral/infra/outputs.py) -> the roles' variables.
OUTPUT_KEYS = {
    "apiEndpoint": "corral_join_api_endpoint",
    "bootstrapToken": "corral_join_token",
    "caCertHash": "corral_join_ca_cert_hashes",
}


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


def join_material(cluster: str, outputs_file: Path | None) -> dict[str, Any]:
    """The join variables, from `--outputs FILE` or `pulumi stack output`.

    From Pulumi only the three outputs a join needs are read, one by one, so
    the admin kubeconfig and VPN keys never pass through corral.
    """
    if outputs_file is not None:
        try:
            outputs = json.loads(Path(outputs_file).read_text(encoding="utf-8"))
        except OSError as err:
            raise JoinError(f"cannot read {outputs_file}: {err.strerror}") from None
        except UnicodeDecodeError:
            raise JoinError(f"{outputs_file}: not UTF-8 text") from None
        except json.JSONDecodeError as err:
            raise JoinError(f"{outputs_file}:{err.lineno}:{err.colno}: not JSON: {err.msg}") from None
        source = str(outputs_file)
    else:
        if shutil.which("pulumi") is None:
            raise JoinError(
                "the pulumi CLI is not installed: install it, or pass --outputs FILE "
                "(the JSON of `pulumi stack output --json --show-secrets`)"
            )
        outputs, source = {}, f"stack {cluster}"
        for key in OUTPUT_KEYS:
            result = subprocess.run(
                ["pulumi", "stack", "output", key, "--json", "--show-secrets", "-s", cluster],
                capture_output=True, text=True,
            )
            if result.returncode != 0:
                raise JoinError(f"pulumi stack output {key} -s {cluster} failed: {result.stderr.strip()}")
            try:
                outputs[key] = json.loads(result.stdout)
            except json.JSONDecodeError:
                raise JoinError(f"pulumi stack output {key} -s {cluster} did not print JSON") from None
    if not isinstance(outputs, dict):
        raise JoinError(f"{source}: expected a JSON object of stack outputs")
    missing = [key for key in OUTPUT_KEYS if not outputs.get(key)]
    if missing:
        raise JoinError(f"{source}: missing stack output(s) {', '.join(missing)}")
    if not isinstance(outputs["bootstrapToken"], str) or not isinstance(outputs["apiEndpoint"], str):
        raise JoinError(f"{source}: apiEndpoint and bootstrapToken must be strings")
    hashes = outputs["caCertHash"]
    return {
        "corral_join_api_endpoint": outputs["apiEndpoint"],
        "corral_join_token": outputs["bootstrapToken"],
        "corral_join_ca_cert_hashes": hashes if isinstance(hashes, list) else [hashes],
    }


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


def _message(res: dict[str, Any]) -> str:
    for key in ("msg", "stderr", "reason"):
        value = res.get(key)
        if value:
            return str(value).strip().splitlines()[0][:300] if isinstance(value, str) else str(value)[:300]
    return ""


class EventTracker:
    """Folds ansible-runner events into per-host results as they arrive."""

    def __init__(self, hosts: list[str], on_update: Callable[[JoinReport], None] | None = None):
        self.report = JoinReport(hosts={h: HostResult(h) for h in hosts})
        self.on_update = on_update

    def __call__(self, event: dict[str, Any]) -> bool:
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


def run_join(
    cluster: Cluster,
    material: dict[str, Any],
    hosts: list[str],
    check: bool = False,
    runs_dir: Path | None = None,
    on_update: Callable[[JoinReport], None] | None = None,
    forks: int = 50,
    extra_vars: list[Path] = (),
) -> JoinReport:
    """Run the join playbook on `hosts`; the per-host report.

    `extra_vars` are YAML/JSON files of site-specific overrides (repository
    URLs, `corral_reboot_batch`, ...), passed as `-e @FILE` after the cluster's
    own variables, so they win.
    """
    playbooks = ansible_dir()
    runs_dir = Path(runs_dir or default_runs_dir(cluster.name))
    missing = [runs_dir, *(p for p in runs_dir.parents if not p.exists())]
    for folder in reversed(missing):
        folder.mkdir(exist_ok=True, mode=0o700)  # every folder corral creates: owner only
    tracker = EventTracker(hosts, on_update)
    try:
        runner = _run_playbook(cluster, material, hosts, check, runs_dir, tracker, forks, extra_vars, playbooks)
    finally:
        # Scan even when the run was interrupted: artifacts outlive the run.
        leaks = _leaked(runs_dir, str(material["corral_join_token"]))
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
    tracker: EventTracker, forks: int, extra_vars: list[Path], playbooks: Path,
):
    """One ansible-runner run; the join material lives only in a 0600 temp file."""
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
            playbook=str(playbooks / PLAYBOOK),
            inventory=inv.as_yaml_inventory(inv.build(cluster)),
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
