"""Skip hosts that are already converged: a fleet re-run costs about a ping.

Running every role on every host to find that nothing changed costs ~120
remote Python starts per host. Instead, each host keeps a record of the
last converge that succeeded on it, under `STATE_DIR`:

    fingerprint        what was applied: the roles and the host's inputs
    files.sha256       the content of every file the roles wrote
    packages(.versions) the packages the roles installed, and their versions
    services.enabled / services.active   the units the roles enabled / started

Before a run, corral computes each host's desired fingerprint
(`desired_fingerprints`: the Ansible tree and the corral templates the roles
read, the host's inventory variables, the site overrides and the join
material without the token) and runs ONE `raw` command per host (no remote
Python: `check_script`), which compares the fingerprint and re-checks files,
package versions and units on the host. Only hosts whose fingerprint differs,
that drifted (someone edited a managed file, downgraded a package, stopped a
unit) or that have no record run the roles; `--force` runs them everywhere.
After a run, the hosts that succeeded get a new record (`record_script`),
written with the fingerprint last so that a half-written record never reads
as up to date. What the roles manage is learned from the run's own events
(`AppliedState.observe`: the files of template/copy/... tasks, the packages
of apt tasks, the units of systemd tasks), so a new task in a role is covered
without a list to keep in step. Tasks marked `no_log` hide their results and
are not covered (only the join's temporary configuration is).
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2

from corral.model import Cluster

from . import inventory as inv

STATE_DIR = "/var/lib/corral/converge"
TEMPLATES = Path(__file__).resolve().parents[1] / "templates" / "converge"
CORRAL_TEMPLATES = Path(__file__).resolve().parents[1] / "templates"
# The check prints one line starting with this; the rest says why.
VERDICT_PREFIX = "corral-converge:"
UP_TO_DATE = "up to date"
# Variables that change every run and do not change what a host should be.
# (the bootstrap token, and the path of the drain credential `corral join`
# makes for the run: corral/upgrade/join_drain.py)
EPHEMERAL_VARS = frozenset({"corral_join_token", "corral_runner_kubeconfig"})
# Modules whose results name a file the roles manage (`dest` or `path`).
FILE_MODULES = frozenset({"template", "copy", "get_url", "replace", "lineinfile", "blockinfile", "ini_file"})
PACKAGE_MODULES = frozenset({"apt", "package"})
# The roles ask dpkg about the packages they want before installing any
# (roles/corral_common/tasks/packages.yml); after a successful run those are
# installed, also when no apt task ran because nothing was missing.
COMMAND_MODULES = frozenset({"command"})
_PACKAGE_NAME = re.compile(r"[a-z0-9][a-z0-9+.-]*")
SERVICE_MODULES = frozenset({"systemd_service", "systemd", "service"})
_TEMPLATE_DIR_REFERENCE = re.compile(r"corral/templates/([A-Za-z0-9_-]+)/")


@lru_cache(maxsize=1)
def _templates() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), undefined=jinja2.StrictUndefined,
                              keep_trailing_newline=True, autoescape=False)


# ------------------------------------------------------------ fingerprints
def _digest_files(digest: Any, root: Path, paths: Iterable[Path]) -> None:
    for path in sorted(paths):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(root)).encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")


def roles_digest(ansible_dir: Path) -> str:
    """The Ansible tree (roles, playbooks, ansible.cfg) and the corral templates it reads.

    The roles read some corral templates (the shared JoinConfiguration, the
    GPU preflight); the folders they name are found in the tree itself, so a
    new reference is covered, and an edit to a cloud-only template does not
    make every on-prem host converge again.
    """
    ansible_dir = Path(ansible_dir)
    digest = hashlib.sha256()
    # Documentation (role READMEs) changes nothing on a host: a docs edit
    # must not send the whole fleet through its roles again.
    files = [p for p in ansible_dir.rglob("*") if p.is_file() and p.suffix != ".md"]
    _digest_files(digest, ansible_dir, files)
    folders = sorted({m.group(1) for p in files if p.suffix in (".yml", ".yaml", ".j2", ".cfg")
                      for m in _TEMPLATE_DIR_REFERENCE.finditer(p.read_text(errors="ignore"))})
    for folder in folders:
        _digest_files(digest, CORRAL_TEMPLATES, (CORRAL_TEMPLATES / folder).rglob("*"))
    return digest.hexdigest()


def host_inputs(inventory: dict[str, Any], host: str) -> dict[str, Any]:
    """The host's inventory variables, as Ansible layers them (all < groups < host)."""
    layered: dict[str, Any] = {"all": inventory["all"].get("vars", {})}
    for group, body in sorted(inventory.items()):
        if group not in ("_meta", "all") and host in body.get("hosts", []):
            layered[group] = body.get("vars", {})
    # The name too: the roles use it (the node's name in its JoinConfiguration).
    layered["host"] = {"inventory_hostname": host, **inventory["_meta"]["hostvars"].get(host, {})}
    # How a host is reached (its address, ssh options naming the known hosts
    # file's path on this controller) is not what it should be: left out.
    return {layer: {key: value for key, value in values.items() if not key.startswith("ansible_")}
            for layer, values in layered.items()}


