"""scripts/tiers.py, the README's test command's tier runner: its counts, its table, its choices."""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("tiers", ROOT / "scripts" / "tiers.py")
tiers = importlib.util.module_from_spec(spec)
sys.modules["tiers"] = tiers  # dataclasses look their module up
spec.loader.exec_module(tiers)

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="1" failures="2" skipped="3" tests="20" time="1.0"/></testsuites>
"""


def test_counts_come_from_the_junit_report_and_errors_count_as_failures(tmp_path):
    report = tmp_path / "unit.xml"
    report.write_text(JUNIT)
    assert tiers.counts(report) == (14, 3, 3)
    assert tiers.counts(tmp_path / "missing.xml") == (0, 0, 0)


def test_table_ends_with_the_total():
    results = [tiers.Result("unit", 300.0, 0, 900, 0, 5), tiers.Result("hostlab", 600.5, 1, 70, 1, 0)]
    text = tiers.table(results, 912.0, 11.0, overlapped=False)
    lines = text.strip().splitlines()
    assert lines[2].split() == ["(install)", "0m11.0s"]
    assert lines[-1].split() == ["total", "15m12.0s", "970", "1", "5"]
    assert "FAILED (exit 1)" in text


def test_an_unknown_tier_is_refused_with_the_known_ones(capsys):
    assert tiers.main(["integration"]) == 2
    assert "no tier integration (tiers: unit, hostlab, quickstart, kube)" in capsys.readouterr().err


def test_the_quick_loop_is_the_whole_unit_tier_in_parallel():
    (unit,) = tiers.tiers(["unit"])
    assert unit.args == ["-m", "not hostlab and not quickstart and not kube"] and unit.parallel_args == ["-n", "auto"]


def test_the_unit_tier_moves_into_the_quickstart_only_where_that_runs_the_committed_tree(monkeypatch):
    import tests.quickstart.freshroot as freshroot

    monkeypatch.setattr(freshroot, "available", lambda: (True, "ok"))
    monkeypatch.setattr(tiers, "tracked_changes", lambda: False)
    unit = tiers.tiers(list(tiers.TIER_NAMES))[0]
    assert unit.args == ["-m", "root and not hostlab and not quickstart and not kube"]
    monkeypatch.setattr(tiers, "tracked_changes", lambda: True)
    assert tiers.tiers(list(tiers.TIER_NAMES))[0].args == ["-m", "not hostlab and not quickstart and not kube"]
    monkeypatch.setattr(freshroot, "available", lambda: (False, "needs root"))
    monkeypatch.setattr(tiers, "tracked_changes", lambda: False)
    assert tiers.tiers(list(tiers.TIER_NAMES))[0].args == ["-m", "not hostlab and not quickstart and not kube"]


def test_every_root_only_unit_test_is_marked_root():
    """A unit test that skips without root must carry the `root` marker, or the tier runner
    (which runs the unit tier as a normal user in the quickstart) would run it nowhere."""
    unmarked = []
    for path in (ROOT / "tests").rglob("test_*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef):
                continue
            decorators = [ast.unparse(d) for d in node.decorator_list]
            needs_root = any("skipif" in d and re.search(r"geteuid\(\) != 0", d) for d in decorators)
            marked = any(d in ("pytest.mark.root", "pytest.mark.hostlab", "pytest.mark.slow") for d in decorators)
            module_marked = re.search(r"pytestmark = .*pytest\.mark\.(hostlab|quickstart|slow)", path.read_text(), re.S)
            if needs_root and not marked and not module_marked:
                unmarked.append(f"{path.relative_to(ROOT)}::{node.name}")
    assert not unmarked, unmarked


def test_scripts_test_runs_the_tiers_and_its_quick_loop_is_the_unit_tier():
    text = (ROOT / "scripts" / "test").read_text()
    assert '"") exec .venv/bin/python scripts/tiers.py ;;' in text
    assert "--quick) exec .venv/bin/python scripts/tiers.py unit ;;" in text
