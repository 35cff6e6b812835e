"""`corral capacity` against three real Prometheus servers (Debian's `prometheus`), one per
cluster, each holding a synthetic cluster's kube-state-metrics series (synthetic_capacity.py).

The expected numbers are worked out by hand from the synthetic table (its
comments give the sums), never through PromQL."""

from __future__ import annotations

import json
import re
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest

from corral.model.loader import load_fleet
from corral.usage.capacity import VIEWS, by_team, fit, measure, parse_shape, roll_up
from corral.usage.prometheus import Prometheus, PrometheusError
from corral.usage.report import NO_TEAM

from . import synthetic_capacity as synthetic
from .conftest import PrometheusProcess, promtool
from .test_prometheus import corral

ROOT = Path(__file__).resolve().parents[2]
AT_ISO = datetime.fromtimestamp(synthetic.AT, UTC).isoformat()


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """Cluster name -> the URL of its own Prometheus, serving the synthetic series."""
    if shutil.which("prometheus") is None or shutil.which("promtool") is None:
        pytest.skip("prometheus/promtool not installed (apt-get install prometheus; scripts/install --test does)")
    started, urls = [], {}
    try:
        for name in synthetic.FLEET:
            root = tmp_path_factory.mktemp(f"prometheus-{name}")
            (root / "data.om").write_text(synthetic.openmetrics(name))
            server = PrometheusProcess(root)
            promtool("tsdb", "create-blocks-from", "openmetrics", "--quiet", "data.om", str(server.tsdb), cwd=root)
            server.start()
            started.append(server)
            urls[name] = server.url
        yield urls
    finally:
        for server in started:
            server.stop()


def _replace(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new)


@pytest.fixture(scope="module")
def clusters(tmp_path_factory) -> Path:
    """heron as shipped; ibis with an H100 pool and a research team; jaguar with three teams."""
    folder = tmp_path_factory.mktemp("clusters")
    for name in ("heron", "ibis", "jaguar"):
        (folder / f"{name}.yaml").write_text((ROOT / "clusters" / f"{name}.yaml").read_text())
    ibis = (folder / "ibis.yaml").read_text()
    ibis = _replace(ibis, "  - name: gpu-a100\n", synthetic.IBIS_H100_POOL_YAML + "  - name: gpu-a100\n")
    ibis = _replace(ibis, "scheduling:\n  binPacking: true\n  teams:\n",
                    "scheduling:\n  binPacking: true\n  teams:\n    - {name: research, namespaces: [research]}\n")
    (folder / "ibis.yaml").write_text(ibis)
    jaguar = (folder / "jaguar.yaml").read_text()
    jaguar = _replace(jaguar, "teams:\n    - {name: robotics, namespaces: [robotics], reservedPools: [gpu-h100-robotics]}\n",
                      synthetic.JAGUAR_TEAMS_YAML)
    (folder / "jaguar.yaml").write_text(jaguar)
    return folder


@pytest.fixture(scope="module")
def fleet(clusters):
    return load_fleet([clusters]).clusters


@pytest.fixture(scope="module")
def measured(servers, fleet):
    return {name: measure(fleet[name], Prometheus(url), synthetic.AT) for name, url in servers.items()}


def _numbers(row) -> tuple[int, int, int, int, int]:
    return row.nodes, row.total, row.used, row.free, row.unavailable


