"""`corral plan CLUSTER`: the summary first (counts per component, warnings, dangerous changes),
the listing only with --full, `-o json` unchanged, and no warning that points into a source file."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from corral.cli import app

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def plan(*args: str):
    return runner.invoke(app, ["plan", *args, "--clusters", str(ROOT / "clusters")],
                         env={"COLUMNS": "200", "CORRAL_CLUSTERS": str(ROOT / "clusters")})


@pytest.fixture(scope="module")
def heron_json() -> list[dict]:
    result = plan("heron", "-o", "json")
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_summary_first_then_the_listing_only_with_full(heron_json):
    result = plan("heron")
    assert result.exit_code == 0, result.output
    text = result.output
    assert text.startswith(f"heron (aws): {len(heron_json)} resources")
    counted = {name: int(count) for name, count in re.findall(r"│ (heron-[\w-]+)\s*│\s*(\d+) │", text)}
    expected: dict[str, int] = {}
    for resource in heron_json:
        expected[resource["component"] or "(stack)"] = expected.get(resource["component"] or "(stack)", 0) + 1
    assert counted == expected
    assert "warnings: 2" in text and "corral:nodeImage is not set" in text
    assert "dangerous changes: not compared" in text
    assert "aws:ec2/instance:Instance" not in text, "the listing is behind --full"
    assert "corral plan heron --full" in text

    full = plan("heron", "--full")
    assert full.exit_code == 0
    assert full.output.startswith(f"heron (aws): {len(heron_json)} resources")
    assert "aws:ec2/instance:Instance" in full.output and "outputs of stack heron:" in full.output


def test_json_is_the_bare_listing_and_the_old_spelling_still_gives_it(heron_json):
    old = plan("heron", "--format", "json")
    short = plan("heron", "-f", "json")
    assert json.loads(old.output) == heron_json == json.loads(short.output)
    assert all({"type", "name", "component", "inputs"} <= set(r) for r in heron_json)


def test_dangerous_changes_against_a_saved_plan(heron_json, tmp_path):
    same = tmp_path / "same.json"
    same.write_text(json.dumps(heron_json))
    result = plan("heron", "--against", str(same))
    assert result.exit_code == 0, result.output
    assert "dangerous changes: none" in result.output

    # The saved plan had another etcd data disk: this plan deletes it.
    before = [dict(r) for r in heron_json]
    disk = next(r for r in before if r["type"] == "aws:ebs/volume:Volume" and "etcd" in r["name"])
    before.append({**disk, "name": disk["name"] + "-old"})
    saved = tmp_path / "before.json"
    saved.write_text(json.dumps(before))
    result = plan("heron", "--against", str(saved))
    assert result.exit_code == 0, result.output
    assert "dangerous changes: 1" in result.output
    assert f"delete aws:ebs:Volume {disk['name']}-old: etcd data disk deleted" in result.output


@pytest.mark.parametrize("content, expected", [
    ('[{"type": "x",\n  "name": }]', ":2: not JSON"),
    ('{"resources": []}', "not a `corral plan -o json` listing"),
])
def test_a_bad_saved_plan_is_one_message_naming_the_file(tmp_path, content, expected):
    saved = tmp_path / "saved.json"
    saved.write_text(content)
    result = plan("heron", "--against", str(saved))
    assert result.exit_code == 1
    assert expected in " ".join(result.output.split())
    assert str(saved) in result.output.replace("\n", "")
    assert "Traceback" not in result.output


def test_no_warning_points_into_a_source_file():
    """Under PYTHONWARNINGS=default the provider SDKs' deprecations used to print as
    `.../site-packages/pulumi_aws/ec2/encryption_control.py:517: DeprecationWarning`."""
    env = {**os.environ, "PYTHONWARNINGS": "default", "PYTHONDONTWRITEBYTECODE": "1",
           "CORRAL_CLUSTERS": str(ROOT / "clusters")}
    done = subprocess.run([sys.executable, "-m", "corral", "plan", "heron"], capture_output=True, text=True,
                          env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert ".py:" not in done.stdout + done.stderr, done.stderr
    # Nor does corral's own advice send the user into its code: it names a command or a doc.
    warnings = [line for line in (done.stdout + done.stderr).splitlines() if "warning" in line.lower()]
    assert warnings and not [line for line in warnings if re.search(r"[\w/]+\.py\b", line)], warnings


def test_a_warning_is_one_line_without_its_source_location(capsys):
    import warnings

    from corral.cli.common import plain_warnings

    with warnings.catch_warnings():
        plain_warnings()
        warnings.warn("the thing changed", UserWarning)
        warnings.warn_explicit("EncryptionControl has been deprecated", DeprecationWarning,
                               "encryption_control.py", 517, module="pulumi_aws.ec2.encryption_control")
    err = capsys.readouterr().err
    assert err.strip() == "warning: the thing changed"
