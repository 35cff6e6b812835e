"""`corral capacity`: free and used GPUs across the fleet, and where a job fits now (docs/capacity.md)."""

from __future__ import annotations

import io
import os
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console, Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from .common import (
    DEFAULT_CLUSTERS,
    ClustersOption,
    check_cluster_name,
    err,
    examples,
    fail,
    fleet_or_exit,
    out,
)
from .usage import DEFAULT_PROMETHEUS, moment_or_exit

# At most this many pools, racks or hosts named per cluster in the --fits table (all are in -o json).
SHOWN_DOMAINS = 4
CHART_WIDTH = 50


class Format(str, Enum):
    table = "table"
    json = "json"
    chart = "chart"


def _names(names: list[str] | None) -> list[str] | None:
    return [check_cluster_name(name) for name in names] if names else names


def prometheus_urls(given: list[str], names: list[str], known: list[str]) -> dict[str, str]:
    """Each cluster's Prometheus: `--prometheus CLUSTER=URL` per cluster, or one bare URL
    (or $CORRAL_PROMETHEUS_URL, or the port-forward default) when there is one cluster.
    URLs of fleet clusters not asked about are left unused, so one list of URLs serves every question."""
    urls: dict[str, str] = {}
    bare: list[str] = []
    for item in given:
        name, sep, url = item.partition("=")
        if sep and "://" not in name:
            if name not in known:
                fail(f"--prometheus {name}=...: no cluster {name} (clusters: {', '.join(known)})")
            if name in names:
                urls[name] = url
        else:
            bare.append(item)
    if bare:
        if len(names) != 1 or len(bare) > 1:
            fail("--prometheus URL without a cluster name is for one cluster; write --prometheus CLUSTER=URL "
                 "for each of " + ", ".join(names))
        urls[names[0]] = bare[0]
    if len(names) == 1 and names[0] not in urls:
        urls[names[0]] = os.environ.get("CORRAL_PROMETHEUS_URL") or DEFAULT_PROMETHEUS
    missing = [name for name in names if name not in urls]
    if missing:
        fail(f"no Prometheus for cluster {', '.join(missing)}: give --prometheus CLUSTER=URL for each "
             "(after kubectl -n corral-monitoring port-forward svc/prometheus PORT:9090 in its context)")
    return urls


def capacity(
    names: Annotated[list[str] | None, typer.Argument(
        metavar="CLUSTER", help="Clusters (clusters/<name>.yaml); default: every cluster file.", show_default=False,
        callback=_names)] = None,
    clusters: ClustersOption = DEFAULT_CLUSTERS,
    prometheus: Annotated[list[str] | None, typer.Option(
        metavar="CLUSTER=URL", help="A cluster's global Prometheus as CLUSTER=URL, once per cluster; with one cluster a bare URL "
             f"(env CORRAL_PROMETHEUS_URL; default {DEFAULT_PROMETHEUS}, after kubectl -n corral-monitoring "
             "port-forward svc/prometheus 9090).", show_default=False)] = None,
    fits: Annotated[str | None, typer.Option(
        metavar="SHAPE", help="Where a job fits now: GPUSxMODEL (64xH100, pods of a whole machine) or PODSxGPUSxMODEL "
             "(8x8xH100).", show_default=False)] = None,
    team: Annotated[str | None, typer.Option(
        metavar="TEAM", help="With --fits: the job's team, whose reserved pools count too (others' never do).",
        show_default=False)] = None,
    at: Annotated[str | None, typer.Option(
        metavar="TIME", help="The moment to look at, ISO 8601 with offset (default: now).", show_default=False)] = None,
    output: Annotated[Format, typer.Option(
        "--output", "-o", help="table, json or chart (on stdout).")] = Format.table,
    out_file: Annotated[Path | None, typer.Option(
        "--out", help="Also write the chart as SVG here.", dir_okay=False, show_default=False)] = None,
) -> None:
    """Free and used GPUs by model per cluster, pool, rack and team, from each cluster's Prometheus."""
    from corral.usage.capacity import (
        CapacityError,
        fit,
        gpus_per_node_of,
        measure,
        parse_shape,
        to_json,
    )
    from corral.usage.prometheus import Prometheus, PrometheusError

    fleet = fleet_or_exit([clusters])
    chosen = names or sorted(fleet.clusters)
    unknown = [name for name in chosen if name not in fleet.clusters]
    if unknown:
        fail(f"no cluster {', '.join(unknown)} in {clusters} (clusters: {', '.join(sorted(fleet.clusters))})")
    if team is not None and fits is None:
        fail("--team says whose job --fits asks about; give --fits too")
    selected = {name: fleet.clusters[name] for name in chosen}
    if team is not None and not any(t.name == team for c in selected.values() for t in c.scheduling.teams):
        fail(f"--team {team}: no team of that name in {', '.join(chosen)} (scheduling.teams)")
    urls = prometheus_urls(prometheus or [], chosen, sorted(fleet.clusters))
    moment = moment_or_exit("--at", at)
    clients = {}
    for name in chosen:
        try:
            clients[name] = Prometheus(urls[name])
        except PrometheusError as error:
            fail(f"cluster {name}: {error}")
    try:
        shape = parse_shape(fits, gpus_per_node_of(selected.values())) if fits is not None else None
        capacities = [measure(selected[name], clients[name], moment) for name in chosen]
    except (PrometheusError, CapacityError) as error:
        fail(str(error))
    answers = [fit(c, shape, team) for c in capacities] if shape is not None else None
    for capacity in capacities:
        if not capacity.nodes:
            # Most often a port-forward to the wrong Prometheus, or a time before its data.
            err.print(f"warning: cluster {capacity.cluster}: {capacity.prometheus} has no GPU nodes at that time "
                      "(kube_node_labels with corral.dev/gpu-model); is it the cluster's global Prometheus?",
                      markup=False)

    when = datetime.fromtimestamp(moment).astimezone().isoformat(timespec="minutes")
    if output is Format.json:
        typer.echo(to_json(capacities, selected, answers), nl=False)
    else:
        if output is Format.chart:
            out.print(_chart(capacities, when))
        else:
            # With --fits the question is where the job goes: the per-cluster totals, then the answer.
            out.print(_tables(capacities, selected, when, views=("cluster",) if answers is not None else None))
        if answers is not None:
            out.print(_fits_table(answers, shape, team))
    if out_file is not None:
        from corral.util import write_atomic

        # Recorded, not shown: the SVG is rich's export of the chart as the terminal would draw it.
        recorder = Console(record=True, width=120, file=io.StringIO())
        recorder.print(_chart(capacities, when))
        try:
            write_atomic(out_file, recorder.export_svg(title=f"corral capacity {' '.join(chosen)}"))
        except OSError as error:
            fail(f"--out {out_file}: cannot write it ({error.strerror})")
        err.print(f"wrote {out_file}", markup=False)