def test_free_and_used_per_cluster_pool_and_rack(measured):
    nodes = [n for c in measured.values() for n in c.nodes]
    by_cluster = {(r.key["cluster"], r.key["model"]): _numbers(r) for r in roll_up(nodes, VIEWS["cluster"])}
    # nodes, total, used, free, unavailable
    assert by_cluster == {
        ("heron", "A10G"): (4, 24, 16, 8, 0),   # c001: its init container's 4 GPUs
        ("ibis", "A100"): (2, 16, 8, 8, 0),
        ("ibis", "H100"): (6, 48, 20, 28, 0),
        # 32 + 32 + 32 + 32; 20 + 10 + 0 + 8 used; 12 + 14 + 24 + 16 free; g008, g009, h068 unavailable
        ("jaguar", "H100"): (16, 128, 38, 66, 24),
    }
    by_pool = {(r.key["cluster"], r.key["pool"], r.key["reserved_for"]): _numbers(r)
               for r in roll_up(nodes, VIEWS["pool"])}
    assert by_pool[("jaguar", "gpu-h100-sf1", "")] == (12, 96, 30, 50, 16)
    assert by_pool[("jaguar", "gpu-h100-robotics", "robotics")] == (4, 32, 8, 16, 8)
    assert by_pool[("heron", "gpu-a10g-inference", "inference")] == (2, 16, 8, 8, 0)
    by_rack = {(r.key["cluster"], r.key["rack"]): _numbers(r) for r in roll_up(nodes, VIEWS["rack"])}
    assert by_rack[("jaguar", "r01")] == (4, 32, 20, 12, 0)   # a Pending pod bound to g004 holds its GPUs
    assert by_rack[("jaguar", "r02")] == (4, 32, 10, 14, 8)   # cordoned g007 is full: nothing unavailable there
    assert by_rack[("jaguar", "r03")] == (4, 32, 0, 24, 8)
    assert by_rack[("jaguar", "r13")] == (4, 32, 8, 16, 8)
    cloud = [r for r in roll_up(nodes, VIEWS["rack"]) if r.key["cluster"] == "ibis"]
    assert [(r.key["pool"], r.key["rack"]) for r in cloud] == [("gpu-a100", ""), ("gpu-h100-a3", "")]  # no racks
    reasons = {n.name: n.out_of_service for n in measured["jaguar"].nodes if n.out_of_service}
    assert reasons == {"g007": ["cordoned"], "g008": ["tainted corral.dev/unhealthy"], "g009": ["not Ready"],
                       "h068": ["tainted corral.dev/preflight"]}


def test_used_and_reserved_per_team(measured, fleet):
    rows = {(r.cluster, r.team, r.model): (r.used, r.reserved, r.reserved_free)
            for name, c in measured.items() for r in by_team(c, fleet[name])}
    assert rows == {
        ("jaguar", "robotics", "H100"): (8, 32, 16),
        ("jaguar", "vision", "H100"): (16, 0, 0),        # the unscheduled pod holds nothing
        ("jaguar", "nlp", "H100"): (12, 0, 0),           # the Succeeded pod holds nothing
        ("jaguar", NO_TEAM, "H100"): (2, 0, 0),
        ("ibis", "research", "H100"): (20, 0, 0),
        ("ibis", "research", "A100"): (8, 0, 0),
        ("heron", "inference", "A10G"): (8, 16, 8),
        ("heron", NO_TEAM, "A10G"): (8, 0, 0),
    }


def _fits(measured, fleet, text: str, team: str | None = None) -> dict:
    from corral.usage.capacity import gpus_per_node_of

    shape = parse_shape(text, gpus_per_node_of(fleet.values()))
    return {name: fit(c, shape, team) for name, c in measured.items()}


def test_a_job_that_fits_in_one_rack(measured, fleet):
    answers = _fits(measured, fleet, "24xH100")  # 3 pods of 8: r03 holds 3
    assert answers["jaguar"].fits and answers["jaguar"].level == "rack"
    assert answers["jaguar"].racks == ["gpu-h100-sf1/r03"] and answers["jaguar"].pods_that_fit == 5
    # ibis' cloud pool has no racks: the tightest it can say is the pool.
    assert answers["ibis"].fits and answers["ibis"].level == "pool" and answers["ibis"].pools == ["gpu-h100-a3"]
    assert not answers["heron"].fits and answers["heron"].level is None
    # Two pods of 4 fit on one machine: g003, g005, g010-g012 (8 free) and g002 (4 free... only one pod).
    small = _fits(measured, fleet, "2x4xH100")["jaguar"]
    assert small.level == "host" and small.hosts == ["g003", "g005", "g010", "g011", "g012"]


def test_a_job_that_fits_only_across_racks(measured, fleet):
    answers = _fits(measured, fleet, "4x8xH100")  # racks hold 1, 1 and 3 pods of 8; the pool 5
    assert answers["jaguar"].fits and answers["jaguar"].level == "pool" and answers["jaguar"].racks == []
    assert answers["jaguar"].pools == ["gpu-h100-sf1"]
    assert not answers["ibis"].fits and answers["ibis"].pods_that_fit == 3