def desired_fingerprints(
    cluster: Cluster, hosts: list[str], material: dict[str, Any], extra_vars: Iterable[Path], ansible_dir: Path,
) -> dict[str, str]:
    """Host -> the fingerprint a converge with these inputs records on it."""
    inventory = inv.build(cluster)
    shared = hashlib.sha256()
    shared.update(roles_digest(ansible_dir).encode())
    for path in extra_vars:
        shared.update(b"\0extra-vars\0" + Path(path).read_bytes())
    stable = {k: v for k, v in material.items() if k not in EPHEMERAL_VARS}
    shared.update(b"\0material\0" + json.dumps(stable, sort_keys=True, default=str).encode())
    fingerprints = {}
    for host in hosts:
        digest = shared.copy()
        digest.update(b"\0host\0" + json.dumps(host_inputs(inventory, host), sort_keys=True, default=str).encode())
        fingerprints[host] = digest.hexdigest()
    return fingerprints


# ------------------------------------------------------- what a run applied
def _short(action: str) -> str:
    return action.rsplit(".", 1)[-1]


@dataclass
class AppliedState:
    """What the roles manage on one host, learned from a run's events."""

    files: set[str] = field(default_factory=set)
    packages: set[str] = field(default_factory=set)
    enabled: set[str] = field(default_factory=set)
    active: set[str] = field(default_factory=set)

    def observe(self, action: str, args: dict[str, Any]) -> None:
        """Fold in one successful task: its module and arguments."""
        module = _short(action)
        if module in FILE_MODULES:
            path = args.get("dest") or args.get("path")
            if isinstance(path, str) and args.get("state") != "absent":
                self.files.add(path)
        elif module in PACKAGE_MODULES and args.get("state", "present") in ("present", "latest", None):
            names = args.get("name") or args.get("pkg") or []
            for name in [names] if isinstance(names, str) else names:
                if isinstance(name, str) and _PACKAGE_NAME.fullmatch(name.split("=", 1)[0]):
                    self.packages.add(name.split("=", 1)[0])
        elif module in COMMAND_MODULES and isinstance(args.get("argv"), list) and args["argv"][:2] == ["dpkg-query", "-W"]:
            # dpkg-query -W -f=FORMAT NAME...: plain names only (not patterns)
            self.packages.update(name for name in args["argv"][2:]
                                 if isinstance(name, str) and _PACKAGE_NAME.fullmatch(name))
        elif module in SERVICE_MODULES and isinstance(args.get("name"), str):
            if args.get("enabled") is True:
                self.enabled.add(args["name"])
            if args.get("state") in ("started", "restarted", "reloaded"):
                self.active.add(args["name"])


