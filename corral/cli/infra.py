"""`corral plan` (the Pulumi program offline, under mocks) and `corral up` (pulumi up)."""

from __future__ import annotations

import enum
import gc
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from .common import (
    DEFAULT_CLUSTERS, ClusterArg, ClustersOption, chosen_format, cloud_extra_or_exit, cluster_or_exit, examples, fail, out,
)

# Inputs shown first in the table's summary column when a resource has them:
# what a reviewer checks (where, how big, how fast, who may connect).
KEY_INPUTS = (
    "location", "availabilityZone", "zone", "zones", "region", "vmSize", "instanceType", "machineType",
    "sku", "type", "diskType", "storageAccountType",
    "size", "sizeGiB", "diskSizeGB", "diskIOPSReadWrite", "diskMBpsReadWrite", "iops", "throughput",
    "provisionedIops", "provisionedThroughput",
    "cidrBlock", "addressPrefix", "addressPrefixes", "ipCidrRange", "privateIp", "privateIpAddress",
    "minSize", "maxSize", "desiredCapacity", "port", "fromPort", "toPort", "ports", "protocol",
    "sourceRanges", "cidrIpv4", "commonName", "subject", "ipAddresses", "dnsNames", "algorithm", "length",
    "caching", "lun", "deviceName", "isCaCertificate", "allowedUses",
)
# Inputs that repeat what the row already says, or are noise at a glance.
SKIPPED_INPUTS = ("name", "tags", "labels", "resourceGroupName", "description")
SUMMARY_WIDTH = 200


class Format(str, enum.Enum):
    table = "table"
    json = "json"


def _short(value: Any) -> str:
    if isinstance(value, str):
        return value if len(value) <= 48 else value[:45] + "..."
    if isinstance(value, list):
        inner = ", ".join(_short(item) for item in value[:4])
        return f"[{inner}{', ...' if len(value) > 4 else ''}]"
    if isinstance(value, dict):
        inner = ", ".join(f"{k}={_short(v)}" for k, v in list(value.items())[:4])
        return f"{{{inner}{', ...' if len(value) > 4 else ''}}}"
    return json.dumps(value)


def _flatten(inputs: dict[str, Any], prefix: str = "", depth: int = 0) -> list[tuple[str, Any]]:
    """(dotted path, value) of every scalar or list, nested mappings walked three deep."""
    items = []
    for key, value in inputs.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and depth < 3:
            items.extend(_flatten(value, f"{path}.", depth + 1))
        else:
            items.append((path, value))
    return items


def summarise(inputs: dict[str, Any]) -> str:
    """One line of a resource's inputs: the key ones first (by their own name), then the rest."""
    rank = {key: i for i, key in enumerate(KEY_INPUTS)}

    def order(path: str) -> tuple[int, int]:
        # Key inputs at the top level first, then key inputs nested deeper, then the rest.
        top, leaf = path.split(".", 1)[0], path.rsplit(".", 1)[-1]
        if top in rank:
            return 0, rank[top]
        return (1, rank[leaf]) if leaf in rank else (2, 0)

    items = [
        (path, value) for path, value in _flatten(inputs)
        if value not in (None, "[unknown]", [], {}) and path.split(".", 1)[0] not in SKIPPED_INPUTS
    ]
    items.sort(key=lambda item: order(item[0]))  # stable: the inputs' own order within a rank
    text = ", ".join(f"{path}={_short(value)}" for path, value in items)
    return text if len(text) <= SUMMARY_WIDTH else text[: SUMMARY_WIDTH - 3] + "..."


def _print_table(result) -> None:
    from rich.table import Table
    from rich.text import Text

    for component, resources in result.components().items():
        table = Table(title=f"{component} ({len(resources)} resources)", title_justify="left", expand=False)
        table.add_column("type")
        table.add_column("name")
        table.add_column("protect", justify="center")
        table.add_column("key inputs", overflow="fold")
        for resource in resources:
            protect = "protect" if resource["protect"] else ""
            if resource["retainOnDelete"]:
                protect = f"{protect}+retain" if protect else "retain"
            # Text, not markup: "[secret]" must print as itself.
            table.add_row(Text(resource["type"]), Text(resource["name"]), protect, Text(summarise(resource["inputs"])))
        out.print(table)
    out.print(f"outputs of stack {result.cluster}:", markup=False)
    for key, value in result.outputs.items():
        out.print(f"  {key}: {_short(value)}", markup=False)
    out.print(f"{len(result.resources)} resources ({result.cloud}), from the same program `pulumi up -s {result.cluster}` runs")