# --- rendering ----------------------------------------------------------------------------

_NUMBERS = ("nodes", "total", "used", "free", "unavailable")


def _tables(capacities, selected, when: str, views: tuple[str, ...] | None = None) -> Group:
    """The roll-ups as tables: every view and the teams, or only `views`."""
    from corral.usage.capacity import VIEWS, by_team, roll_up

    nodes = [n for c in capacities for n in c.nodes]
    tables = []
    for view, keys in VIEWS.items():
        if views is not None and view not in views:
            continue
        table = Table(title=escape(f"GPUs by {view} at {when}"))
        for key in keys:
            table.add_column(key.replace("_", " "))
        for name in _NUMBERS:
            table.add_column(name, justify="right")
        for row in roll_up(nodes, keys):
            table.add_row(*(escape(row.key[k] or "-") for k in keys), *(str(getattr(row, n)) for n in _NUMBERS))
        tables.append(table)
    if views is not None:
        return Group(*tables)
    teams = Table(title=escape(f"GPUs by team at {when}"))
    for name in ("cluster", "team", "model"):
        teams.add_column(name)
    for name in ("used", "reserved", "reserved free"):
        teams.add_column(name, justify="right")
    for capacity in capacities:
        for row in by_team(capacity, selected[capacity.cluster]):
            teams.add_row(escape(row.cluster), escape(row.team), escape(row.model), str(row.used),
                          str(row.reserved), str(row.reserved_free))
    tables.append(teams)
    return Group(*tables)


def _chart(capacities, when: str) -> Group:
    """One bar per cluster and model: used, free, unavailable, to one scale."""
    from corral.usage.capacity import VIEWS, roll_up

    rows = roll_up([n for c in capacities for n in c.nodes], VIEWS["cluster"])
    widest = max((row.total for row in rows), default=0) or 1
    lines = [Text(f"GPUs at {when}: ") + Text("█ used ", style="red") + Text("█ free ", style="green")
             + Text("░ unavailable", style="bright_black")]
    label = max((len(f"{r.key['cluster']} {r.key['model']}") for r in rows), default=0)
    for row in rows:
        def cells(count: int) -> int:
            return round(count * CHART_WIDTH / widest)
        bar = Text(f"{row.key['cluster']} {row.key['model']}".ljust(label) + " ")
        bar.append("█" * cells(row.used), style="red")
        bar.append("█" * cells(row.free), style="green")
        bar.append("░" * cells(row.unavailable), style="bright_black")
        bar.append(f" {row.used} used, {row.free} free, {row.unavailable} unavailable of {row.total}")
        lines.append(bar)
    return Group(*lines)


def _fits_table(answers, shape, team: str | None) -> Table:
    who = f" for team {team}" if team else " (no team: reserved pools left out)"
    table = Table(title=escape(f"Where {shape.pods} pods of {shape.gpus_per_pod} {shape.model} "
                               f"({shape.gpus} GPUs) fit now{who}"))
    for name in ("cluster", "fits", "pods that fit", "tightest", "where"):
        table.add_column(name, justify="right" if name == "pods that fit" else "left")
    for answer in answers:
        domains = {"host": answer.hosts, "rack": answer.racks, "pool": answer.pools}.get(answer.level or "", [])
        where = ", ".join(domains[:SHOWN_DOMAINS]) + (f" (+{len(domains) - SHOWN_DOMAINS})"
                                                      if len(domains) > SHOWN_DOMAINS else "")
        if answer.level == "cluster":
            where = "across pools"
        table.add_row(escape(answer.cluster), "yes" if answer.fits else "no", str(answer.pods_that_fit),
                      answer.level or "-", escape(where or "-"))
    return table


def register(app: typer.Typer) -> None:
    app.command(epilog=examples(
        "corral capacity",
        "corral capacity jaguar --fits 64xH100",
        "corral capacity jaguar --fits 8x8xH100 --team robotics -o json",
        "corral capacity heron ibis --prometheus heron=http://127.0.0.1:9091 --prometheus ibis=http://127.0.0.1:9092"
        " -o chart",
    ))(capacity)
