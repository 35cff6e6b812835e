"""`corral doctor` as a user runs it: exit codes, the JSON report, and that it changes nothing."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

READ_ONLY = {("pulumi", "version"), ("pulumi", "whoami"), ("pulumi", "stack"), ("aws", "sts"), ("aws", "iam"),
             ("aws", "ec2"), ("aws", "service-quotas")}


def doctor(world, *args):
    world.save()
    return subprocess.run([sys.executable, "-m", "corral", "doctor", *args, "--clusters", str(world.clusters)],
                          cwd=world.project, env={**world.env, "COLUMNS": "250"}, capture_output=True, text=True,
                          timeout=120)


def tree_digest(folder) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_ready_aws_cluster_exits_0_and_reports_every_check_as_json(world):
    before = tree_digest(world.project)
    run = doctor(world, "heron", "-o", "json")
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(run.stdout)
    assert report["cluster"] == "heron" and report["ok"] is True
    assert [c["check"] for c in report["checks"]] == [
        "pulumi.cli", "pulumi.login", "pulumi.stack", "pulumi.config", "cloud.extra", "cloud.credentials",
        "cloud.permissions", "cloud.images", "cloud.images", "cloud.quotas", "cloud.quotas"]
    assert {c["status"] for c in report["checks"]} == {"pass"}
    assert report["counts"] == {"pass": 11, "warn": 0, "fail": 0, "skip": 0}
    # read-only calls only (the fakes refuse anything else), and no file written
    assert {tuple(call[:2]) for call in world.calls()} <= READ_ONLY
    assert tree_digest(world.project) == before


def test_warnings_do_not_fail_the_run(world):
    world.state["aws"]["quotas"]["L-1216C47A"] = 1000      # enough for the control plane, not for 300 pool machines
    run = doctor(world, "heron", "-o", "json")
    assert run.returncode == 0, run.stdout
    assert json.loads(run.stdout)["counts"]["warn"] == 1


def test_something_to_fix_exits_1_and_the_table_says_what_to_run(world):
    world.state["pulumi"]["stacks"] = []
    run = doctor(world, "heron")
    assert run.returncode == 1
    assert "no stack heron in this backend" in run.stdout
    assert "pulumi stack init heron" in run.stdout
    assert run.stdout.rstrip().endswith("1 to fix")


def test_an_unknown_cluster_is_one_error_line_not_a_traceback(world):
    run = doctor(world, "osprey")
    assert run.returncode == 1
    assert "no cluster 'osprey'" in run.stderr and "Traceback" not in run.stderr