def _dangers_against(previous_file: Path, resources: list[dict[str, Any]]) -> list[str]:
    """The replacements and deletions `corral diff` calls dangerous (etcd members, disks, VPN gateways,
    networks, the PKI), between a saved `corral plan -o json` and this plan."""
    from corral.diff.resources import classify

    try:
        previous = json.loads(previous_file.read_text())
    except (OSError, UnicodeDecodeError) as error:
        fail(f"--against {previous_file}: cannot read it ({error})")
    except json.JSONDecodeError as error:
        fail(f"--against {previous_file}:{error.lineno}: not JSON ({error.msg}); "
             "save one with `corral plan CLUSTER -o json > FILE`")
    if not isinstance(previous, list) or not all(isinstance(r, dict) and "type" in r and "name" in r
                                                 for r in previous):
        fail(f"--against {previous_file}: not a `corral plan -o json` listing (a list of resources "
             "with type and name); save one with `corral plan CLUSTER -o json > FILE`")
    return [f"{change.action} {change.type} {change.name}: {change.danger}"
            for change in classify(previous, resources) if change.danger]


def _print_summary(result, dangers: list[str] | None) -> None:
    """What a reviewer reads first: how much, per component; the warnings; what would be lost."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"{result.cluster} ({result.cloud}): {len(result.resources)} resources",
                  title_justify="left", expand=False)
    table.add_column("component")
    table.add_column("resources", justify="right")
    for component, resources in result.components().items():
        table.add_row(Text(component), str(len(resources)))
    out.print(table)
    out.print(f"warnings: {len(result.diagnostics) or 'none'}", markup=False)
    for message in result.diagnostics:
        out.print(Text(f"  {message}", style="yellow"))
    if dangers is None:
        out.print("dangerous changes: not compared (pass --against a saved `corral plan -o json`, "
                  "or run `corral diff`)", markup=False)
    else:
        out.print(f"dangerous changes: {len(dangers) or 'none'}", markup=False)
        for line in dangers:
            out.print(Text(f"  {line}", style="bold red"))


def plan(
    name: ClusterArg,
    output: Annotated[Format, typer.Option("--output", "-o", help="table or json.")] = Format.table,
    full: Annotated[bool, typer.Option("--full", help="Every resource and its key inputs after the summary.")] = False,
    clusters: ClustersOption = DEFAULT_CLUSTERS,
    legacy_format: Annotated[Optional[Format], typer.Option(
        "--format", "-f", hidden=True, help="Old spelling of --output.")] = None,
    against: Annotated[Optional[Path], typer.Option(
        "--against", help="A saved `corral plan CLUSTER -o json`: name the dangerous changes since it.",
        dir_okay=False, exists=True)] = None,
) -> None:
    """Every resource `pulumi up` would register for a cluster, offline (Pulumi mocks, no credentials)."""
    # A short-lived process: no cyclic GC while the cloud SDKs load and the
    # plan runs (see corral.infra.plan.paused_gc; it halves the time).
    gc.disable()
    cluster = cluster_or_exit(clusters, name)
    cloud_extra_or_exit("plan", cluster)
    from corral.infra.plan import PlanError, plan_stack

    try:
        result = plan_stack(cluster, clusters)
    except PlanError as err:
        fail(str(err))
    if chosen_format(output, legacy_format) is Format.json:
        # Machines read this (corral diff, benchmarks): it stays the bare listing.
        out.print(result.to_json(), markup=False, end="")
        return
    dangers = _dangers_against(against, result.resources) if against else None
    _print_summary(result, dangers)
    if full:
        _print_table(result)
    else:
        out.print(f"the full listing (every resource and its key inputs): corral plan {name} --full", markup=False)


def up(
    name: ClusterArg,
    clusters: ClustersOption = DEFAULT_CLUSTERS,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Pass --yes to pulumi (no confirmation prompt).")] = False,
) -> None:
    """Validate the fleet, then `pulumi up -s CLUSTER` (needs the pulumi CLI and cloud credentials)."""
    # `pulumi up` runs the program in this Python: it needs the cluster's cloud provider too.
    cloud_extra_or_exit("up", cluster_or_exit(clusters, name))
    pulumi = shutil.which("pulumi")
    if pulumi is None:
        fail(
            "the pulumi CLI is not installed (https://www.pulumi.com/docs/install/); "
            f"`corral plan {name}` shows what it would do without it"
        )
    from corral.infra.program import CLUSTERS_ENV, project_root

    env = dict(os.environ)
    env[CLUSTERS_ENV] = str(clusters.resolve())
    command = [pulumi, "up", "-s", name] + (["--yes"] if yes else [])
    completed = subprocess.run(command, cwd=project_root(), env=env)
    raise typer.Exit(completed.returncode)


def register(app: typer.Typer) -> None:
    app.command(epilog=examples(
        "corral plan heron",
        "corral plan heron --full",
        "corral plan heron -o json",
    ))(plan)
    app.command(epilog=examples(
        "corral up heron",
    ))(up)
