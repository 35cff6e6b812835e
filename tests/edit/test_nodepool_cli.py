"""`corral nodepool ...` and `corral cluster new` through the command line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from corral.cli import app
from corral.model import load_fleet

runner = CliRunner()


def run(*args: str, clusters: Path):
    return runner.invoke(app, [*args, "--clusters", str(clusters)])


def snapshot(path: Path) -> tuple[bytes, int]:
    return path.read_bytes(), path.stat().st_mtime_ns


ADD_ARGS = {
    "heron": ["heron", "gpu-a10", "--provider", "aws", "--machine-type", "g5.12xlarge",
              "--zones", "us-west-2a,us-west-2b", "--min", "0", "--max", "20", "--spot",
              "--gpu-model", "A10G", "--gpu-count", "4", "--label", "corral.dev/tier=batch",
              "--taint", "corral.dev/spot=true:NoSchedule", "--reserved-for", "inference"],
    "ibis": ["ibis", "cpu-c3", "--provider", "gcp", "--machine-type", "c3-standard-88",
             "--zones", "us-central1-a", "--zones", "us-central1-b", "--max", "40", "--disk-size-gib", "300"],
    "jaguar": ["jaguar", "gpu-h200-sf1", "--provider", "onprem", "--site", "sf1",
               "--hosts", "gpu-[101:116].sf1.internal", "--hosts", "gpu-200.sf1.internal",
               "--gpu-model", "H200", "--gpu-count", "8", "--gpu-driver", "570.86.15", "--fabric-manager",
               "--roce-interface", "ens1f0np0,ens1f1np1", "--roce-mtu", "9000", "--pfc-priority", "3",
               "--dscp", "26", "--ecn", "--label", "corral.dev/rack=r20"],
}


@pytest.mark.parametrize("name", sorted(ADD_ARGS))
def test_add_prints_the_diff_and_writes(name, fleet_dir):
    path = fleet_dir / f"{name}.yaml"
    old = path.read_text()
    result = run("nodepool", "add", *ADD_ARGS[name], clusters=fleet_dir)
    assert result.exit_code == 0, result.output
    assert f"+++ b/{path}" in result.output
    new = path.read_text()
    assert new != old
    # Every original line is kept (insertions only, plus a reservation line for heron).
    old_lines = old.splitlines()
    kept = [l for l in new.splitlines() if l in old_lines]
    assert len(kept) >= len(old_lines) - (1 if name == "heron" else 0)
    pool = ADD_ARGS[name][1]
    cluster = load_fleet([fleet_dir]).clusters[name]
    assert cluster.pool(pool) is not None
    if name == "heron":
        assert [t.name for t in cluster.teams_reserving(pool)] == ["inference"]
    # Removing it again (heron: the reservation is the only other change).
    if name != "heron":
        result = run("nodepool", "remove", name, pool, clusters=fleet_dir)
        assert result.exit_code == 0, result.output
        assert path.read_text() == old


def test_refused_edit_leaves_the_file_untouched(fleet_dir):
    path = fleet_dir / "heron.yaml"
    before = snapshot(path)
    result = run("nodepool", "add", "heron", "bad", "--provider", "aws", "--machine-type", "Standard_D4s_v5",
                 "--min", "5", "--max", "2", clusters=fleet_dir)
    assert result.exit_code == 1
    assert "nodePools[3].machineType: 'Standard_D4s_v5' is not a aws machine type" in result.output
    assert "nodePools[3].minSize: minSize 5 is larger than maxSize 2" in result.output
    assert "heron.yaml (after the edit):" in result.output
    assert snapshot(path) == before
    assert [p.name for p in fleet_dir.iterdir() if p.name.startswith(".")] == []  # no temp file left


def test_host_clash_with_another_pool_is_refused(fleet_dir):
    path = fleet_dir / "jaguar.yaml"
    before = snapshot(path)
    result = run("nodepool", "add", "jaguar", "dup", "--provider", "onprem", "--site", "sf1",
                 "--hosts", "gpu-[060:070].sf1.internal", clusters=fleet_dir)
    assert result.exit_code == 1
    assert "already in pool 'gpu-h100-sf1'" in result.output
    assert snapshot(path) == before


def test_wrong_options_for_the_provider(fleet_dir):
    result = run("nodepool", "add", "jaguar", "x", "--provider", "onprem", "--machine-type", "foo", clusters=fleet_dir)
    assert result.exit_code == 1
    assert "--machine-type is for cloud pools" in result.output


def test_dry_run_writes_nothing(fleet_dir):
    path = fleet_dir / "heron.yaml"
    before = snapshot(path)
    result = run("nodepool", "scale", "heron", "gpu-a10g", "--max", "120", "--dry-run", clusters=fleet_dir)
    assert result.exit_code == 0, result.output
    assert "-    maxSize: 80" in result.output and "+    maxSize: 120" in result.output
    assert snapshot(path) == before


def test_scale(fleet_dir):
    result = run("nodepool", "scale", "heron", "gpu-a10g", "--min", "1", "--max", "120", clusters=fleet_dir)
    assert result.exit_code == 0, result.output
    pool = load_fleet([fleet_dir]).clusters["heron"].pool("gpu-a10g")
    assert (pool.min_size, pool.max_size) == (1, 120)
    result = run("nodepool", "scale", "jaguar", "gpu-h100-sf1", "--hosts", "gpu-[001:048].sf1.internal",
                 clusters=fleet_dir)
    assert result.exit_code == 0, result.output
    assert load_fleet([fleet_dir]).clusters["jaguar"].pool("gpu-h100-sf1").capacity == 48
    result = run("nodepool", "scale", "jaguar", "gpu-h100-sf1", "--max", "3", clusters=fleet_dir)
    assert result.exit_code == 1 and "use --hosts" in result.output
    result = run("nodepool", "scale", "heron", "nope", "--max", "3", clusters=fleet_dir)
    assert result.exit_code == 1 and "no pool named 'nope'" in result.output


def test_a_crlf_file_keeps_its_line_endings(fleet_dir):
    path = fleet_dir / "heron.yaml"
    original = path.read_bytes().replace(b"\r\n", b"\n").replace(b"\n", b"\r\n")
    path.write_bytes(original)
    result = run("nodepool", "scale", "heron", "gpu-a10g", "--max", "120", clusters=fleet_dir)
    assert result.exit_code == 0, result.output
    edited = path.read_bytes()
    assert edited.count(b"\n") == edited.count(b"\r\n") == original.count(b"\r\n")
    changed = [(a, b) for a, b in zip(original.split(b"\r\n"), edited.split(b"\r\n")) if a != b]
    assert changed == [(b"    maxSize: 80", b"    maxSize: 120")]


def test_remove_refuses_a_reserved_pool(fleet_dir):
    path = fleet_dir / "jaguar.yaml"
    before = snapshot(path)
    result = run("nodepool", "remove", "jaguar", "gpu-h100-robotics", clusters=fleet_dir)
    assert result.exit_code == 1
    assert "reserved by team robotics" in result.output
    assert snapshot(path) == before


def test_list(fleet_dir):
    result = runner.invoke(app, ["nodepool", "list", "jaguar", "--clusters", str(fleet_dir)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for expected in ("gpu-h100-sf1", "gpu-[001:064].sf1.internal", "robotics", "0-200", "8x H100"):
        assert expected in result.output


def test_cluster_new(fleet_dir, tmp_path):
    stacks = tmp_path / "stacks"
    args = ["cluster", "new", "kite", "--cloud", "gcp", "--region", "europe-west4", "--stacks", str(stacks)]
    result = run(*args, clusters=fleet_dir)
    assert result.exit_code == 0, result.output
    fleet = load_fleet([fleet_dir])  # still a valid fleet, with the new cluster
    kite = fleet.clusters["kite"]
    assert kite.control_plane.zones == ["europe-west4-a", "europe-west4-b", "europe-west4-c"]
    stack = (stacks / "Pulumi.kite.yaml").read_text()
    assert "gcp:region: europe-west4" in stack and "gcp:project:" in stack
    # Refuses to overwrite.
    result = run(*args, clusters=fleet_dir)
    assert result.exit_code == 1 and "already exists" in result.output
    # And takes pools right away.
    result = run("nodepool", "add", "kite", "cpu", "--provider", "gcp", "--machine-type", "n2-standard-32",
                 "--max", "10", clusters=fleet_dir)
    assert result.exit_code == 0, result.output
    assert load_fleet([fleet_dir]).clusters["kite"].pool("cpu").max_size == 10


def test_a_scaffolded_stack_file_with_its_placeholder_is_flagged_by_validate_and_plan(tmp_path):
    """`cluster new` leaves REPLACE-ME where only the user knows the value; validate and
    plan name the file, line and key until it is set."""
    clusters, stacks = tmp_path / "clusters", tmp_path / "stacks"
    result = run("cluster", "new", "kite", "--cloud", "gcp", "--region", "europe-west4", "--stacks", str(stacks),
                 clusters=clusters)
    assert result.exit_code == 0, result.output
    stack = stacks / "Pulumi.kite.yaml"
    line = stack.read_text().splitlines().index("  gcp:project: REPLACE-ME") + 1
    expected = f"{stack}:{line}:3: config.gcp:project: gcp:project is still REPLACE-ME"
    validate = runner.invoke(app, ["validate", "--clusters", str(clusters)], env={"COLUMNS": "300"})
    assert validate.exit_code == 1 and expected in validate.output, validate.output
    plan = runner.invoke(app, ["plan", "kite", "--clusters", str(clusters)], env={"COLUMNS": "300"})
    assert plan.exit_code != 0 and "gcp:project is still REPLACE-ME" in " ".join(plan.output.split()), plan.output
    stack.write_text(stack.read_text().replace("REPLACE-ME", "kite-prod-123"))
    validate = runner.invoke(app, ["validate", "--clusters", str(clusters)], env={"COLUMNS": "300"})
    assert validate.exit_code == 0, validate.output


@pytest.mark.parametrize("cloud,region,key", [("azure", "westus3", "azure-native:location: westus3"),
                                              ("aws", "eu-west-1", "aws:region: eu-west-1")])
def test_cluster_new_stack_files(fleet_dir, tmp_path, cloud, region, key):
    stacks = tmp_path / "stacks"
    result = run("cluster", "new", "kite", "--cloud", cloud, "--region", region, "--stacks", str(stacks),
                 clusters=fleet_dir)
    assert result.exit_code == 0, result.output
    assert key in (stacks / "Pulumi.kite.yaml").read_text()


def test_cli_start_up_does_not_import_pulumi():
    import subprocess
    import sys

    code = "import sys, corral.cli; corral.cli.app; print(any(m.startswith('pulumi') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ})
    assert out.stdout.strip() == "False"


# --- cluster names never leave --clusters ------------------------------------


def flat(output: str) -> str:
    """Output with rich's error box and line wrapping taken out."""
    return " ".join(re.sub("[\u2500-\u257f]", " ", output).split())


