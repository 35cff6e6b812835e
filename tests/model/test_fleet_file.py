"""The fleet file (corral/model/fleet.py): its shape and the rules across it and the cluster files, each at file:line."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.model import ValidationFailed
from corral.model.fleet import FLEET_FILE, load_fleet_file

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_FLEET = ROOT / FLEET_FILE

FLEET = """\
apiVersion: corral.dev/v1
kind: Fleet
name: research
multiKueue:
  manager: {manager}
  workers: {workers}
  teams: {teams}
"""


def folder(tmp_path: Path, edits: dict[str, tuple[str, str]] | None = None) -> Path:
    """A copy of the example clusters, with `old` replaced by `new` in the named files."""
    clusters = tmp_path / "clusters"
    clusters.mkdir(exist_ok=True)
    for path in sorted((ROOT / "clusters").glob("*.yaml")):
        text = path.read_text()
        name = path.stem
        if edits and name in edits:
            old, new = edits[name]
            assert old in text, (name, old)
            text = text.replace(old, new, 1)
        (clusters / path.name).write_text(text)
    return clusters


def fleet_problems(tmp_path: Path, text: str, clusters: Path | None = None) -> list[str]:
    clusters = clusters or folder(tmp_path)
    path = tmp_path / FLEET_FILE
    path.write_text(text)
    try:
        load_fleet_file(path, clusters)
    except ValidationFailed as failed:
        return [str(p).replace(str(tmp_path) + "/", "") for p in failed.problems]
    return []


def line_in(text: str, needle: str) -> int:
    return next(n for n, line in enumerate(text.splitlines(), 1) if needle in line)


def test_unknown_and_missing_keys_are_reported_at_their_lines(tmp_path):
    text = FLEET.format(manager="heron", workers="[jaguar, ibis]", teams="[robotics]") + "  jobKindz: []\n"
    text = text.replace("name: research\n", "")
    found = fleet_problems(tmp_path, text)
    assert found[0] == "fleet.yaml:1:1: name: required field is missing"
    assert found[1] == "fleet.yaml:7:3: multiKueue.jobKindz: unknown key 'jobKindz' (did you mean 'jobKinds'?)"
    assert len(found) == 2


def test_a_worker_that_is_no_cluster_file_names_the_folder_and_the_clusters(tmp_path):
    text = FLEET.format(manager="heron", workers="[jaguar, ibsi]", teams="[robotics]")
    found = [p for p in fleet_problems(tmp_path, text) if "ibsi" in p]
    assert found == [
        f"fleet.yaml:{line_in(text, 'workers')}:21: multiKueue.workers[1]: no cluster 'ibsi' in "
        f"{tmp_path}/clusters (did you mean 'ibis'? clusters: heron, ibis, jaguar)".replace(str(tmp_path) + "/", "")
    ]


def test_the_manager_may_not_be_its_own_worker(tmp_path):
    text = FLEET.format(manager="heron", workers="[jaguar, heron]", teams="[robotics]")
    found = [p for p in fleet_problems(tmp_path, text) if "workers[1]" in p]
    assert len(found) == 1
    assert found[0].startswith("fleet.yaml:6:21: multiKueue.workers[1]: 'heron' is the manager: Kueue does not "
                               "support a manager that is a worker of itself")


def test_repeated_workers_and_a_bad_timeout_are_shape_errors(tmp_path):
    text = FLEET.format(manager="heron", workers="[jaguar, jaguar]", teams="[robotics]") + \
        "  workerLostTimeout: 15 minutes\n"
    found = fleet_problems(tmp_path, text)
    assert found == [
        "fleet.yaml:6:3: multiKueue.workers: 'jaguar' listed more than once",
        "fleet.yaml:8:3: multiKueue.workerLostTimeout: '15 minutes' must be a duration like 15m, 1h or 1h30m",
    ]


def test_a_cluster_without_kueue_is_named_with_its_file_and_line(tmp_path):
    text = FLEET.format(manager="heron", workers="[jaguar, ibis]", teams="[robotics]")
    clusters = folder(tmp_path, {"ibis": ("  kueue:", "  kueue_off:")}) if "  kueue:" in \
        (ROOT / "clusters/ibis.yaml").read_text() else folder(tmp_path)
    ibis = (clusters / "ibis.yaml").read_text()
    if "  kueue_off:" in ibis:  # the example runs Kueue: take it out of scheduling
        (clusters / "ibis.yaml").write_text(_without_kueue(ibis))
        ibis = (clusters / "ibis.yaml").read_text()
    found = [p for p in fleet_problems(tmp_path, text, clusters) if "does not run Kueue" in p and "ibis" in p]
    assert found == [
        (f"fleet.yaml:6:21: multiKueue.workers[1]: cluster ibis does not run Kueue: set scheduling.kueue.enabled: "
        f"true in clusters/ibis.yaml:{line_in(ibis, 'scheduling:')}; MultiKueue needs Kueue on the manager and "
        "every worker")
    ]


def _without_kueue(text: str) -> str:
    """The scheduling.kueue block of a cluster file, removed (its indented lines)."""
    lines, out, skipping = text.splitlines(keepends=True), [], False
    for line in lines:
        if line.startswith("  kueue_off:"):
            skipping = True
            continue
        if skipping and line.startswith("    "):
            continue
        skipping = False
        out.append(line)
    return "".join(out)


def test_a_dispatched_team_missing_on_a_worker_or_the_manager(tmp_path):
    text = FLEET.format(manager="heron", workers="[jaguar, ibis]", teams="[vision]")
    found = [p for p in fleet_problems(tmp_path, text) if "vision" in p]
    heron, jaguar = (ROOT / "clusters/heron.yaml").read_text(), (ROOT / "clusters/jaguar.yaml").read_text()
    assert f"fleet.yaml:7:11: multiKueue.teams[0]: team 'vision' is not a team of the manager heron " \
           f"(clusters/heron.yaml:{line_in(heron, 'scheduling:')}): its namespaces and queues are where the team " \
           "submits" in found
    assert f"fleet.yaml:7:11: multiKueue.teams[0]: team 'vision' is not a team of worker jaguar " \
           f"(clusters/jaguar.yaml:{line_in(jaguar, 'scheduling:')}): MultiKueue creates the team's jobs in the " \
           "same namespace and queue on the worker, which must exist there" in found


def test_not_a_fleet_file(tmp_path):
    assert fleet_problems(tmp_path, "- a\n- list\n") == ["fleet.yaml:1:1: (file): a fleet file must be a YAML mapping"]
    cluster = (ROOT / "clusters/heron.yaml").read_text()
    assert fleet_problems(tmp_path, cluster) == [
        f"fleet.yaml:{line_in(cluster, 'kind: Cluster')}:1: kind: this is a cluster file; a fleet file has kind: Fleet"]


def test_a_missing_fleet_file_is_one_problem(tmp_path):
    with pytest.raises(ValidationFailed) as failed:
        load_fleet_file(tmp_path / "nope.yaml", ROOT / "clusters")
    assert [str(p) for p in failed.value.problems] == [
        f"{tmp_path}/nope.yaml:1:1: (file): no such file (a fleet file: docs/scheduling.md)"]


def test_the_fleet_file_gets_the_cluster_files_size_and_depth_limits(tmp_path):
    deep = "a: " + "[" * 100 + "]" * 100 + "\n"
    found = fleet_problems(tmp_path, deep)
    assert len(found) == 1 and "nested deeper than 64 levels" in found[0]


def test_cluster_file_problems_are_reported_as_corral_validate_reports_them(tmp_path):
    clusters = folder(tmp_path, {"heron": ("name: heron", "name: heron\nbogus: 1")})
    text = FLEET.format(manager="heron", workers="[jaguar, ibis]", teams="[robotics]")
    found = fleet_problems(tmp_path, text, clusters)
    assert any(p.startswith("clusters/heron.yaml:") and "unknown key 'bogus'" in p for p in found)


def test_the_example_fleet_is_hybrid_and_valid_over_the_example_clusters():
    from corral.manifests.multikueue import manager_objects, workers_agree
    from tests.manifests.kueue_schema import validate_kueue_object

    fleet = load_fleet_file(EXAMPLE_FLEET, ROOT / "clusters")
    onprem = [w.name for w in fleet.workers if any(p.provider == "onprem" for p in w.node_pools)]
    cloud_only = [w.name for w in fleet.workers if all(p.provider != "onprem" for p in w.node_pools)]
    assert len(fleet.workers) >= 2 and onprem and cloud_only, "hybrid: an on-prem-heavy worker and a cloud one"
    assert fleet.manager.name not in fleet.spec.multi_kueue.workers
    assert workers_agree(fleet) == []
    kueue_objects = [o for o in manager_objects(fleet) if o["apiVersion"].startswith("kueue.x-k8s.io/")]
    assert [p for o in kueue_objects for p in validate_kueue_object(o)] == []


# --- corral validate checks the fleet file too ------------------------------------


def test_corral_validate_checks_the_fleet_file_beside_the_clusters_and_one_named(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from corral.cli import app

    clusters = folder(tmp_path)
    (tmp_path / FLEET_FILE).write_text(EXAMPLE_FLEET.read_text())
    monkeypatch.chdir(tmp_path)
    beside = CliRunner().invoke(app, ["validate", "--clusters", str(clusters)])
    assert beside.exit_code == 0, beside.output
    assert "ok fleet.yaml: fleet research (MultiKueue manager heron, workers jaguar, ibis)" in beside.output
    # Named on the command line it is read as a fleet file, not refused as a cluster file.
    broken = tmp_path / "other.yaml"
    broken.write_text(EXAMPLE_FLEET.read_text().replace("manager: heron", "manager: heronn"))
    named = CliRunner().invoke(app, ["validate", str(broken), "--clusters", str(clusters)])
    assert named.exit_code == 1
    assert f"{broken}:" in named.output and "multiKueue.manager: no cluster 'heronn'" in named.output
    assert "unknown key" not in named.output and "Traceback" not in named.output