def test_a_job_that_fits_nowhere(measured, fleet):
    answers = _fits(measured, fleet, "80xH100")
    assert not any(a.fits for a in answers.values())
    assert {name: a.pods_that_fit for name, a in answers.items()} == {"heron": 0, "ibis": 3, "jaguar": 5}


def test_a_reserved_pool_counts_only_for_its_team(measured, fleet):
    shape = "56xH100"  # 7 pods of 8: jaguar's shared pool holds 5, the robotics pool 2 more
    assert not _fits(measured, fleet, shape)["jaguar"].fits
    assert not _fits(measured, fleet, shape, team="vision")["jaguar"].fits
    robotics = _fits(measured, fleet, shape, team="robotics")["jaguar"]
    assert robotics.fits and robotics.level == "cluster" and robotics.pools == [] and robotics.pods_that_fit == 7
    # Unhealthy, cordoned and not-Ready machines are not free: h068 (preflight) would make it 8 pods.
    assert not _fits(measured, fleet, "64xH100", team="robotics")["jaguar"].fits


def test_fits_syntax_and_pod_size(fleet):
    from corral.usage.capacity import CapacityError, gpus_per_node_of

    sizes = gpus_per_node_of(fleet.values())
    assert parse_shape("64xH100", sizes) == parse_shape("8x8xh100", sizes)
    assert str(parse_shape("64xH100", sizes)) == "8x8xH100"
    for text, message in (("64 H100", "write GPUSxMODEL"), ("x8xH100", "write GPUSxMODEL"),
                          ("12xH100", "not whole H100 machines of 8"), ("8xH10", "is not a GPU model corral knows (did you mean H100"),
                          ("8xA10G", "have 4 or 8 GPUs; give the pod size"),
                          ("8xB200", "no pool of heron, ibis, jaguar has B200"),
                          ("0x8xH100", "at least one pod")):
        with pytest.raises(CapacityError, match=re.escape(message)):
            parse_shape(text, sizes)


def test_an_unreachable_prometheus_names_the_cluster(fleet):
    with pytest.raises(PrometheusError, match=r"cluster ibis: cannot reach Prometheus at http://127\.0\.0\.1:9 "):
        measure(fleet["ibis"], Prometheus("http://127.0.0.1:9"), synthetic.AT)


# --- the command ------------------------------------------------------------------------------


def _fleet_args(servers, clusters, at: str = AT_ISO) -> list[str]:
    args = ["capacity", "--clusters", str(clusters), "--at", at]
    for name, url in servers.items():
        args += ["--prometheus", f"{name}={url}"]
    return args