@pytest.mark.parametrize("args", [
    ["nodepool", "add", "../outside", "p1", "--provider", "aws", "--machine-type", "m7i.large", "--max", "1"],
    ["nodepool", "remove", "../outside", "cpu"],
    ["nodepool", "scale", "../outside", "cpu", "--max", "3"],
    ["nodepool", "list", "../outside"],
    ["show", "../outside"],
    ["inventory", "../outside"],
    ["cluster", "new", "../outside", "--cloud", "aws", "--region", "us-west-2"],
])
def test_cluster_names_cannot_escape_the_clusters_folder(fleet_dir, args):
    outside = fleet_dir.parent / "outside.yaml"
    outside.write_text((fleet_dir / "heron.yaml").read_text().replace("name: heron", "name: outside"))
    before = snapshot(outside)
    result = run(*args, clusters=fleet_dir)
    assert result.exit_code == 2, result.output
    assert "Invalid value for 'cluster': cluster name '../outside' must be a lower-case name" in flat(
        result.output).replace("'name'", "'cluster'")
    assert snapshot(outside) == before
    assert not (fleet_dir.parent / "stacks").exists()


@pytest.mark.parametrize("name", ["heron\n", "/etc/passwd", "HERON", "heron.yaml", ""])
def test_cluster_names_are_dns_labels(fleet_dir, name):
    result = run("show", name, clusters=fleet_dir)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output


