"""`corral manifests`: the cluster's add-on manifests, printed or written per add-on."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from .common import (
    DEFAULT_CLUSTERS,
    ClusterArg,
    ClustersOption,
    cluster_or_exit,
    err,
    examples,
    fail,
    out,
    report_problems,
)


def manifests(
    name: ClusterArg,
    clusters: ClustersOption = DEFAULT_CLUSTERS,
    out_dir: Annotated[
        Optional[Path],
        typer.Option("--out", help="Write one <add-on>.yaml per add-on into this folder instead of printing."),
    ] = None,
    validate: Annotated[
        bool,
        typer.Option("--validate", help="Check every object against the cluster's Kubernetes API schemas (offline)."),
    ] = False,
) -> None:
    """The cluster's add-ons (flannel, pod security, teams, scheduling, GPU, autoscaler, CSR approver, monitoring)."""
    # Imported here so other commands never pay for jinja templates and schemas.
    from corral.manifests import ADDON_NAMES, ManifestError, all_objects, ordered, to_yaml
    from corral.manifests.fleet_addons import cluster_addons, load_fleet_beside
    from corral.model import ValidationFailed

    cluster = cluster_or_exit(clusters, name)
    try:
        fleet = load_fleet_beside(clusters)
    except ValidationFailed as failed:
        report_problems(failed)
    try:
        # What `pulumi up` applies: with the fleet's MultiKueue objects on its manager and workers.
        addons = cluster_addons(cluster, fleet)
    except ManifestError as error:
        fail(f"{name}: {error}")

    if validate:
        from corral.manifests.validate import validate_objects

        version, problems = validate_objects(all_objects(addons), cluster.kubernetes.version)
        if version.note:
            err.print(f"[yellow]note:[/] {version.note}", markup=True)
        for problem in problems:
            err.print(problem, markup=False)
        if problems:
            fail(f"{len(problems)} object(s) do not match the Kubernetes {version.used} API schemas")
        count = sum(len(a.every_object) for a in addons)
        err.print(f"ok: {count} objects valid against the Kubernetes {version.used} API schemas", markup=False)

    from corral.manifests.fleet_addons import manager_kueue_settings
    from corral.manifests.kueue import ADDON as KUEUE_ADDON
    from corral.manifests.kueue import chart_comment

    # Kueue's Helm chart is no object of the file: shown as comments, what `pulumi up` installs.
    kueue_chart = chart_comment(cluster, addons, manager_kueue_settings(cluster, fleet))
    if out_dir is None:
        out.print(kueue_chart + to_yaml(cluster, all_objects(addons)), markup=False, end="")
        return

    from corral.util import write_atomic

    out_dir.mkdir(parents=True, exist_ok=True)
    for addon in addons:
        path = out_dir / f"{addon.name}.yaml"
        text = to_yaml(cluster, ordered(addon.every_object), f"Add-on {addon.name}")
        write_atomic(path, (kueue_chart if addon.name == KUEUE_ADDON else "") + text)
        out.print(f"wrote {path} ({len(addon.every_object)} objects)", markup=False)
    # An add-on the cluster no longer has (its last GPU pool removed, say)
    # must not linger in the folder and be applied by someone later.
    rendered = {a.name for a in addons}
    for stale in sorted(set(ADDON_NAMES) - rendered):
        path = out_dir / f"{stale}.yaml"
        if path.exists():
            path.unlink()
            out.print(f"removed {path} (the cluster no longer has this add-on)", markup=False)


def register(app: typer.Typer) -> None:
    app.command("manifests", epilog=examples(
        "corral manifests heron",
        "corral manifests jaguar --out manifests",
    ))(manifests)
