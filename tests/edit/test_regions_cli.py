"""`corral cluster new` and `corral nodepool add` refuse regions and zones the cloud lacks (issue 26 item 2)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from corral.cli import app
from corral.model import load_fleet

runner = CliRunner()


def new(fleet_dir, tmp_path, *args: str):
    stacks = tmp_path / "stacks"
    result = runner.invoke(app, ["cluster", "new", "kite", *args, "--stacks", str(stacks),
                                 "--clusters", str(fleet_dir)], env={"COLUMNS": "300"})
    return result, stacks


@pytest.mark.parametrize("args, message", [
    (["--cloud", "aws", "--region", "us-east-9"], "--region: unknown AWS region 'us-east-9'; did you mean us-east-"),
    (["--cloud", "gcp", "--region", "eastus2"], "--region: eastus2 is an Azure region; this cluster's cloud is gcp"),
    (["--cloud", "aws", "--region", "us-eats-1"], "--region: unknown AWS region 'us-eats-1'; did you mean us-east-1?"),
    (["--cloud", "aws", "--region", "us-east-1", "--zones", "us-east-1a,us-east-1q"],
     "--zones: 'us-east-1q' is not a zone of us-east-1; its zones are us-east-1a, us-east-1b"),
    (["--cloud", "azure", "--region", "westus"], "--region: Azure region westus has no availability zones"),
])
def test_cluster_new_refuses_before_writing_anything(fleet_dir, tmp_path, args, message):
    before = sorted(p.name for p in fleet_dir.iterdir())
    result, stacks = new(fleet_dir, tmp_path, *args)
    assert result.exit_code == 1
    assert message in " ".join(result.output.split()), result.output
    assert sorted(p.name for p in fleet_dir.iterdir()) == before
    assert not stacks.exists()


def test_cluster_new_takes_the_zones_the_region_has(fleet_dir, tmp_path):
    """us-east1 has no zone a: the scaffold used to write us-east1-a."""
    result, _ = new(fleet_dir, tmp_path, "--cloud", "gcp", "--region", "us-east1")
    assert result.exit_code == 0, result.output
    assert load_fleet([fleet_dir]).clusters["kite"].control_plane.zones == ["us-east1-b", "us-east1-c", "us-east1-d"]


def test_nodepool_add_refuses_a_zone_the_region_lacks(fleet_dir):
    heron = fleet_dir / "heron.yaml"
    before = heron.read_bytes()
    result = runner.invoke(app, ["nodepool", "add", "heron", "cpu2", "--provider", "aws", "--machine-type",
                                 "m7i.2xlarge", "--zones", "us-west-2q", "--max", "3", "--clusters", str(fleet_dir)],
                           env={"COLUMNS": "300"})
    assert result.exit_code == 1
    assert "nodePools[3].zones[0]: 'us-west-2q' is not a zone of us-west-2; its zones are us-west-2a, us-west-2b, " \
           "us-west-2c, us-west-2d" in " ".join(result.output.split())
    assert heron.read_bytes() == before


def test_cluster_new_refuses_a_network_that_overlaps_the_fleet(fleet_dir, tmp_path):
    result, stacks = new(fleet_dir, tmp_path, "--cloud", "aws", "--region", "us-east-1", "--network-cidr",
                         "10.50.0.0/20")
    assert result.exit_code == 1
    assert "overlaps cluster jaguar's sites[sf1].cidrs 10.50.0.0/16" in " ".join(result.output.split())
    assert not (fleet_dir / "kite.yaml").exists() and not stacks.exists()
