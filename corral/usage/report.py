"""Per-team GPU usage over a time window, from the recorded series.

Every recorded series is evaluated once a minute (monitoring.RULE_INTERVAL_SECONDS),
so the integral of a gauge over the window is the sum of its samples times a
minute: `sum_over_time(series[window]) * 60 / 3600` is GPU-hours. The window
is left-open, (end - window, end], in Prometheus 2 and 3 alike: its range is
written one millisecond short of the window (Prometheus 2 includes a sample
exactly at the left edge). Namespaces map to teams by the cluster file
(scheduling.teams); namespaces no team lists are reported together as
NO_TEAM. Reserved pools are a node label (corral.dev/team), which
kube-state-metrics exports.
"""

from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import asdict, dataclass, field

from corral.manifests import monitoring
from corral.model.schema import Cluster

from .prometheus import Prometheus, PrometheusError

NO_TEAM = "(no team)"
_DURATION = re.compile(r"(\d+)([smhdw])\Z")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}


class UsageError(ValueError):
    """Bad input (a duration, a missing optional dependency); the message says what to do."""


def parse_duration(text: str) -> int:
    """`7d`, `36h`, `90m`, `2w`, `3600s` -> seconds (at least a minute, at most a year)."""
    match = _DURATION.match(text.strip())
    if not match:
        raise UsageError(f"--since {text!r}: write a number and a unit, like 7d, 36h, 90m or 2w")
    seconds = int(match.group(1)) * _SECONDS[match.group(2)]
    if not 60 <= seconds <= 366 * 86_400:
        raise UsageError(f"--since {text!r}: the window must be between a minute and a year")
    return seconds


@dataclass
class TeamUsage:
    team: str
    namespaces: list[str]
    gpu_hours_requested: float = 0.0
    gpu_hours_used: float = 0.0
    reserved_gpu_hours: float = 0.0            # GPU-hours the team's reserved nodes offered
    reserved_gpu_hours_requested: float = 0.0  # of those, requested by running pods
    # Filled by Usage.finish from the window.
    gpus_requested: float = 0.0                # mean over the window
    gpus_used: float = 0.0                     # mean busy GPUs (utilisation-weighted)
    utilisation: float | None = None           # used / requested
    reserved_gpus: float = 0.0                 # mean GPUs of the team's reserved nodes
    reserved_occupancy: float | None = None    # requested / offered on those nodes


@dataclass
class Usage:
    cluster: str
    prometheus: str
    start: float
    end: float
    teams: list[TeamUsage] = field(default_factory=list)

    @property
    def hours(self) -> float:
        return (self.end - self.start) / 3600

    def finish(self) -> Usage:
        for row in self.teams:
            row.gpus_requested = row.gpu_hours_requested / self.hours
            row.gpus_used = row.gpu_hours_used / self.hours
            row.reserved_gpus = row.reserved_gpu_hours / self.hours
            row.utilisation = row.gpu_hours_used / row.gpu_hours_requested if row.gpu_hours_requested else None
            row.reserved_occupancy = (row.reserved_gpu_hours_requested / row.reserved_gpu_hours
                                      if row.reserved_gpu_hours else None)
        return self


def _hours_by(prom: Prometheus, series: str, by: str, window_ms: int, end: float) -> dict[str, float]:
    hours_per_sample = monitoring.RULE_INTERVAL_SECONDS / 3600
    expr = f"sum by ({by}) (sum_over_time({series}[{window_ms - 1}ms])) * {hours_per_sample!r}"
    return {sample.labels.get(by, ""): sample.value for sample in prom.query(expr, end)}


