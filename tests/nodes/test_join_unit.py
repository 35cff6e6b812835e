"""`corral join`'s logic that needs no hosts: inputs, host selection, event
folding, the fresh bootstrap token per run (against a fake kubectl and a fake
pulumi at the process boundary) and the secret's path through ansible-runner
(a fake ansible_runner module)."""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from typer.testing import CliRunner

from corral.cli import app
from corral.model import load_cluster
from corral.nodes.join import EventTracker, JoinError, join_material, parse_ttl, select_hosts
from tests.conftest import EXAMPLES

# A stale token in the outputs (what the stack used to hand out): never used.
STALE_TOKEN = "abcdef.0123456789abcdef"
OUTPUTS = {"apiEndpoint": "10.200.0.5:6443", "bootstrapToken": STALE_TOKEN,
           "caCertHash": "sha256:" + "ab" * 32}
HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def jaguar():
    return load_cluster(EXAMPLES / "jaguar.yaml")


def test_join_material_from_outputs_file_never_takes_its_token(tmp_path):
    path = tmp_path / "outputs.json"
    path.write_text(json.dumps(OUTPUTS))
    material = join_material("jaguar", path)
    assert material == {
        "corral_join_api_endpoint": "10.200.0.5:6443",
        "corral_join_ca_cert_hashes": ["sha256:" + "ab" * 32],
    }


