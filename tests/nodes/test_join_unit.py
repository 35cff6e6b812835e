"""`corral join`'s logic that needs no hosts: inputs, host selection, event folding."""

from __future__ import annotations

import json

import pytest

from corral.model import load_cluster
from corral.nodes.join import EventTracker, JoinError, join_material, select_hosts
from tests.conftest import EXAMPLES

OUTPUTS = {"apiEndpoint": "10.200.0.5:6443", "bootstrapToken": "abcdef.0123456789abcdef",
           "caCertHash": "sha256:" + "ab" * 32}


@pytest.fixture(scope="module")
def jaguar():
    return load_cluster(EXAMPLES / "jaguar.yaml")


def test_join_material_from_outputs_file(tmp_path):
    path = tmp_path / "outputs.json"
    path.write_text(json.dumps(OUTPUTS))
    material = join_material("jaguar", path)
    assert material == {
        "corral_join_api_endpoint": "10.200.0.5:6443",
        "corral_join_token": "abcdef.0123456789abcdef",
        "corral_join_ca_cert_hashes": ["sha256:" + "ab" * 32],
    }


@pytest.mark.parametrize("text, message", [
    ("{not json", "not JSON"),
    ("[1, 2]", "expected a JSON object"),
    (json.dumps({"apiEndpoint": "x"}), "missing stack output(s) bootstrapToken, caCertHash"),
])
def test_join_material_errors(tmp_path, text, message):
    path = tmp_path / "outputs.json"
    path.write_text(text)
    with pytest.raises(JoinError, match=message.replace("(", r"\(").replace(")", r"\)")):
        join_material("jaguar", path)