def test_cli_json_has_every_view_and_the_fit(servers, clusters):
    result = corral(*_fleet_args(servers, clusters), "--fits", "56xH100", "--team", "robotics", "-o", "json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["at"] == synthetic.AT
    assert [c["cluster"] for c in data["clusters"]] == ["heron", "ibis", "jaguar"]
    jaguar = next(r for r in data["by_cluster"] if r["cluster"] == "jaguar")
    assert (jaguar["total"], jaguar["used"], jaguar["free"], jaguar["unavailable"]) == (128, 38, 66, 24)
    assert {r["rack"] for r in data["by_rack"] if r["cluster"] == "jaguar"} == {"r01", "r02", "r03", "r13"}
    assert {(r["team"], r["used"]) for r in data["by_team"] if r["cluster"] == "ibis"} == {("research", 20),
                                                                                        ("research", 8)}
    fits = {f["cluster"]: f for f in data["fits"]}
    assert fits["jaguar"]["fits"] and fits["jaguar"]["level"] == "cluster" and fits["jaguar"]["job"] == "7x8xH100"
    assert not fits["ibis"]["fits"] and not fits["heron"]["fits"]
    assert len(data["nodes"]) == 16 + 8 + 4


def test_cli_table_names_the_numbers_and_where_it_fits(servers, clusters):
    result = corral(*_fleet_args(servers, clusters), "jaguar", "ibis")
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "GPUs by cluster" in text and "GPUs by pool" in text and "GPUs by rack" in text and "GPUs by team" in text
    assert re.search(r"jaguar\s*│\s*H100\s*│\s*16\s*│\s*128\s*│\s*38\s*│\s*66\s*│\s*24", text), text
    assert re.search(r"jaguar\s*│\s*gpu-h100-sf1\s*│\s*r03\s*│\s*H100\s*│\s*4\s*│\s*32\s*│\s*0\s*│\s*24\s*│\s*8", text)
    assert re.search(r"jaguar\s*│\s*robotics\s*│\s*H100\s*│\s*8\s*│\s*32\s*│\s*16", text), text
    assert "heron" not in text  # only the clusters named

    result = corral(*_fleet_args(servers, clusters), "jaguar", "ibis", "--fits", "24xH100")
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "GPUs by cluster" in text and "GPUs by rack" not in text  # the totals, then the answer
    assert "Where 3 pods of 8 H100 (24 GPUs) fit now (no team: reserved pools left out)" in text
    assert re.search(r"jaguar\s*│\s*yes\s*│\s*5\s*│\s*rack\s*│\s*gpu-h100-sf1/r03", text), text
    assert re.search(r"ibis\s*│\s*yes\s*│\s*3\s*│\s*pool\s*│\s*gpu-h100-a3", text), text
    assert "heron" not in text  # only the clusters named


def test_cli_chart_and_svg(servers, clusters, tmp_path):
    svg = tmp_path / "capacity.svg"
    result = corral(*_fleet_args(servers, clusters), "-o", "chart", "--out", str(svg))
    assert result.returncode == 0, result.stderr
    line = next(line for line in result.stdout.splitlines() if line.startswith("jaguar H100"))
    # 50 cells for the widest bar (jaguar's 128 GPUs): 38 used, 66 free, 24 unavailable, rounded.
    assert line.count("█") == round(38 * 50 / 128) + round(66 * 50 / 128) and line.count("░") == round(24 * 50 / 128)
    assert "38 used, 66 free, 24 unavailable of 128" in line
    result = corral(*_fleet_args(servers, clusters), "--out", str(tmp_path / "missing" / "capacity.svg"))
    assert result.returncode == 1 and "cannot write it (No such file or directory)" in result.stderr
    assert "Traceback" not in result.stderr
    assert svg.read_text().startswith("<svg") and "jaguar H100" in svg.read_text().replace("&#160;", " ")


def test_cli_errors_are_one_line(servers, clusters):
    args = _fleet_args(servers, clusters)
    for extra, message in (
        (["--fits", "64 H100"], "write GPUSxMODEL (64xH100"),
        (["--fits", "8xH100", "--team", "nobody"], "--team nobody: no team of that name"),
        (["--team", "robotics"], "give --fits too"),
        (["--at", "yesterday"], "ISO 8601"),
    ):
        result = corral(*args, *extra)
        assert result.returncode == 1 and message in result.stderr, (extra, result.stderr)
        assert "Traceback" not in result.stderr
    closed = dict(servers, ibis="http://127.0.0.1:9")
    result = corral(*_fleet_args(closed, clusters))
    assert result.returncode == 1 and "cluster ibis: cannot reach Prometheus at http://127.0.0.1:9" in result.stderr
    result = corral("capacity", "--clusters", str(clusters), "--prometheus", "heron=" + servers["heron"])
    assert result.returncode == 1 and "no Prometheus for cluster ibis, jaguar" in result.stderr
    result = corral(*_fleet_args(dict(servers, heron="http://admin:hunter2@127.0.0.1:9"), clusters))
    assert result.returncode == 1 and "cluster heron: --prometheus must not carry credentials" in result.stderr
    assert "hunter2" not in result.stderr + result.stdout
    before = datetime.fromtimestamp(synthetic.START - 86_400, UTC).isoformat()
    result = corral(*_fleet_args(servers, clusters, at=before))
    assert result.returncode == 0, result.stderr
    assert f"warning: cluster ibis: {servers['ibis']} has no GPU nodes at that time" in result.stderr
    result = corral("capacity", "--clusters", str(clusters), "condor")
    assert result.returncode == 1 and "no cluster condor" in result.stderr