@pytest.mark.parametrize("text, message", [
    ("{not json", "not JSON"),
    ("[1, 2]", "expected a JSON object"),
    (json.dumps({"apiEndpoint": "x"}), "missing stack output(s) caCertHash"),
    (json.dumps({"caCertHash": "sha256:00"}), "missing stack output(s) apiEndpoint"),
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


def test_a_host_key_failure_is_named_as_such():
    """ssh's changed-key warning starts with a row of '@': the report says what it is."""
    tracker = EventTracker(["a"])
    tracker(_event("runner_on_unreachable", "a", task="Gathering Facts", msg=(
        'Data could not be sent to remote host "10.50.13.65". Make sure this host can be reached over ssh: '
        "@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@\n"
        "@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\n...\nHost key verification failed.\n")))
    result = tracker.report.hosts["a"]
    assert result.status == "unreachable"
    assert result.message.startswith("ssh host key verification failed: the host presents a key that is not the "
                                      "one in the cluster's known hosts file")


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

    def __init__(self, leak: bool = False, interrupt: bool = False, up_to_date: frozenset[str] = frozenset()):
        self.leak, self.interrupt, self.calls = leak, interrupt, []
        # Ad-hoc `raw` runs (the converge check and record), and which hosts
        # the check finds up to date.
        self.adhoc, self.up_to_date = [], up_to_date

    def _adhoc(self, **kwargs):
        import types

        self.adhoc.append(kwargs)
        variable = kwargs["module_args"].split("{{", 1)[1].split("|", 1)[0].strip()
        for host in kwargs["limit"].split(","):
            command = kwargs["inventory"]["all"]["children"]["onprem_nodes"]["hosts"][host][variable]["__ansible_unsafe"]
            verdict = "up to date" if ("record" in variable or host in self.up_to_date) else "never converged by corral"
            kwargs["event_handler"]({"event": "runner_on_ok", "event_data": {
                "host": host, "res": {"stdout": f"corral-converge: {verdict}\n", "command": command}}})
        return types.SimpleNamespace(rc=0, config=types.SimpleNamespace(artifact_dir=kwargs["private_data_dir"]))

    def run(self, **kwargs):
        import re
        import stat
        import types
        from pathlib import Path

        if kwargs.get("module"):
            return self._adhoc(**kwargs)
        secret = Path(re.findall(r"-e @(\S+)", kwargs["cmdline"])[-1])
        self.calls.append({**kwargs, "secret_mode": stat.S_IMODE(secret.stat().st_mode),
                           "secret_text": secret.read_text(), "secret_path": secret})
        artifacts = Path(kwargs["private_data_dir"]) / "artifacts" / "fake-run"
        artifacts.mkdir(parents=True, exist_ok=True)
        token = re.search(r'"corral_join_token": "([^"]+)"', secret.read_text()).group(1)
        # A leaking task would print the token (or its secret half).
        (artifacts / "stdout").write_text("TASK [kubelet_join] ok\n" + (token.split(".")[1] if self.leak else ""))
        if self.interrupt:
            raise KeyboardInterrupt
        for host in (kwargs["limit"] or "gpu-001.sf1.internal").split(","):
            kwargs["event_handler"]({"event": "runner_on_ok", "event_data": {
                "host": host, "task_action": "ansible.builtin.template",
                "res": {"changed": True, "invocation": {"module_args": {"dest": "/etc/crictl.yaml"}}}}})
        return types.SimpleNamespace(rc=0, config=types.SimpleNamespace(artifact_dir=str(artifacts)))


@pytest.fixture
def fake_runner(monkeypatch):
    def install(**options):
        fake = FakeAnsibleRunner(**options)
        monkeypatch.setitem(__import__("sys").modules, "ansible_runner", fake)
        return fake
    return install


TOKEN = "kst7ab.0123456789abcdef"


def _material():
    return {"corral_join_api_endpoint": OUTPUTS["apiEndpoint"], "corral_join_token": TOKEN,
            "corral_join_ca_cert_hashes": [OUTPUTS["caCertHash"]]}


def test_the_token_travels_only_in_a_private_file_that_is_removed(jaguar, tmp_path, fake_runner):
    from corral.nodes.join import run_join

    fake = fake_runner()
    report = run_join(jaguar, _material(), ["gpu-001.sf1.internal"], runs_dir=tmp_path / "runs")
    call = fake.calls[0]
    assert TOKEN not in call["cmdline"]
    assert call["secret_mode"] == 0o600 and TOKEN in call["secret_text"]
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


# ------------------------------------------------- a fresh token per join run


@pytest.mark.parametrize("text, ttl", [("4h", timedelta(hours=4)), ("90m", timedelta(minutes=90)),
                                       ("2h30m", timedelta(hours=2, minutes=30)), ("3600s", timedelta(hours=1))])
def test_token_ttl_parses(text, ttl):
    assert parse_ttl(text) == ttl


@pytest.mark.parametrize("text", ["", "4", "4 hours", "-1h", "1d", "0s", "4m", "25h", "4h\n"])
def test_token_ttl_refuses_nonsense_and_long_lives(text):
    with pytest.raises(JoinError, match="--token-ttl"):
        parse_ttl(text)


class FakeKubectl:
    """Reads what the fake kubectl (tests/nodes/fake_kubectl) was asked."""

    def __init__(self, log: Path):
        self.log = log

    def calls(self) -> list[dict]:
        return [json.loads(line) for line in self.log.read_text().splitlines()] if self.log.exists() else []

    def created(self) -> list[dict]:
        return [c["object"] for c in self.calls() if "object" in c]

    def existing(self) -> dict:
        store = Path(str(self.log) + ".secrets.json")
        return json.loads(store.read_text()) if store.exists() else {}


@pytest.fixture
def fake_kubectl(tmp_path, monkeypatch):
    """The fake kubectl first on PATH (a process boundary), and no ambient kubeconfig."""
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir()
    (bin_dir / "kubectl").symlink_to(HERE / "fake_kubectl")
    (bin_dir / "pulumi").symlink_to(HERE / "fake_pulumi")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_KUBECTL_LOG", str(tmp_path / "kubectl.jsonl"))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("FAKE_KUBECTL_FAIL", raising=False)
    return FakeKubectl(tmp_path / "kubectl.jsonl")


@pytest.fixture
def ssh_network(tmp_path, monkeypatch, fleet_dir):
    """jaguar's hosts and the site's jump host answer the fake ssh-keyscan; their keys trusted."""
    from corral.nodes.known_hosts import trust

    from .ssh_fakes import FakeSshNetwork

    network = FakeSshNetwork(tmp_path / "ssh-network").install(monkeypatch)
    cluster = load_cluster(fleet_dir / "jaguar.yaml")
    for host in ["bastion.sf1.internal", *(h for pool in cluster.onprem_pools for h in pool.host_names)]:
        network.add(host)
    trust(cluster)
    return network


@pytest.fixture
def join_cli(tmp_path, fleet_dir, fake_runner, ssh_network):
    """`corral join jaguar --limit gpu-001...` in process, with the fake runner."""
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps(OUTPUTS))
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n# short-lived credential\n")

    def run(*extra, outputs_file=outputs, runner=None):
        fake = runner or fake_runner()
        args = ["join", "jaguar", "--clusters", str(fleet_dir), "--limit", "gpu-001.sf1.internal",
                "--runs-dir", str(tmp_path / "runs"), *extra]
        if outputs_file is not None:
            args += ["--outputs", str(outputs_file)]
        result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
        return result, fake

    run.kubeconfig = kubeconfig
    run.runs = tmp_path / "runs"
    return run


def _token_given_to_ansible(fake) -> str:
    return json.loads(fake.calls[0]["secret_text"])["corral_join_token"]


def test_every_run_creates_a_fresh_token_that_expires_and_is_deleted(join_cli, fake_kubectl):
    tokens = []
    for _ in range(2):
        before = datetime.now(timezone.utc).replace(microsecond=0)
        result, fake = join_cli("--kubeconfig", str(join_cli.kubeconfig))
        after = datetime.now(timezone.utc)
        assert result.exit_code == 0, result.output
        created = fake_kubectl.created()[-1]
        data = created["stringData"]
        token = f"{data['token-id']}.{data['token-secret']}"
        # The token Ansible joined with is the one just created, not the stale output.
        assert _token_given_to_ansible(fake) == token != STALE_TOKEN
        assert created["metadata"] == {"name": f"bootstrap-token-{data['token-id']}", "namespace": "kube-system",
                                       "labels": {"app.kubernetes.io/managed-by": "corral"}}
        assert created["type"] == "bootstrap.kubernetes.io/token"
        assert data["usage-bootstrap-authentication"] == data["usage-bootstrap-signing"] == "true"
        # The run's pool's own group (gpu-001 is gpu-h100-sf1's; issue 25, item 4): never kubeadm's
        # default group, whose auto-approval binding would sign any node name for the token.
        assert data["auth-extra-groups"] == "system:bootstrappers:corral:pool:gpu-h100-sf1"
        expiration = datetime.strptime(data["expiration"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
        assert before + timedelta(hours=4) <= expiration <= after + timedelta(hours=4)
        # Deleted when the run ended; the TTL covers a run that could not delete it.
        assert fake_kubectl.existing() == {}
        tokens.append(token)
    assert tokens[0] != tokens[1] and tokens[0].split(".")[0] != tokens[1].split(".")[0]
    for call in fake_kubectl.calls():
        assert call["kubeconfig"] == str(join_cli.kubeconfig)
        # The token only ever on stdin: never in argv (visible in ps).
        assert not any(t.split(".")[1] in arg for t in tokens for arg in call["argv"])
    # (apply: the drain credential for serving GPU nodes, tests/upgrade; this fake refuses it.)
    assert [c["argv"][2:4] for c in fake_kubectl.calls()] == [["create", "-f"], ["apply", "-f"],
                                                              ["delete", "secret"]] * 2


def test_the_fresh_token_is_in_no_artifact_log_or_output(join_cli, fake_kubectl):
    result, fake = join_cli("--kubeconfig", str(join_cli.kubeconfig))
    assert result.exit_code == 0, result.output
    secret = fake_kubectl.created()[0]["stringData"]["token-secret"]
    assert secret not in result.output
    files = [p for p in join_cli.runs.rglob("*") if p.is_file()]
    assert files, "the fake run leaves artifacts to scan"
    assert not [p for p in files if secret in p.read_text(errors="ignore")]
    assert not fake.calls[0]["secret_path"].exists()


def test_a_leaked_fresh_token_is_found_and_the_token_deleted(join_cli, fake_kubectl, fake_runner):
    result, _ = join_cli("--kubeconfig", str(join_cli.kubeconfig), runner=fake_runner(leak=True))
    assert result.exit_code == 1
    assert "bootstrap token appeared in run artifacts" in result.output
    assert fake_kubectl.existing() == {}


def test_token_ttl_option_sets_the_expiration(join_cli, fake_kubectl):
    before = datetime.now(timezone.utc).replace(microsecond=0)
    result, _ = join_cli("--kubeconfig", str(join_cli.kubeconfig), "--token-ttl", "30m")
    assert result.exit_code == 0, result.output
    data = fake_kubectl.created()[0]["stringData"]
    expiration = datetime.strptime(data["expiration"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    assert before + timedelta(minutes=30) <= expiration <= datetime.now(timezone.utc) + timedelta(minutes=30)


def test_the_credential_can_come_from_KUBECONFIG(join_cli, fake_kubectl, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(join_cli.kubeconfig))
    result, _ = join_cli()
    assert result.exit_code == 0, result.output
    assert {(c["kubeconfig"], c["env_kubeconfig"]) for c in fake_kubectl.calls()} == {(None, str(join_cli.kubeconfig))}


def test_without_a_credential_the_error_says_where_it_comes_from(join_cli, fake_kubectl):
    result, fake = join_cli()
    assert result.exit_code == 1
    assert "--kubeconfig FILE or set KUBECONFIG" in " ".join(result.output.split())
    assert fake_kubectl.calls() == [] and fake.calls == []


def test_a_refused_token_stops_the_join_before_any_host(join_cli, fake_kubectl, monkeypatch):
    monkeypatch.setenv("FAKE_KUBECTL_FAIL", "create")
    result, fake = join_cli("--kubeconfig", str(join_cli.kubeconfig))
    assert result.exit_code == 1
    assert "could not create the join's bootstrap token" in result.output and "Forbidden" in result.output
    assert fake.calls == []


def test_a_token_that_cannot_be_deleted_is_named_with_its_expiry(join_cli, fake_kubectl, monkeypatch):
    monkeypatch.setenv("FAKE_KUBECTL_FAIL", "delete")
    result, _ = join_cli("--kubeconfig", str(join_cli.kubeconfig))
    assert result.exit_code == 0, result.output
    data = fake_kubectl.created()[0]["stringData"]
    output = " ".join(result.output.split())
    assert f"could not delete bootstrap token {data['token-id']}" in output and data["expiration"] in output
    assert data["token-secret"] not in result.output


def test_an_interrupted_run_still_deletes_its_token(join_cli, fake_kubectl, fake_runner):
    result, _ = join_cli("--kubeconfig", str(join_cli.kubeconfig), runner=fake_runner(interrupt=True))
    assert result.exit_code != 0
    assert len(fake_kubectl.created()) == 1 and fake_kubectl.existing() == {}


def test_check_mode_creates_no_token(join_cli, fake_kubectl):
    result, fake = join_cli("--check")
    assert result.exit_code == 0, result.output
    assert fake_kubectl.calls() == []
    assert "--check" in fake.calls[0]["cmdline"]


def test_from_the_stack_the_admin_credential_lives_only_for_the_kubectl_call(join_cli, fake_kubectl,
                                                                              tmp_path, monkeypatch):
    stack = tmp_path / "stack-outputs.json"
    admin = "apiVersion: v1\nkind: Config\n# kubernetes-admin of jaguar\n"
    stack.write_text(json.dumps({**OUTPUTS, "adminKubeconfig": admin, "vpnSharedKeys": {"sf1": "psk"},
                                 "__secret_keys__": ["adminKubeconfig", "vpnSharedKeys", "bootstrapToken"]}))
    monkeypatch.setenv("FAKE_PULUMI_OUTPUTS", str(stack))
    result, fake = join_cli(outputs_file=None)
    assert result.exit_code == 0, result.output
    asked = {json.loads(line)[2]: json.loads(line) for line in Path(str(stack) + ".calls").read_text().splitlines()}
    assert sorted(asked) == ["adminKubeconfig", "apiEndpoint", "caCertHash"]  # never the VPN keys or the old token
    # Secrets shown only where one is needed.
    assert [key for key, argv in asked.items() if "--show-secrets" in argv] == ["adminKubeconfig"]
    calls = fake_kubectl.calls()
    # create and delete the token; apply: the drain credential for serving GPU nodes (refused by this fake).
    assert len(calls) == 3 and all(c["kubeconfig_text"] == admin and c["kubeconfig_mode"] == 0o600 for c in calls)
    for call in calls:
        path = Path(call["kubeconfig"])
        assert not path.exists() and not path.parent.exists()
        assert str(join_cli.runs) not in str(path)
    assert _token_given_to_ansible(fake) != STALE_TOKEN


def test_without_kubectl_the_error_says_so(join_cli, fake_kubectl, monkeypatch, tmp_path):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    # Only the ssh tools (the fakes) that check the host keys first.
    for tool in ("ssh", "ssh-keyscan"):
        (empty / tool).symlink_to(HERE / f"fake_{tool.replace('-', '_')}")
    monkeypatch.setenv("PATH", str(empty))
    result, fake = join_cli("--kubeconfig", str(join_cli.kubeconfig))
    assert result.exit_code == 1
    assert "kubectl is not installed" in result.output and fake.calls == []


# ------------------------------------------------ converge record (skipping)
TWO_HOSTS = ["gpu-001.sf1.internal", "gpu-002.sf1.internal"]


def _join_two(join_cli, fake_runner, *extra, up_to_date=frozenset()):
    fake = fake_runner(up_to_date=frozenset(up_to_date))
    return join_cli("--kubeconfig", str(join_cli.kubeconfig), "--limit", TWO_HOSTS[1], *extra, runner=fake)


def test_up_to_date_hosts_run_nothing_and_need_no_token(join_cli, fake_kubectl, fake_runner):
    result, fake = _join_two(join_cli, fake_runner, up_to_date=TWO_HOSTS)
    assert result.exit_code == 0, result.output
    assert [call["module"] for call in fake.adhoc] == ["raw"]  # the check only
    assert fake.calls == [] and fake_kubectl.calls() == []
    assert "0 changes, 2 up to date (not run)" in " ".join(result.output.split())


def test_only_hosts_that_are_not_up_to_date_converge_and_get_a_record(join_cli, fake_kubectl, fake_runner):
    result, fake = _join_two(join_cli, fake_runner, up_to_date={TWO_HOSTS[0]})
    assert result.exit_code == 0, result.output
    check, record = fake.adhoc
    assert sorted(check["limit"].split(",")) == TWO_HOSTS
    assert [call["limit"] for call in fake.calls] == [TWO_HOSTS[1]]
    assert record["limit"] == TWO_HOSTS[1]
    # The record names what the run's events said the roles wrote.
    script = record["inventory"]["all"]["children"]["onprem_nodes"]["hosts"][TWO_HOSTS[1]]["corral_converge_record"]
    script = script["__ansible_unsafe"]
    assert "sha256sum -- /etc/crictl.yaml" in script
    # One fresh token for the one run that joins.
    assert len(fake_kubectl.created()) == 1 and fake_kubectl.existing() == {}
    assert "1 up to date (not run)" in " ".join(result.output.split())


def test_force_runs_every_host_without_asking(join_cli, fake_kubectl, fake_runner):
    result, fake = _join_two(join_cli, fake_runner, "--force", up_to_date=TWO_HOSTS)
    assert result.exit_code == 0, result.output
    assert sorted(fake.calls[0]["limit"].split(",")) == TWO_HOSTS
    assert [len(call["limit"].split(",")) for call in fake.adhoc] == [2]  # the record, no check


def test_check_mode_records_nothing(join_cli, fake_kubectl, fake_runner):
    result, fake = _join_two(join_cli, fake_runner, "--check")
    assert result.exit_code == 0, result.output
    assert len(fake.adhoc) == 1 and "corral_converge_check" in fake.adhoc[0]["module_args"]
    assert "--check" in fake.calls[0]["cmdline"]


# ------------------------------------------------------ fan-out over shards
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from corral.nodes.join import shard_hosts  # noqa: E402


@settings(max_examples=200, deadline=None)
@given(hosts=st.lists(st.from_regex(r"[a-z][a-z0-9-]{0,20}\.sf1\.internal", fullmatch=True), unique=True,
                      max_size=60),
       count=st.integers(min_value=1, max_value=16))
def test_shards_split_the_hosts_exactly_once(hosts, count):
    shards = [shard_hosts(hosts, f"{k}/{count}") for k in range(1, count + 1)]
    assert sorted(h for shard in shards for h in shard) == sorted(hosts)
    # Order kept within a shard; a grown host list moves nobody.
    for k, shard in enumerate(shards, start=1):
        assert shard == [h for h in hosts if h in set(shard)]
        assert shard_hosts(hosts + ["new-host.sf1.internal"], f"{k}/{count}")[:len(shard)] == shard


def test_shards_are_balanced_on_a_large_fleet():
    hosts = [f"gpu-{i:05d}.sf1.internal" for i in range(7500)]
    sizes = [len(shard_hosts(hosts, f"{k}/8")) for k in range(1, 9)]
    assert sum(sizes) == 7500 and max(sizes) - min(sizes) < 0.1 * 7500 / 8, sizes


@pytest.mark.parametrize("shard", ["0/4", "5/4", "1/0", "a/b", "1/2/3", "1/2\n"])
def test_a_bad_shard_is_a_clear_error(shard):
    with pytest.raises(JoinError, match="expected K/N"):
        shard_hosts(["a"], shard)


def test_the_cli_joins_only_its_shard(join_cli, fake_kubectl, fake_runner, jaguar):
    from corral.nodes.inventory import host_pool

    everyone = list(host_pool(jaguar))
    fake = fake_runner()
    result, fake = join_cli("--kubeconfig", str(join_cli.kubeconfig), "--limit", everyone[1], "--limit",
                            everyone[2], "--limit", everyone[3], "--shard", "2/2", runner=fake)
    assert result.exit_code == 0, result.output
    expected = shard_hosts([everyone[0], everyone[1], everyone[2], everyone[3]], "2/2")
    assert sorted(fake.adhoc[0]["limit"].split(",")) == sorted(expected)


def test_commands_without_outputs_are_not_told_to_pass_it(tmp_path):
    """`corral kubeconfig` and `corral upgrade` read only the stack's credential
    and have no --outputs: without pulumi they are told about --kubeconfig."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env["PATH"] = os.path.dirname(sys.executable)  # python, and no pulumi
    for argv in (["kubeconfig", "jaguar", "--user", "ana", "--out", str(tmp_path / "kc")],
                 ["upgrade", "jaguar", "--check"]):
        result = subprocess.run([sys.executable, "-m", "corral", *argv, "--clusters", str(root / "clusters")],
                                env=env, capture_output=True, text=True, timeout=120)
        assert result.returncode != 0
        assert "pulumi CLI is not installed" in result.stderr and "--kubeconfig FILE" in result.stderr, result.stderr
        assert "--outputs" not in result.stderr and "Traceback" not in result.stderr


# ------------------------------------------------- host keys


def test_a_changed_host_key_stops_the_join_before_any_task(join_cli, fake_kubectl, ssh_network, fleet_dir,
                                                           fake_runner):
    ssh_network.add("gpu-001.sf1.internal", generation=1)   # reinstalled, or someone in its place
    fake = fake_runner()
    result, _ = join_cli("--kubeconfig", str(join_cli.kubeconfig), runner=fake)
    assert result.exit_code == 1
    message = " ".join(result.output.split())
    assert f"ssh host key changed for gpu-001.sf1.internal (the keys recorded in {fleet_dir / 'jaguar.known_hosts'}" \
        in message
    assert "corral hosts trust jaguar --replace gpu-001.sf1.internal" in message
    # Nothing ran: no converge check, no playbook, no token.
    assert not fake.adhoc and not fake.calls and not fake_kubectl.created()
    # Control: with the key it had, the same join runs.
    ssh_network.add("gpu-001.sf1.internal")
    result, _ = join_cli("--kubeconfig", str(join_cli.kubeconfig), runner=fake)
    assert result.exit_code == 0 and fake.adhoc and fake.calls, result.output


def test_a_join_without_recorded_host_keys_says_how_to_record_them(join_cli, fake_kubectl, fleet_dir):
    (fleet_dir / "jaguar.known_hosts").unlink()
    result, fake = join_cli("--kubeconfig", str(join_cli.kubeconfig))
    assert result.exit_code == 1
    assert "run `corral hosts trust jaguar`" in " ".join(result.output.split())
    assert not fake.calls and not fake_kubectl.created()