def measure(cluster: Cluster, prom: Prometheus, window_seconds: int, end: float) -> Usage:
    window_ms = window_seconds * 1000
    requested = _hours_by(prom, f'{monitoring.REQUESTS_BY_NAMESPACE}{{{monitoring.GPU}}}', "namespace",
                          window_ms, end)
    used = _hours_by(prom, monitoring.BUSY_GPUS_BY_NAMESPACE, "namespace", window_ms, end)
    reserved = _hours_by(prom, monitoring.RESERVED_GPUS_BY_TEAM, monitoring.TEAM, window_ms, end)
    reserved_requested = _hours_by(prom, monitoring.RESERVED_GPUS_REQUESTED_BY_TEAM, monitoring.TEAM,
                                   window_ms, end)

    usage = Usage(cluster.name, prom.url, end - window_seconds, end)
    team_of: dict[str, TeamUsage] = {}
    for team in cluster.scheduling.teams:
        row = TeamUsage(team.name, list(team.namespaces))
        usage.teams.append(row)
        team_of.update({ns: row for ns in team.namespaces})
        row.reserved_gpu_hours = reserved.get(team.name, 0.0)
        row.reserved_gpu_hours_requested = reserved_requested.get(team.name, 0.0)
    strays = sorted(ns for ns in set(requested) | set(used) if ns not in team_of)
    if strays:
        row = TeamUsage(NO_TEAM, strays)
        usage.teams.append(row)
        team_of.update({ns: row for ns in strays})
    for namespace, hours in requested.items():
        team_of[namespace].gpu_hours_requested += hours
    for namespace, hours in used.items():
        team_of[namespace].gpu_hours_used += hours
    return usage.finish()


# --- output ---------------------------------------------------------------------

COLUMNS = (
    ("team", "team"), ("namespaces", "namespaces"), ("gpu_hours_requested", "GPU-h requested"),
    ("gpu_hours_used", "GPU-h used"), ("gpus_requested", "GPUs requested (mean)"),
    ("gpus_used", "GPUs used (mean)"), ("utilisation", "utilisation"), ("reserved_gpus", "reserved GPUs"),
    ("reserved_occupancy", "reserved occupancy"),
)


def _cell(key: str, value) -> str:
    if value is None:
        return "-"
    if key == "namespaces":
        return " ".join(value)
    if key in ("utilisation", "reserved_occupancy"):
        return f"{value:.1%}"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def rows(usage: Usage) -> list[list[str]]:
    return [[_cell(key, getattr(row, key)) for key, _ in COLUMNS] for row in usage.teams]


def to_csv(usage: Usage) -> str:
    stream = io.StringIO()
    writer = csv.writer(stream, lineterminator="\n")
    writer.writerow([key for key, _ in COLUMNS])
    for row in usage.teams:
        writer.writerow([" ".join(row.namespaces) if key == "namespaces" else
                         ("" if getattr(row, key) is None else getattr(row, key)) for key, _ in COLUMNS])
    return stream.getvalue()


def to_json(usage: Usage) -> str:
    data = {"cluster": usage.cluster, "prometheus": usage.prometheus, "start": usage.start, "end": usage.end,
            "hours": usage.hours, "teams": [asdict(row) for row in usage.teams]}
    return json.dumps(data, indent=2) + "\n"


def chart(usage: Usage, path) -> None:
    """A PNG bar chart of GPU-hours requested and used per team (needs matplotlib: corral[chart])."""
    try:
        import matplotlib
    except ImportError:
        raise UsageError("--chart needs matplotlib: pip install 'corral[chart]'") from None
    matplotlib.use("Agg")
    from matplotlib import pyplot

    teams = [row.team for row in usage.teams]
    figure, axes = pyplot.subplots(figsize=(max(6, 1.2 * len(teams) + 2), 4.5))
    positions = range(len(teams))
    width = 0.4
    axes.bar([p - width / 2 for p in positions], [r.gpu_hours_requested for r in usage.teams], width,
             label="GPU-hours requested")
    axes.bar([p + width / 2 for p in positions], [r.gpu_hours_used for r in usage.teams], width,
             label="GPU-hours used")
    axes.set_xticks(list(positions), teams)
    axes.set_ylabel("GPU-hours")
    axes.set_title(f"{usage.cluster}: GPU-hours per team over {usage.hours:.0f} h")
    axes.legend()
    figure.tight_layout()
    _save_atomic(figure, path)
    pyplot.close(figure)


def _save_atomic(figure, path) -> None:
    import os
    import tempfile
    from pathlib import Path

    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".png", dir=path.parent)
    os.close(fd)
    try:
        figure.savefig(tmp, format="png")
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


__all__ = ["NO_TEAM", "PrometheusError", "Usage", "UsageError", "TeamUsage", "chart", "measure",
           "parse_duration", "rows", "to_csv", "to_json"]
