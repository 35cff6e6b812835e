"""`corral usage` and the recording rules against a real Prometheus holding synthetic
kube-state-metrics and dcgm-exporter series (conftest.py, synthetic.py).

The expected numbers come from the synthetic scenario in Python, never from PromQL."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from corral.manifests import dashboards
from corral.model.loader import load_cluster
from corral.usage.prometheus import Prometheus, PrometheusError
from corral.usage.report import NO_TEAM, measure, to_csv

from . import synthetic

ROOT = Path(__file__).resolve().parents[2]
WINDOW = 2 * 86_400  # starts at day 1: vision's resnet-0 and robotics' sim-0 cross its edge


@pytest.fixture(scope="module")
def clusters(tmp_path_factory) -> Path:
    """jaguar with three teams (one reserving a pool), as a fleet of one."""
    folder = tmp_path_factory.mktemp("clusters")
    text = (ROOT / "clusters" / "jaguar.yaml").read_text()
    old = "teams:\n    - {name: robotics, namespaces: [robotics], reservedPools: [gpu-h100-robotics]}\n"
    assert old in text
    (folder / "jaguar.yaml").write_text(text.replace(old, synthetic.TEAMS_YAML))
    return folder


def by_team(usage) -> dict:
    return {row.team: row for row in usage.teams}


def test_usage_per_team_matches_the_synthetic_data(prometheus, clusters):
    cluster = load_cluster(clusters / "jaguar.yaml")
    usage = measure(cluster, Prometheus(prometheus), WINDOW, synthetic.END)
    expected = synthetic.expected_usage(WINDOW)
    rows = by_team(usage)
    assert sorted(rows) == sorted(expected) == sorted(["robotics", "vision", "nlp", NO_TEAM])
    assert rows[NO_TEAM].namespaces == ["sandbox"]
    assert rows["vision"].namespaces == ["vision", "vision-dev"]
    for team, want in expected.items():
        got = rows[team]
        assert got.gpu_hours_requested == pytest.approx(want["requested"], rel=1e-9), team
        assert got.gpu_hours_used == pytest.approx(want["used"], rel=1e-9), team
        assert got.reserved_gpu_hours == pytest.approx(want["reserved"], rel=1e-9), team
        assert got.reserved_gpu_hours_requested == pytest.approx(want["reserved_requested"], rel=1e-9), team
        assert got.gpus_requested == pytest.approx(want["requested"] / 48, rel=1e-9), team
    # The scenario is not trivial: every kind of number is there, and they differ.
    assert rows["robotics"].reserved_gpus == pytest.approx(16)
    assert 0 < rows["robotics"].reserved_occupancy < 1
    assert rows["vision"].reserved_occupancy is None
    assert 0 < rows["vision"].utilisation < rows["robotics"].utilisation < 1
    # nlp's pending hours (and the never-started pod) are not billed.
    assert rows["nlp"].gpu_hours_requested == pytest.approx(2 * (synthetic._at(2.99) - synthetic._at(1.8)) / 3600)


def test_a_shorter_window_ending_earlier(prometheus, clusters):
    cluster = load_cluster(clusters / "jaguar.yaml")
    end = synthetic.START + int(1.6 * 86_400)
    usage = by_team(measure(cluster, Prometheus(prometheus), 36 * 3600, end))
    expected = synthetic.expected_usage(36 * 3600, end)
    for team in ("robotics", "vision", "nlp"):
        assert usage[team].gpu_hours_requested == pytest.approx(expected[team]["requested"], rel=1e-9)
        assert usage[team].gpu_hours_used == pytest.approx(expected[team]["used"], rel=1e-9)
    assert NO_TEAM not in usage  # sandbox ran later


def corral(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "corral", *args], capture_output=True, text=True, timeout=120)


def test_cli_json_csv_table_and_chart(prometheus, clusters, tmp_path):
    until = datetime.fromtimestamp(synthetic.END, timezone.utc).isoformat()
    common = ["usage", "jaguar", "--clusters", str(clusters), "--prometheus", prometheus, "--since", "2d",
              "--until", until]
    result = corral(*common, "--format", "json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    expected = synthetic.expected_usage(WINDOW)
    assert data["hours"] == 48 and data["end"] == synthetic.END
    for row in data["teams"]:
        assert row["gpu_hours_requested"] == pytest.approx(expected[row["team"]]["requested"], rel=1e-9)

    result = corral(*common, "--format", "csv")
    assert result.returncode == 0, result.stderr
    cluster = load_cluster(clusters / "jaguar.yaml")
    assert result.stdout == to_csv(measure(cluster, Prometheus(prometheus), WINDOW, synthetic.END))

    chart = tmp_path / "usage.png"
    result = corral(*common, "--chart", str(chart))
    assert result.returncode == 0, result.stderr
    assert "robotics" in result.stdout and "GPU-h requested" in result.stdout
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_unreachable_prometheus_and_bad_input_are_one_line_errors(clusters):
    closed = "http://127.0.0.1:9"  # discard port: nothing listens
    result = corral("usage", "jaguar", "--clusters", str(clusters), "--prometheus", closed)
    assert result.returncode == 1
    assert "cannot reach Prometheus at http://127.0.0.1:9" in result.stderr and "Traceback" not in result.stderr
    for flag, value, message in (("--since", "7x", "write a number and a unit"),
                                 ("--until", "yesterday", "ISO 8601"),
                                 ("--prometheus", "ftp://x", "not an http(s) URL"),
                                 ("--prometheus", "http://user:pw@x:9090", "must not carry credentials")):
        result = corral("usage", "jaguar", "--clusters", str(clusters), flag, value)
        assert result.returncode == 1 and message in result.stderr, (flag, result.stderr)
        assert "Traceback" not in result.stderr and "pw" not in result.stderr


def test_a_query_prometheus_refuses_is_reported(prometheus):
    with pytest.raises(PrometheusError, match="refused the query"):
        Prometheus(prometheus).query("sum(", synthetic.END)


@pytest.mark.parametrize("board", [dashboards.control_plane(), dashboards.gpu_fleet(), dashboards.teams()],
                         ids=lambda b: b["uid"])
def test_every_dashboard_query_runs(prometheus, board):
    client = Prometheus(prometheus)
    for expr in dashboards.queries(board):
        client.query(expr.replace("$__range", "1d"), synthetic.END)  # raises on a refused query


def test_team_dashboard_reads_recorded_series_with_data(prometheus):
    """The teams dashboard's series exist for the synthetic teams (not just parse)."""
    client = Prometheus(prometheus)
    for expr in dashboards.queries(dashboards.teams())[:3]:
        teams = {s.labels.get("label_corral_dev_team") for s in client.query(expr, synthetic._at(2.3))}
        assert {"robotics", "vision"} <= teams, expr