class AppliedStateCollector:
    """An ansible-runner event handler that fills one AppliedState per host."""

    def __init__(self, hosts: Iterable[str]):
        self.hosts = {host: AppliedState() for host in hosts}

    def __call__(self, event: dict[str, Any]) -> None:
        if event.get("event") != "runner_on_ok":
            return
        data = event.get("event_data") or {}
        state = self.hosts.get(data.get("host"))
        res = data.get("res") or {}
        args = (res.get("invocation") or {}).get("module_args")
        if state is not None and isinstance(args, dict):
            state.observe(str(data.get("task_action", "")), args)


# --------------------------------------------------------- host-side scripts
def check_script(fingerprint: str, state_dir: str = STATE_DIR) -> str:
    """The one shell command that says whether a host is up to date (no Python)."""
    return _templates().get_template("check.sh.j2").render(
        state_dir=shlex.quote(state_dir), fingerprint=fingerprint, prefix=VERDICT_PREFIX, up_to_date=UP_TO_DATE)


def record_script(fingerprint: str, applied: AppliedState, state_dir: str = STATE_DIR) -> str:
    """The shell command that records a successful converge on the host."""
    return _templates().get_template("record.sh.j2").render(
        state_dir=shlex.quote(state_dir), fingerprint=fingerprint,
        files=sorted(applied.files), packages=sorted(applied.packages),
        enabled=sorted(applied.enabled), active=sorted(applied.active),
        quote=shlex.quote, prefix=VERDICT_PREFIX, up_to_date=UP_TO_DATE)


@dataclass
class HostVerdict:
    host: str
    up_to_date: bool = False
    reason: str = "not checked"
    unreachable: bool = False


def parse_verdict(host: str, stdout: str) -> HostVerdict:
    for line in stdout.splitlines():
        if line.startswith(VERDICT_PREFIX):
            reason = line[len(VERDICT_PREFIX):].strip()
            return HostVerdict(host, up_to_date=reason == UP_TO_DATE, reason=reason)
    return HostVerdict(host, reason="the check printed no verdict")


class VerdictCollector:
    """An ansible-runner event handler for the check run."""

    def __init__(self, hosts: Iterable[str]):
        self.verdicts = {host: HostVerdict(host) for host in hosts}

    def __call__(self, event: dict[str, Any]) -> bool:
        data = event.get("event_data") or {}
        host = data.get("host")
        if host in self.verdicts:
            res = data.get("res") or {}
            if event.get("event") == "runner_on_ok":
                self.verdicts[host] = parse_verdict(host, str(res.get("stdout", "")))
            elif event.get("event") == "runner_on_unreachable":
                self.verdicts[host] = HostVerdict(host, reason=str(res.get("msg", "unreachable")).strip()[:300],
                                                  unreachable=True)
            elif event.get("event") == "runner_on_failed":
                detail = str(res.get("stderr") or res.get("msg") or "").strip().splitlines()
                self.verdicts[host] = HostVerdict(host, reason="the check failed: " + (detail[0][:200] if detail else ""))
        return True


def run_raw(
    inventory: dict[str, Any], hosts: list[str], command_var: str, commands: dict[str, str], runs_dir: Path,
    ansible_dir: Path, forks: int, event_handler: Callable[[dict[str, Any]], bool],
):
    """One ad-hoc `raw` run: each host runs its own command (a host variable, never templated)."""
    import ansible_runner  # heavy: only when hosts are really contacted

    inventory = inv.as_yaml_inventory(inventory)
    hosts_entry = inventory["all"]["children"]["onprem_nodes"]["hosts"]
    for host, command in commands.items():
        hosts_entry[host] = {**(hosts_entry.get(host) or {}), command_var: inv.Unsafe(command)}
    return ansible_runner.run(
        private_data_dir=str(runs_dir),
        host_pattern="onprem_nodes",
        module="raw",
        # `sh -c`: the scripts are POSIX sh whatever root's login shell is (and
        # ad-hoc arguments that start with "{" would be read as JSON).
        module_args="/bin/sh -c {{ %s | quote }}" % command_var,
        inventory=inv.to_ansible_json(inventory),
        limit=",".join(hosts),
        forks=forks,
        envvars={"ANSIBLE_CONFIG": str(ansible_dir / "ansible.cfg")},
        event_handler=event_handler,
        quiet=True,
        suppress_env_files=True,
        rotate_artifacts=10,
    )


