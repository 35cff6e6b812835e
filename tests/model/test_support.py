"""`corral validate` judges end of life on a day: the cluster's Kubernetes minor, its
containerd line and each GPU pool's NVIDIA driver branch, against the version catalog
(corral/model/support.py, docs/versions.md "End of life"). `--on` pins the day here; the
test of the examples on the real clock (test_schema_and_cli.py) is the one that fails in CI
the day one of their pins leaves support."""

from __future__ import annotations

from datetime import date

import pytest
from typer.testing import CliRunner

from corral.cli import app
from corral.model import load_cluster
from corral.model.support import containerd_problem, driver_problem, support_findings
from corral.model.versions import MINORS, SUPPORTED_MINORS

from .helpers import example, line_of

runner = CliRunner()


def fleet(tmp_path, **edits: tuple[str, str]):
    """The example clusters in a folder of their own, each with (old, new) text edits."""
    folder = tmp_path / "clusters"
    folder.mkdir()
    for name in ("heron", "ibis", "jaguar"):
        text = example(name)
        for old, new in edits.get(name, ()):
            assert old in text, f"{old!r} not in {name}.yaml"
            text = text.replace(old, new)
        (folder / f"{name}.yaml").write_text(text)
    return folder


def validate(folder, *args: str):
    return runner.invoke(app, ["validate", "--clusters", str(folder), *args])


def test_the_examples_are_in_support_today_and_refused_the_day_after_heron_leaves(tmp_path):
    folder = fleet(tmp_path)
    ok = validate(folder, "--on", "2026-12-07")
    assert ok.exit_code == 0, ok.output
    assert "warning" not in ok.stderr
    heron_eol = MINORS["1.35"].end_of_life
    late = validate(folder, "--on", str(date.fromordinal(heron_eol.toordinal() + 1)))
    assert late.exit_code == 1
    line = line_of("heron", 'version: "1.35.9"')
    assert (f"{folder}/heron.yaml:{line}:14: kubernetes.version: Kubernetes 1.35 reached its end of life on "
            "2027-02-28; upgrade to 1.36 or later: corral upgrade heron --to 1.36.x (one minor at a time: "
            "kubeadm skips none)") in late.stdout
    assert "ibis.yaml" not in late.stdout and "1 problem in 1 file" in late.stderr


def test_sixty_days_before_the_end_is_a_warning_not_a_refusal(tmp_path):
    result = validate(fleet(tmp_path), "--on", "2027-01-10")
    assert result.exit_code == 0, result.output
    assert ("warning: " in result.stderr and "heron.yaml" in result.stderr
            and "Kubernetes 1.35 reaches its end of life on 2027-02-28 (in 49 days); plan the upgrade to 1.36: "
                "corral upgrade heron --to 1.36.x" in result.stderr)
    assert result.stdout.count("ok ") == 3  # every cluster is still ok


def test_an_end_of_life_minor_is_refused_with_every_step_of_the_upgrade(tmp_path):
    folder = fleet(tmp_path, ibis=[('version: "1.36.4"', 'version: "1.31.4"')])
    result = validate(folder, "--on", "2026-12-07")
    assert result.exit_code == 1
    assert ("kubernetes.version: Kubernetes 1.31 reached its end of life on 2025-10-28; upgrade to 1.35 or "
            "later: corral upgrade ibis --to 1.32.x, then to 1.33.x, 1.34.x, 1.35.x") in result.stdout


def test_a_driver_branch_nvidia_no_longer_supports_is_refused_at_its_line(tmp_path):
    folder = fleet(tmp_path, jaguar=[('driver: "580.173.02"', 'driver: "550.127.05"')])
    result = validate(folder, "--on", "2026-12-07")
    assert result.exit_code == 1
    line = line_of("jaguar", 'driver: "580.173.02"')
    found = [row for row in result.stdout.splitlines() if "gpu.driver" in row]
    assert len(found) == 2 and found[0].startswith(f"{folder}/jaguar.yaml:{line}:")
    assert "driver 550.127.05 is of branch R550, which is not among NVIDIA's supported data-centre branches" in found[0]
    assert "use one of R580 (long-term support branch (LTSB), to 2028-06)" in found[0]


def test_a_containerd_line_past_its_end_is_refused(tmp_path):
    # 2.2 is a line containerd lists for 1.35, and Docker packages it; it ended on 2026-11-06.
    folder = fleet(tmp_path, heron=[('version: "1.35.9",', 'version: "1.35.9", containerd: "2.2.4",')])
    result = validate(folder, "--on", "2026-12-07")
    assert result.exit_code == 1
    assert ("heron.yaml:7:33: kubernetes.containerd: containerd 2.2.4 is of line 2.2, which reached its end of "
            "life on 2026-11-06" in result.stdout)


def test_a_day_that_is_not_a_date_is_a_clear_error(tmp_path):
    result = validate(fleet(tmp_path), "--on", "next tuesday")
    assert result.exit_code == 2
    assert "'next tuesday' is not a date (YYYY-MM-DD)" in result.output
    assert "Traceback" not in result.output


def test_only_validate_judges_end_of_life(tmp_path):
    """A cluster past its end of life still loads, so it can be planned and upgraded out of it."""
    folder = fleet(tmp_path, ibis=[('version: "1.36.4"', 'version: "1.31.4"')])
    assert load_cluster(folder / "ibis.yaml").kubernetes.version == "1.31.4"


@pytest.mark.parametrize(("driver", "today", "refused", "words"), [
    ("580.173.02", date(2026, 12, 7), None, ""),
    ("580.173.02", date(2028, 5, 15), False, "reaches its end of life in 2028-06"),
    ("580.173.02", date(2028, 7, 1), True, "reached its end of life in 2028-06"),
    ("535.288.01", date(2026, 12, 7), True, "R535, which reached its end of life in 2026-06"),
    ("470.239.06", date(2026, 12, 7), True, "not among NVIDIA's supported data-centre branches"),
    ("999.1.2", date(2026, 12, 7), None, ""),  # newer than the catalog: not judged
])
def test_driver_branches(driver, today, refused, words):
    found = driver_problem(driver, today)
    assert (found and found.refused) == refused if refused is not None else found is None
    if words:
        assert words in found.message


def test_the_warning_does_not_advise_the_branch_it_warns_about():
    found = driver_problem("580.173.02", date(2028, 5, 15))
    assert "use one of R620" in found.message and "R580 (" not in found.message


def test_containerd_lines():
    assert containerd_problem("2.3.6", date(2026, 12, 7)) is None
    assert containerd_problem("2.3.6", date(2028, 3, 15)).refused is False
    assert containerd_problem("2.2.1", date(2026, 12, 7)).refused is True
    assert containerd_problem("9.9.9", date(2026, 12, 7)) is None  # not a line the catalog lists


def test_every_supported_minor_leaves_support_on_its_date():
    for minor in SUPPORTED_MINORS:
        cluster = load_cluster_at(minor)
        eol = MINORS[minor].end_of_life
        assert not [f for f in support_findings(cluster, eol) if f.refused]
        after = [f for f in support_findings(cluster, date.fromordinal(eol.toordinal() + 1)) if f.refused]
        assert after and after[0].path == ("kubernetes", "version")


def load_cluster_at(minor: str):
    import tempfile
    from pathlib import Path

    patch = MINORS[minor].latest_patch
    text = example("jaguar").replace('version: "1.36.4"', f'version: "{minor}.{patch}"')
    text = text[:text.index("  - name: cpu-d64")].rstrip() + "\n"  # on-prem only: 1.37 has no autoscaler
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "jaguar.yaml"
        path.write_text(text)
        return load_cluster(path)
