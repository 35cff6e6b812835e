"""The Pulumi CLI, its login, the cluster's stack and the stack's settings."""

from __future__ import annotations

import re
from importlib import metadata
from urllib.parse import urlsplit, urlunsplit

from packaging.requirements import Requirement
from packaging.version import InvalidVersion, Version

from corral.model import ValidationFailed
from corral.model.document import Document
from corral.model.stack import placeholder_problems, stack_file_beside

from .checks import Context, Finding, Status
from .runner import INSTALL_HINTS, Unanswered

# Used when corral's own requirement cannot be read (a source checkout without
# metadata): the lower bound of `pulumi>=3.140,<4` in pyproject.toml.
FALLBACK_SDK_FLOOR = Version("3.140.0")
VERSION = re.compile(r"v?(\d+\.\d+\.\d+)")

# The settings `pulumi up` needs per cloud, beyond the cluster file (each
# cloud package's common.py docstring: corral/infra/<cloud>/common.py). The
# region settings are optional, but must equal controlPlane.region.
REQUIRED_CONFIG = {
    "aws": ("corral:nodeImage",),
    "gcp": ("gcp:project", "corral:nodeImage"),
    "azure": (),
}
REGION_CONFIG = {"aws": "aws:region", "gcp": "gcp:region", "azure": "azure-native:location"}


def required_cli_version() -> tuple[Version, str]:
    """The oldest Pulumi CLI corral's program may run under, and why.

    corral pins the Python SDK (`pulumi>=3.140,<4`); the CLI runs the program
    through the Python language host it ships, and Pulumi's own tooling pairs
    a CLI with an SDK no newer than it (the automation API installs "the CLI
    version matching the SDK version": PulumiCommandOptions, Pulumi's Node.js
    SDK reference). So the CLI must be at least the pin's floor.
    """
    try:
        requirements = [Requirement(text) for text in metadata.requires("corral") or []]
    except metadata.PackageNotFoundError:
        requirements = []
    for requirement in requirements:
        if requirement.name == "pulumi" and not requirement.marker:
            floors = [Version(spec.version) for spec in requirement.specifier if spec.operator in (">=", "==", "~=")]
            if floors:
                floor = max(floors)
                return Version(f"{floor.major}.{floor.minor}.{floor.micro}"), f"pulumi{requirement.specifier}"
    return FALLBACK_SDK_FLOOR, f"pulumi>={FALLBACK_SDK_FLOOR}"


def installed_sdk_version() -> Version | None:
    try:
        return Version(metadata.version("pulumi"))
    except (metadata.PackageNotFoundError, InvalidVersion):
        return None


def check_cli(ctx: Context) -> list[Finding]:
    try:
        answer = ctx.cli.run(["pulumi", "version"])
    except Unanswered as why:
        return [Finding("pulumi.cli", Status.fail, str(why), why.fix)]
    match = VERSION.match(answer.stdout.strip())
    if not answer.ok or not match:
        return [Finding("pulumi.cli", Status.fail, f"`pulumi version` answered {answer.error_line()!r}",
                        INSTALL_HINTS["pulumi"])]
    found = Version(match[1])
    floor, pin = required_cli_version()
    sdk = installed_sdk_version()
    if found < floor:
        return [Finding("pulumi.cli", Status.fail,
                        f"pulumi v{found} is older than v{floor}, the oldest corral's SDK pin ({pin}) runs under",
                        f"curl -fsSL https://get.pulumi.com | sh -s -- --version {sdk or floor}")]
    ctx.pulumi_usable = True
    if sdk is not None and found < sdk:
        return [Finding("pulumi.cli", Status.warn,
                        f"pulumi v{found} is older than the installed Python SDK {sdk} (works from v{floor})",
                        f"curl -fsSL https://get.pulumi.com | sh -s -- --version {sdk}")]
    return [Finding("pulumi.cli", Status.passed, f"pulumi v{found} (needs v{floor} or later for {pin})")]


