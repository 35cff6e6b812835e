"""`corral validate`, `corral list`, `corral show`, `corral schema`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from .common import (
    DEFAULT_CLUSTERS, ClusterArg, ClustersOption, cluster_or_exit, examples, fleet_or_exit, out, report_problems,
)


def _etcd_summary(cluster) -> str:
    etcd = cluster.control_plane.etcd
    return f"{etcd.members}x {etcd.disk.type} {etcd.disk.iops:,} IOPS"


def validate(
    paths: Annotated[Optional[list[Path]], typer.Argument(help="Cluster files or folders (default: --clusters).")] = None,
    clusters: ClustersOption = DEFAULT_CLUSTERS,
) -> None:
    """Check cluster files against the schema and the fleet rules, and their stack files for placeholders."""
    from corral.model import ValidationFailed
    from corral.model.stack import placeholder_problems, stack_file_beside

    fleet = fleet_or_exit(paths or [clusters])
    stack_problems = []
    for cluster in fleet:
        stack = stack_file_beside(fleet.documents[cluster.name].path.parent, cluster.name)
        if stack.is_file():
            try:
                stack_problems += placeholder_problems(stack, cluster.name)
            except ValidationFailed as failed:
                stack_problems += failed.problems
    if stack_problems:
        report_problems(ValidationFailed(stack_problems))
    for cluster in fleet:
        cp = cluster.control_plane
        out.print(
            f"ok {fleet.documents[cluster.name].display}: {cluster.name} "
            f"({cp.cloud}/{cp.region}, etcd {_etcd_summary(cluster)}, "
            f"{len(cluster.node_pools)} pools, up to {cluster.node_capacity:,} nodes "
            f"and {cluster.gpu_capacity:,} GPUs)",
            markup=False,
        )


def list_clusters(clusters: ClustersOption = DEFAULT_CLUSTERS) -> None:
    """The fleet at a glance."""
    fleet = fleet_or_exit([clusters])
    table = Table(title=f"clusters in {clusters}")
    for column in ("cluster", "cloud/region", "kubernetes", "etcd", "pools", "nodes (max)", "GPUs (max)"):
        table.add_column(column, justify="right" if column.endswith(")") else "left")
    for cluster in fleet:
        cp = cluster.control_plane
        kinds = sorted({p.provider for p in cluster.node_pools})
        pools = f"{len(cluster.node_pools)} ({', '.join(kinds)})" if kinds else "0"
        table.add_row(
            cluster.name, f"{cp.cloud}/{cp.region}", cluster.kubernetes.version,
            _etcd_summary(cluster), pools, f"{cluster.node_capacity:,}", f"{cluster.gpu_capacity:,}",
        )
    out.print(table)


def show(
    name: ClusterArg,
    clusters: ClustersOption = DEFAULT_CLUSTERS,
    output: Annotated[str, typer.Option("--output", "-o", help="yaml or json.")] = "yaml",
    expand_hosts: Annotated[bool, typer.Option(help="List every host instead of the patterns.")] = False,
) -> None:
    """The cluster's resolved definition: the file plus every default, and (YAML) the control-plane
    settings corral derives from it, each with its source."""
    from corral.model.render import resolved

    cluster = cluster_or_exit(clusters, name)
    data = resolved(cluster, expand_hosts=expand_hosts)
    if output == "json":
        out.print(json.dumps(data, indent=2), markup=False)
    elif output == "yaml":
        from corral.model.control_plane_sizing import describe, size
        from corral.model.render import dump_yaml

        out.print(dump_yaml(data), markup=False, end="")
        # What corral derives for the control plane from this file, with the
        # rule and the source of each: comments, so the output stays the file.
        out.print("# Control-plane settings derived from this file (corral/model/control_plane_sizing.py):",
                  markup=False)
        for line in describe(size(cluster)):
            out.print(f"# {line}", markup=False)
    else:
        raise typer.BadParameter("must be yaml or json", param_hint="--output")


def schema(
    write: Annotated[bool, typer.Option(help="Write clusters/schema.json instead of printing it.")] = False,
    clusters: ClustersOption = DEFAULT_CLUSTERS,
) -> None:
    """The JSON Schema of cluster files, for editors."""
    from corral.model.render import json_schema_text
    from corral.util import write_atomic

    text = json_schema_text()
    if write:
        write_atomic(clusters / "schema.json", text)
        out.print(f"wrote {clusters / 'schema.json'}")
    else:
        out.print(text, markup=False, end="")


def register(app: typer.Typer) -> None:
    app.command(epilog=examples(
        "corral validate",
        "corral validate clusters/jaguar.yaml",
    ))(validate)
    app.command("list", epilog=examples(
        "corral list",
    ))(list_clusters)
    app.command(epilog=examples(
        "corral show jaguar",
        "corral show heron -o json --expand-hosts",
    ))(show)
    app.command(epilog=examples(
        "corral schema",
    ))(schema)