def test_without_pulumi_the_error_says_what_to_do(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(JoinError, match="pulumi CLI is not installed.*--outputs"):
        join_material("jaguar", None)


def test_select_hosts(jaguar):
    assert len(select_hosts(jaguar, None, [])) == 72
    assert len(select_hosts(jaguar, "gpu-h100-robotics", [])) == 8
    assert select_hosts(jaguar, None, ["gpu-002.sf1.internal"]) == ["gpu-002.sf1.internal"]
    with pytest.raises(JoinError, match="no on-prem pool 'cpu-d64'"):
        select_hosts(jaguar, "cpu-d64", [])
    with pytest.raises(JoinError, match="not an on-prem host of jaguar: gpu-999"):
        select_hosts(jaguar, None, ["gpu-999"])
    with pytest.raises(JoinError, match="not in pool gpu-h100-robotics"):
        select_hosts(jaguar, "gpu-h100-robotics", ["gpu-001.sf1.internal"])


def _event(kind, host, task="t", **res):
    return {"event": kind, "event_data": {"host": host, "task": task, "res": res}}


def test_event_tracker_folds_events_and_trusts_the_recap():
    seen = []
    tracker = EventTracker(["a", "b", "c"], on_update=lambda r: seen.append(r.hosts["a"].status))
    tracker(_event("runner_on_start", "a", task="install driver"))
    tracker(_event("runner_on_ok", "a", changed=True))
    tracker(_event("runner_on_failed", "b", task="check GPUs", msg="expected 8 H100, found 7\nmore"))
    tracker(_event("runner_on_unreachable", "c", task="Gathering Facts", msg="ssh: connect to host c: No route"))
    tracker({"event": "playbook_on_stats", "event_data": {
        "ok": {"a": 12, "b": 3}, "changed": {"a": 4}, "failures": {"b": 1}, "dark": {"c": 1}, "skipped": {}}})
    report = tracker.report
    assert (report.hosts["a"].ok, report.hosts["a"].changed, report.hosts["a"].status) == (12, 4, "changed")
    assert report.hosts["b"].status == "failed"
    assert (report.hosts["b"].task, report.hosts["b"].message) == ("check GPUs", "expected 8 H100, found 7")
    assert report.hosts["c"].status == "unreachable" and "No route" in report.hosts["c"].message
    assert seen and seen[-1] == "changed"


def test_ignored_failures_do_not_count():
    tracker = EventTracker(["a"])
    event = _event("runner_on_failed", "a", msg="probe failed")
    event["event_data"]["ignore_errors"] = True
    tracker(event)
    assert tracker.report.hosts["a"].failed == 0


def test_a_host_no_task_ran_on_is_not_reported_ok():
    tracker = EventTracker(["a", "b"])
    tracker(_event("runner_on_ok", "a"))
    tracker({"event": "playbook_on_stats", "event_data": {"ok": {"a": 1}}})
    assert tracker.report.hosts["a"].status == "ok"
    assert tracker.report.hosts["b"].status == "not run"
    assert not tracker.report.succeeded


class FakeAnsibleRunner:
    """Test fake of the ansible_runner module (a process boundary): records
    the run's arguments and leaves artifacts as a real run would."""

    def __init__(self, leak: bool = False, interrupt: bool = False):
        self.leak, self.interrupt, self.calls = leak, interrupt, []

    def run(self, **kwargs):
        import re
        import stat
        import types
        from pathlib import Path

        secret = Path(re.findall(r"-e @(\S+)", kwargs["cmdline"])[-1])
        self.calls.append({**kwargs, "secret_mode": stat.S_IMODE(secret.stat().st_mode),
                           "secret_text": secret.read_text(), "secret_path": secret})
        artifacts = Path(kwargs["private_data_dir"]) / "artifacts" / "fake-run"
        artifacts.mkdir(parents=True, exist_ok=True)
        (artifacts / "stdout").write_text("TASK [kubelet_join] ok\n" + (OUTPUTS["bootstrapToken"] if self.leak else ""))
        if self.interrupt:
            raise KeyboardInterrupt
        for host in ("gpu-001.sf1.internal",):
            kwargs["event_handler"]({"event": "runner_on_ok", "event_data": {"host": host, "res": {"changed": True}}})
        return types.SimpleNamespace(rc=0, config=types.SimpleNamespace(artifact_dir=str(artifacts)))


@pytest.fixture
def fake_runner(monkeypatch):
    def install(**options):
        fake = FakeAnsibleRunner(**options)
        monkeypatch.setitem(__import__("sys").modules, "ansible_runner", fake)
        return fake
    return install


def _material():
    return {"corral_join_api_endpoint": OUTPUTS["apiEndpoint"], "corral_join_token": OUTPUTS["bootstrapToken"],
            "corral_join_ca_cert_hashes": [OUTPUTS["caCertHash"]]}


def test_the_token_travels_only_in_a_private_file_that_is_removed(jaguar, tmp_path, fake_runner):
    from corral.nodes.join import run_join

    fake = fake_runner()
    report = run_join(jaguar, _material(), ["gpu-001.sf1.internal"], runs_dir=tmp_path / "runs")
    call = fake.calls[0]
    assert OUTPUTS["bootstrapToken"] not in call["cmdline"]
    assert call["secret_mode"] == 0o600 and OUTPUTS["bootstrapToken"] in call["secret_text"]
    assert not call["secret_path"].exists()
    assert str(tmp_path / "runs") not in str(call["secret_path"])  # never inside the artifacts dir
    assert call["suppress_env_files"] is True and call["limit"] == "gpu-001.sf1.internal"
    assert "token" not in json.dumps(call["inventory"]).lower()
    assert report.hosts["gpu-001.sf1.internal"].status == "changed"


def test_a_leaked_token_is_removed_and_reported(jaguar, tmp_path, fake_runner):
    from corral.nodes.join import run_join

    fake_runner(leak=True)
    with pytest.raises(JoinError, match="bootstrap token appeared in run artifacts"):
        run_join(jaguar, _material(), ["gpu-001.sf1.internal"], runs_dir=tmp_path / "runs")
    assert not list((tmp_path / "runs").rglob("stdout"))


def test_artifacts_are_scanned_even_when_the_run_is_interrupted(jaguar, tmp_path, fake_runner):
    from corral.nodes.join import run_join

    fake_runner(leak=True, interrupt=True)
    with pytest.raises(KeyboardInterrupt):
        run_join(jaguar, _material(), ["gpu-001.sf1.internal"], runs_dir=tmp_path / "runs")
    assert not list((tmp_path / "runs").rglob("stdout"))