def test_a_cluster_file_linking_out_of_the_folder_is_refused(fleet_dir):
    outside = fleet_dir.parent / "elsewhere.yaml"
    outside.write_text((fleet_dir / "heron.yaml").read_text())
    (fleet_dir / "heron.yaml").unlink()
    (fleet_dir / "heron.yaml").symlink_to(outside)
    before = snapshot(outside)
    result = run("nodepool", "scale", "heron", "cpu-m7i", "--max", "3", clusters=fleet_dir)
    assert result.exit_code == 1, result.output
    assert "leads outside" in result.output
    assert snapshot(outside) == before


def test_too_deep_a_file_is_refused_by_edits_before_parsing(fleet_dir):
    path = fleet_dir / "heron.yaml"
    path.write_text(path.read_text() + "extra: " + "[" * 40_000 + "]" * 40_000 + "\n")
    before = snapshot(path)
    # In a process of its own: the C loader used to crash on such a file.
    result = subprocess.run(
        [sys.executable, "-m", "corral", "nodepool", "scale", "heron", "cpu-m7i", "--max", "3",
         "--clusters", str(fleet_dir)],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 1, (result.returncode, result.stderr[-2000:])
    assert "nested deeper than" in flat(result.stderr) and "Traceback" not in result.stderr
    assert snapshot(path) == before


@pytest.mark.parametrize("option, value, message", [
    ("--region", "us-west-2\ndescription: x", "--region: 'us-west-2\\ndescription: x' must be a region name"),
    ("--zones", "us-west-2a\n#", "--zones: 'us-west-2a\\n#' must be a zone name"),
    ("--network-cidr", "not-a-network", "--network-cidr: 'not-a-network' is not a network in CIDR form"),
    ("--network-cidr", "52.0.0.0/20", "--network-cidr: 52.0.0.0/20 is not a private network"),
])
def test_cluster_new_checks_its_options_before_writing_text(fleet_dir, tmp_path, option, value, message):
    args = {"--region": "us-west-2", option: value}
    result = run("cluster", "new", "kite", "--cloud", "aws", *[x for kv in args.items() for x in kv],
                 "--stacks", str(tmp_path / "stacks"), clusters=fleet_dir)
    assert result.exit_code == 1, result.output
    assert message in flat(result.output)
    assert "Traceback" not in result.output and result.exception is None or isinstance(result.exception, SystemExit)
    assert not (fleet_dir / "kite.yaml").exists()


# --- GPU machine types bring their GPUs (corral/model/gpu_catalog.py) ----------------------


def test_add_on_a_gpu_machine_type_writes_its_gpu_block(fleet_dir):
    path = fleet_dir / "heron.yaml"
    result = run("nodepool", "add", "heron", "gpu-h100", "--provider", "aws", "--machine-type", "p5.48xlarge",
                 "--max", "4", clusters=fleet_dir)
    assert result.exit_code == 0, result.output
    # The file says what the pool runs, not only the model in memory.
    assert "+    gpu: {model: H100, count: 8, fabricManager: true}\n" in result.output
    assert "    gpu: {model: H100, count: 8, fabricManager: true}\n" in path.read_text()
    gpu = load_fleet([fleet_dir]).clusters["heron"].pool("gpu-h100").gpu
    assert (gpu.model, gpu.count, gpu.fabric_manager) == ("H100", 8, True)


def test_add_keeps_given_gpu_fields_and_fills_the_rest(fleet_dir):
    # 4 x L4 has no published all-reduce baseline: heron's burn-in needs a floor for it (docs/gpu-health.md).
    heron = fleet_dir / "heron.yaml"
    heron.write_text(heron.read_text().replace("ncclMinBusGBps: {", "ncclMinBusGBps: {L4: 0, ", 1))
    result = run("nodepool", "add", "heron", "gpu-l4", "--provider", "aws", "--machine-type", "g6.12xlarge",
                 "--max", "4", "--gpu-driver", "570.86.15", clusters=fleet_dir)
    assert result.exit_code == 0, result.output
    assert "    gpu: {model: L4, count: 4, driver: 570.86.15}\n" in (fleet_dir / "heron.yaml").read_text()


def test_add_with_the_wrong_gpu_count_is_refused(fleet_dir):
    path = fleet_dir / "heron.yaml"
    before = snapshot(path)
    result = run("nodepool", "add", "heron", "gpu-h100", "--provider", "aws", "--machine-type", "p5.48xlarge",
                 "--max", "4", "--gpu-count", "4", clusters=fleet_dir)
    assert result.exit_code == 1
    assert "nodePools[3].gpu.count: p5.48xlarge has 8 H100 (80 GiB each, NVSwitch), not 4 GPUs" in flat(result.output)
    assert snapshot(path) == before


def test_add_on_a_cpu_machine_type_writes_no_gpu_block(fleet_dir):
    result = run("nodepool", "add", "heron", "cpu-c7i", "--provider", "aws", "--machine-type", "c7i.8xlarge",
                 "--max", "4", clusters=fleet_dir)
    assert result.exit_code == 0, result.output
    assert load_fleet([fleet_dir]).clusters["heron"].pool("cpu-c7i").gpu is None
