"""`corral site add` through the command line: round trip, validated with the fleet, atomic, idempotent."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from corral.cli import app
from corral.model import load_fleet

runner = CliRunner()


def run(*args: str, clusters: Path):
    return runner.invoke(app, ["site", "add", *args, "--clusters", str(clusters)], env={"COLUMNS": "300"})


def snapshot(path: Path) -> tuple[bytes, int]:
    return path.read_bytes(), path.stat().st_mtime_ns


def flat(text: str) -> str:
    return " ".join(text.replace("│", " ").split())


def test_adds_a_site_after_the_others_keeping_every_comment(fleet_dir):
    path = fleet_dir / "jaguar.yaml"
    before = path.read_text()
    result = run("jaguar", "--name", "sf2", "--cidr", "10.60.0.0/16,10.61.0.0/16",
                 "--peer-address", "203.0.113.20", "--bgp-asn", "65020", clusters=fleet_dir)
    assert result.exit_code == 0, result.output
    after = path.read_text()
    # Only lines added: every comment and byte of the file before stays.
    added = "\n  - name: sf2\n    cidrs: [10.60.0.0/16, 10.61.0.0/16]\n    vpn: {peerAddress: 203.0.113.20, bgpASN: 65020}\n"
    assert after == before.replace("\n\nnetwork:", "\n" + added + "\nnetwork:", 1)
    site = load_fleet([fleet_dir]).clusters["jaguar"].sites[-1]
    assert site.name == "sf2" and [str(c) for c in site.cidrs] == ["10.60.0.0/16", "10.61.0.0/16"]
    assert str(site.vpn.peer_address) == "203.0.113.20" and site.vpn.bgp_asn == 65020


def test_a_cluster_without_sites_gets_the_section(fleet_dir):
    path = fleet_dir / "heron.yaml"
    before = path.read_text()
    result = run("heron", "--name", "dc1", "--cidr", "10.99.0.0/16", clusters=fleet_dir)
    assert result.exit_code == 0, result.output
    assert path.read_text().startswith(before)
    assert path.read_text().endswith("sites:\n  - name: dc1\n    cidrs: [10.99.0.0/16]\n")


def test_adding_the_same_site_twice_says_so_and_changes_nothing(fleet_dir):
    path = fleet_dir / "jaguar.yaml"
    args = ("jaguar", "--name", "sf2", "--cidr", "10.60.0.0/16")
    assert run(*args, clusters=fleet_dir).exit_code == 0
    written = snapshot(path)
    again = run(*args, clusters=fleet_dir)
    assert again.exit_code == 0
    assert "site 'sf2' is already there as asked; nothing changed" in flat(again.output)
    assert snapshot(path) == written
    # The same name with other networks is a mistake, not a no-op.
    other = run("jaguar", "--name", "sf2", "--cidr", "10.70.0.0/16", clusters=fleet_dir)
    assert other.exit_code == 1
    assert "site 'sf2' already exists with other settings" in flat(other.output)
    assert snapshot(path) == written


@pytest.mark.parametrize("args, message", [
    # A public network without --allow-public-cidrs (corral/model/rules.py).
    (["heron", "--name", "dc1", "--cidr", "8.8.8.0/24"], "sites[0].cidrs[0]: 8.8.8.0/24 is not a private network"),
    # jaguar's site sf1 already has 10.50.0.0/16 (the fleet rules, corral/model/fleet_rules.py).
    (["heron", "--name", "dc1", "--cidr", "10.50.0.0/16"], "overlaps cluster jaguar's sites[0].cidrs[0] (site sf1)"),
    # heron's own VPC.
    (["jaguar", "--name", "sf2", "--cidr", "10.0.0.0/8"], "10.0.0.0/8 overlaps"),
])
def test_a_site_that_breaks_the_network_rules_is_refused_with_file_and_line(fleet_dir, args, message):
    path = fleet_dir / f"{args[0]}.yaml"
    before = snapshot(path)
    result = run(*args, clusters=fleet_dir)
    assert result.exit_code == 1, result.output
    text = flat(result.output)
    assert message in text
    assert f"{path} (after the edit):" in text and "is unchanged" in text
    assert "Traceback" not in result.output
    assert snapshot(path) == before


def test_public_networks_when_the_site_says_so(fleet_dir):
    result = run("heron", "--name", "dc1", "--cidr", "198.51.100.0/24", "--allow-public-cidrs", clusters=fleet_dir)
    assert result.exit_code == 0, result.output
    assert load_fleet([fleet_dir]).clusters["heron"].sites[0].allow_public_cidrs is True


@pytest.mark.parametrize("args, message", [
    (["heron", "--name", "dc1", "--cidr", "10.99.0.0/16", "--peer-address", "203.0.113.9"],
     "give both --peer-address and --bgp-asn"),
    (["heron", "--name", "Bad_Name", "--cidr", "10.99.0.0/16"], "sites[0].name"),
    (["heron", "--name", "dc1", "--cidr", "10.99.0.300/16"], "sites[0].cidrs[0]"),
    (["heron", "--name", "dc1", "--cidr", "10.99.0.0/16", "--peer-address", "not-an-ip", "--bgp-asn", "65000"],
     "sites[0].vpn.peerAddress"),
])
def test_bad_values_are_one_message(fleet_dir, args, message):
    path = fleet_dir / "heron.yaml"
    before = snapshot(path)
    result = run(*args, clusters=fleet_dir)
    assert result.exit_code in (1, 2), result.output
    assert message in flat(result.output)
    assert "Traceback" not in result.output
    assert snapshot(path) == before


def test_dry_run_writes_nothing(fleet_dir):
    path = fleet_dir / "jaguar.yaml"
    before = snapshot(path)
    result = run("jaguar", "--name", "sf2", "--cidr", "10.60.0.0/16", "--dry-run", clusters=fleet_dir)
    assert result.exit_code == 0
    assert "+  - name: sf2" in result.output
    assert snapshot(path) == before