def check_hosts(
    cluster: Cluster, fingerprints: dict[str, str], runs_dir: Path, ansible_dir: Path, forks: int = 50,
) -> dict[str, HostVerdict]:
    """Ask every host whether it is up to date; host -> verdict."""
    collector = VerdictCollector(fingerprints)
    run_raw(inv.build(cluster), list(fingerprints), "corral_converge_check",
            {host: check_script(fp) for host, fp in fingerprints.items()},
            runs_dir, ansible_dir, forks, collector)
    return collector.verdicts


def record_hosts(
    cluster: Cluster, fingerprints: dict[str, str], applied: dict[str, AppliedState], runs_dir: Path,
    ansible_dir: Path, forks: int = 50,
) -> dict[str, HostVerdict]:
    """Record the converge on each host in `applied`; host -> whether it was recorded."""
    collector = VerdictCollector(applied)
    run_raw(inv.build(cluster), list(applied), "corral_converge_record",
            {host: record_script(fingerprints[host], state) for host, state in applied.items()},
            runs_dir, ansible_dir, forks, collector)
    return collector.verdicts


# ------------------------------------------------------------ one converge
@dataclass
class ConvergePlan:
    """Which hosts run the roles, and why the others do not."""

    fingerprints: dict[str, str]
    verdicts: dict[str, HostVerdict]

    @property
    def to_converge(self) -> list[str]:
        """Hosts that are reachable and not up to date, in the order given."""
        return [h for h, v in self.verdicts.items() if not v.up_to_date and not v.unreachable]


def plan(
    cluster: Cluster, hosts: list[str], material: dict[str, Any], extra_vars: Iterable[Path],
    runs_dir: Path, ansible_dir: Path, force: bool = False, forks: int = 50,
) -> ConvergePlan:
    """Fingerprint the hosts and, unless `force`, ask each whether it is up to date."""
    fingerprints = desired_fingerprints(cluster, hosts, material, extra_vars, ansible_dir)
    if force:
        verdicts = {h: HostVerdict(h, reason="--force") for h in hosts}
    else:
        verdicts = check_hosts(cluster, fingerprints, runs_dir, ansible_dir, forks)
    return ConvergePlan(fingerprints, verdicts)


def finish(
    cluster: Cluster, converge_plan: ConvergePlan, report: Any, applied: AppliedStateCollector | None,
    runs_dir: Path, ansible_dir: Path, record: bool, forks: int = 50,
) -> Any:
    """The whole run's report: the converged hosts' results, then the skipped ones'.

    With `record`, every host the roles converged without failure gets its
    new record; a host whose record fails is reported failed (its next run
    converges it again, which is safe).
    """
    from .join import HostResult  # join imports nothing from here at import time

    if record and applied is not None:
        done = {h: applied.hosts[h] for h, r in report.hosts.items() if r.status in ("ok", "changed")}
        if done:
            for host, verdict in record_hosts(cluster, converge_plan.fingerprints, done, runs_dir,
                                              ansible_dir, forks).items():
                if not verdict.up_to_date:
                    result = report.hosts[host]
                    result.failed += 1
                    result.task, result.message = "Record the converge", verdict.reason
    merged = {}
    for host, verdict in converge_plan.verdicts.items():
        if host in report.hosts:
            merged[host] = report.hosts[host]
        elif verdict.unreachable:
            merged[host] = HostResult(host, unreachable=True, task="Check the converge record",
                                      message=verdict.reason)
        else:
            merged[host] = HostResult(host, ok=1, task="up to date", message="")
    report.hosts = merged
    return report
