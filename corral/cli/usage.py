"""`corral usage`: GPU-hours, GPUs requested vs used and reserved-pool occupancy per team."""

from __future__ import annotations

import os
import time
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from .common import (
    DEFAULT_CLUSTERS, ClusterArg, ClustersOption, chosen_format, cluster_or_exit, err, examples, fail, out,
)

DEFAULT_PROMETHEUS = "http://127.0.0.1:9090"


class Format(str, Enum):
    table = "table"
    csv = "csv"
    json = "json"


def moment_or_exit(option: str, text: str | None) -> float:
    """An ISO 8601 time with its offset given to `option` (`--until`, `--at`), as Unix seconds; None: now."""
    if text is None:
        return time.time()
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        fail(f"{option} {text!r}: write an ISO 8601 time with its offset, like 2026-11-23T00:00:00+00:00")
    if moment.tzinfo is None:
        fail(f"{option} {text!r} has no UTC offset; add one (+00:00 or Z)")
    return moment.timestamp()


def usage(
    name: ClusterArg,
    clusters: ClustersOption = DEFAULT_CLUSTERS,
    since: Annotated[str, typer.Option(help="Window before --until: 7d, 36h, 90m, 2w.")] = "7d",
    until: Annotated[Optional[str], typer.Option(
        help="End of the window, ISO 8601 with offset (default: now).")] = None,
    prometheus: Annotated[Optional[str], typer.Option(
        help="The cluster's global Prometheus (env CORRAL_PROMETHEUS_URL; default "
             f"{DEFAULT_PROMETHEUS}, after kubectl -n corral-monitoring port-forward svc/prometheus 9090).",
        show_default=False)] = None,
    output: Annotated[Format, typer.Option("--output", "-o", help="table, csv or json (on stdout).")] = Format.table,
    chart: Annotated[Optional[Path], typer.Option(
        help="Also write a PNG bar chart of GPU-hours per team here (needs matplotlib, the chart extra).",
        dir_okay=False)] = None,
    legacy_format: Annotated[Optional[Format], typer.Option(
        "--format", hidden=True, help="Old spelling of --output (docs/monitoring.md).")] = None,
) -> None:
    """GPU-hours, GPUs requested vs used and reserved-pool occupancy per team (teams from the cluster file)."""
    from corral.usage.prometheus import Prometheus, PrometheusError
    from corral.usage.report import COLUMNS, UsageError, measure, parse_duration, rows, to_csv, to_json
    from corral.usage.report import chart as draw_chart

    output = chosen_format(output, legacy_format)
    cluster = cluster_or_exit(clusters, name)
    url = prometheus or os.environ.get("CORRAL_PROMETHEUS_URL") or DEFAULT_PROMETHEUS
    try:
        window = parse_duration(since)
        end = moment_or_exit("--until", until)
        result = measure(cluster, Prometheus(url), window, end)
        if chart is not None:
            draw_chart(result, chart)
    except (PrometheusError, UsageError) as error:
        fail(str(error))
    if output is Format.csv:
        typer.echo(to_csv(result), nl=False)
    elif output is Format.json:
        typer.echo(to_json(result), nl=False)
    else:
        start = datetime.fromtimestamp(result.start).astimezone().isoformat(timespec="minutes")
        stop = datetime.fromtimestamp(result.end).astimezone().isoformat(timespec="minutes")
        table = Table(title=escape(f"GPU usage of {name}, {start} to {stop} ({result.hours:.0f} h)"))
        for key, title in COLUMNS:
            table.add_column(title, justify="left" if key in ("team", "namespaces") else "right")
        for row in rows(result):
            table.add_row(*(escape(cell) for cell in row))
        out.print(table)
    if chart is not None:
        err.print(f"wrote {chart}", markup=False)


def register(app: typer.Typer) -> None:
    app.command(epilog=examples(
        "corral usage jaguar",
        "corral usage jaguar --since 30d -o csv",
    ))(usage)