def without_secrets(url: str) -> str:
    """A backend URL with any user, password and query taken out: a self-managed
    backend's URL may carry credentials (postgres://user:pass@host, ?access_key=)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "(unreadable backend URL)"
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def _needs_pulumi(check: str, ctx: Context) -> Finding | None:
    if not ctx.pulumi_usable:
        return Finding(check, Status.skip, "needs a usable pulumi CLI (see pulumi.cli)")
    return None


def check_login(ctx: Context) -> list[Finding]:
    if skipped := _needs_pulumi("pulumi.login", ctx):
        return [skipped]
    try:
        # `whoami --json` is what the pinned SDK's automation API calls
        # (pulumi/automation/_local_workspace.py): fields user, url, organizations.
        answer = ctx.cli.run(["pulumi", "whoami", "--json"], cwd=ctx.project_dir)
        if not answer.ok:
            return [Finding("pulumi.login", Status.fail, f"not logged in to a Pulumi backend: {answer.error_line()}",
                            "pulumi login  (Pulumi Cloud), or pulumi login s3://BUCKET for a self-managed backend")]
        who = answer.json()
    except Unanswered as why:
        return [Finding("pulumi.login", Status.fail, str(why), why.fix)]
    if not isinstance(who, dict) or not who.get("user"):
        return [Finding("pulumi.login", Status.fail, "`pulumi whoami --json` named no user", "pulumi login")]
    ctx.pulumi_logged_in = True
    backend = without_secrets(str(who.get("url") or "")) or "(backend not shown)"
    return [Finding("pulumi.login", Status.passed, f"logged in as {who['user']} at {backend}")]


def _stack_names(cluster: str, rows: object) -> tuple[dict | None, int]:
    """The row of `pulumi stack ls --json` for the cluster's stack (named `cluster`,
    or `org/cluster`, `org/project/cluster` when fully qualified)."""
    rows = rows if isinstance(rows, list) else []
    for row in rows:
        if isinstance(row, dict) and (row.get("name") == cluster or str(row.get("name", "")).endswith("/" + cluster)):
            return row, len(rows)
    return None, len(rows)


def check_stack(ctx: Context) -> list[Finding]:
    if skipped := _needs_pulumi("pulumi.stack", ctx):
        return [skipped]
    if not ctx.pulumi_logged_in:
        return [Finding("pulumi.stack", Status.skip, "needs a Pulumi login (see pulumi.login)")]
    try:
        # The fields name, current, updateInProgress, resourceCount, url: the
        # SDK's StackSummary, read from this very command (LocalWorkspace.list_stacks).
        answer = ctx.cli.run(["pulumi", "stack", "ls", "--json"], cwd=ctx.project_dir)
        if not answer.ok:
            return [Finding("pulumi.stack", Status.fail, f"cannot list stacks: {answer.error_line()}",
                            "pulumi login, then run corral doctor again")]
        row, count = _stack_names(ctx.name, answer.json())
    except Unanswered as why:
        return [Finding("pulumi.stack", Status.fail, str(why), why.fix)]
    if row is None:
        return [Finding("pulumi.stack", Status.fail, f"no stack {ctx.name} in this backend ({count} other stacks)",
                        f"pulumi stack init {ctx.name}  (in {ctx.project_dir})")]
    if row.get("updateInProgress"):
        return [Finding("pulumi.stack", Status.warn, f"stack {row['name']}: an update is in progress now",
                        f"wait for it, or if it died: pulumi cancel -s {ctx.name}")]
    resources = row.get("resourceCount")
    return [Finding("pulumi.stack", Status.passed,
                    f"stack {row['name']} exists" + (f" ({resources} resources)" if resources is not None else ""))]


def check_config(ctx: Context) -> list[Finding]:
    """The stack file: present, readable, no REPLACE-ME, every setting the cloud needs."""
    path = stack_file_beside(ctx.clusters_dir, ctx.name)
    shown = path.relative_to(ctx.project_dir) if path.is_relative_to(ctx.project_dir) else path
    if not path.is_file():
        return [Finding("pulumi.config", Status.fail, f"{shown} does not exist",
                        "create it with the settings of its cloud (stacks/README.md, 'Adding a cluster')")]
    try:
        data = Document.read(path).load() or {}
        problems = placeholder_problems(path, ctx.name)
    except ValidationFailed as failed:
        return [Finding("pulumi.config", Status.fail, str(problem), f"fix {shown}") for problem in failed.problems]
    config = data.get("config") if isinstance(data, dict) else None
    ctx.stack_config = config if isinstance(config, dict) else {}
    findings = [Finding("pulumi.config", Status.fail, str(problem).replace(str(path), str(shown)),
                        f"pulumi config set -s {ctx.name} {problem.path[-1]} VALUE")
                for problem in problems]
    cloud, region = ctx.cluster.control_plane.cloud, ctx.cluster.control_plane.region
    for key in REQUIRED_CONFIG[cloud]:
        if ctx.config(key) in (None, ""):
            findings.append(Finding("pulumi.config", Status.fail, f"{shown}: {key} is not set",
                                    f"pulumi config set -s {ctx.name} {key} VALUE  (stacks/README.md)"))
    region_key = REGION_CONFIG[cloud]
    if ctx.config(region_key) not in (None, region):
        findings.append(Finding("pulumi.config", Status.fail,
                                f"{shown}: {region_key} is {ctx.config(region_key)}, the cluster's region is {region}",
                                f"pulumi config set -s {ctx.name} {region_key} {region}"))
    gpu_pools = [p.name for p in ctx.cluster.cloud_pools if p.gpu]
    if cloud == "azure" and gpu_pools and not ctx.config("corral:gpuNodeImage") and not ctx.config("corral:nodeImage"):
        # Without either, Azure would boot the Marketplace image, which has no NVIDIA driver:
        # the program refuses it (corral/infra/azure/common.py node_image).
        findings.append(Finding("pulumi.config", Status.fail,
                                f"{shown}: GPU pool {', '.join(gpu_pools)} needs corral:gpuNodeImage (or corral:nodeImage): "
                                "the Marketplace image has no NVIDIA driver",
                                f"pulumi config set -s {ctx.name} corral:gpuNodeImage IMAGE-ID  (node-images/)"))
    elif gpu_pools and not ctx.config("corral:gpuNodeImage"):
        findings.append(Finding("pulumi.config", Status.warn,
                                f"{shown}: corral:gpuNodeImage is not set: GPU pools boot corral:nodeImage, "
                                "which needs the NVIDIA driver then",
                                f"pulumi config set -s {ctx.name} corral:gpuNodeImage IMAGE  (node-images/)"))
    if not findings:
        findings.append(Finding("pulumi.config", Status.passed, f"{shown} has every setting {cloud} needs"))
    return findings
