"""`corral upgrade NAME --plan`: the chain of one-minor upgrades and what each step changes,
offline, from the cluster file and the version catalog (corral/upgrade/chain.py)."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pytest
from typer.testing import CliRunner

from corral.cli import app
from corral.model import load_fleet
from corral.model.versions import ETCD_MEMBER, MINORS
from corral.upgrade.chain import describe_chain, upgrade_chain
from corral.upgrade.versions import UpgradeError

ROOT = Path(__file__).resolve().parents[2]
FLEET = load_fleet([ROOT / "clusters"])
runner = CliRunner()


def test_one_step_per_minor_each_to_the_newest_patch_known_and_the_last_to_the_file():
    steps = upgrade_chain(FLEET.clusters["ibis"], "1.31.4")
    assert [s.version for s in steps][-2:] == ["1.35.9", "1.36.4"]
    assert len(steps) == 5
    assert steps[0].version == f"1.32.{MINORS['1.32'].latest_patch}"


def test_a_step_names_what_moves_with_the_minor():
    (step,) = upgrade_chain(FLEET.clusters["ibis"], "1.35.9")
    assert step.changes == ("pause image 3.10.1 -> 3.10.2", "kube-state-metrics v2.19.1 -> v2.20.0",
                            "cluster-autoscaler v1.35.2 -> v1.36.1")
    assert step.blockers == ()


def test_containerd_moves_to_2_with_its_config_layout_where_the_old_line_stops():
    steps = upgrade_chain(FLEET.clusters["heron"], "1.30.8")
    moves = [(s.version, c) for s in steps for c in s.changes if c.startswith("containerd ")]
    assert len(moves) == 1
    version, change = moves[0]
    assert change.startswith("containerd 1.7.27 -> 2.3.6: not moved by `corral upgrade`")
    assert "`corral join` installs it on the on-prem nodes, rewrites its config in layout 4 (was 2)" in change
    # The first minor 1.7.27 does not support (containerd RELEASES.md: 1.34 wants 1.7.28+).
    assert version.startswith("1.34.")


def test_an_etcd_below_kubeadms_floor_blocks_the_step_that_needs_it():
    steps = upgrade_chain(FLEET.clusters["ibis"], "1.34.8", etcd_version="3.5.17")
    assert steps[0].version == "1.35.9"
    (blocker,) = [b for b in steps[0].blockers if b.startswith("etcd members")]
    assert "below kubeadm 1.35's minimum for an external etcd (3.5.24-0)" in blocker
    assert f"then to {ETCD_MEMBER.value}" in blocker
    assert not [b for s in upgrade_chain(FLEET.clusters["ibis"], "1.34.8") for b in s.blockers if "etcd" in b]


def test_coscheduling_blocks_the_first_minor_without_scheduler_plugins(tmp_path):
    text = (ROOT / "clusters" / "jaguar.yaml").read_text()
    text = text.replace('version: "1.36.4"', 'version: "1.31.4"').replace(
        "  binPacking: true\n", "  binPacking: true\n  coscheduling: true\n")
    (tmp_path / "jaguar.yaml").write_text(text)
    jaguar = load_fleet([tmp_path]).clusters["jaguar"]
    steps = upgrade_chain(jaguar, "1.31.4", "1.35.9")
    blocked = [s.version for s in steps if any(b.startswith("scheduling.coscheduling") for b in s.blockers)]
    assert blocked and blocked[0].startswith("1.35.")


def test_the_description_marks_minors_past_their_end_of_life():
    steps = upgrade_chain(FLEET.clusters["ibis"], "1.34.8")
    lines = describe_chain("ibis", "1.34.8", steps, date(2026, 12, 7))
    assert lines[0] == "ibis: Kubernetes 1.34.8 -> 1.36.4, 2 steps (kubeadm upgrades one minor at a time)"
    assert lines[1] == "1. corral upgrade ibis --to 1.35.9  (in support to 2027-02-28)"
    late = describe_chain("ibis", "1.34.8", steps, date(2027, 3, 1))
    assert late[1].endswith("(end of life 2027-02-28: pass through, do not stay)")


def test_a_patch_release_is_one_step_and_the_same_version_none():
    (step,) = upgrade_chain(FLEET.clusters["ibis"], "1.36.3")
    assert step.version == "1.36.4" and step.changes == ()
    assert upgrade_chain(FLEET.clusters["ibis"], "1.36.4") == []


@pytest.mark.parametrize(("start", "message"), [
    ("1.37.0", "older than 1.37.0: corral does not downgrade"),
    ("1.20.1", "corral knows Kubernetes"),
    ("one.two", "is not a Kubernetes version"),
])
def test_refusals(start, message):
    with pytest.raises(UpgradeError, match=message):
        upgrade_chain(FLEET.clusters["ibis"], start)


def test_the_command_prints_the_chain_and_fails_while_a_step_is_blocked():
    ok = runner.invoke(app, ["upgrade", "ibis", "--plan", "--from", "1.35.9", "--clusters", str(ROOT / "clusters")])
    assert ok.exit_code == 0, ok.output
    assert ok.stdout.splitlines()[1] == "1. corral upgrade ibis --to 1.36.4  (in support to 2027-06-28)"
    blocked = runner.invoke(app, ["upgrade", "ibis", "--plan", "--from", "1.34.8", "--etcd-version", "3.5.17",
                                  "--clusters", str(ROOT / "clusters")])
    assert blocked.exit_code == 1 and "BLOCKED until: etcd members at 3.5.17" in blocked.stdout
    neither = runner.invoke(app, ["upgrade", "ibis", "--plan", "--clusters", str(ROOT / "clusters")])
    assert neither.exit_code == 1 and "--plan needs --from VERSION" in neither.output
    assert "Traceback" not in neither.output
