"""The getting-started guides, run as a reader runs them: every command, in order.

Each guide runs in a scratch copy of this checkout (its tracked files; the
project's .venv linked in, as `scripts/install` would have made it), with a
fresh HOME and a PATH whose cloud CLIs, Pulumi, Packer's builds, kubectl and
curl are fakes at the process boundary (tests/getting_started/fake_bin, and
the doctor's, the join's and the upgrade's fakes they hand calls to); the
account they play is healthy (`account()`). A command that fails, prints
less than the guide shows under it, or is neither run nor listed in NOT_RUN
fails the test; so does a flag a command does not have (typer exits 2).
After the run, the outcomes are checked on what the commands left behind:
the files, the fake cloud's stack, doctor's verdict, the Job the cluster was
given (held to corral's own admission policy and the GPU pool's taints) and
the usage report.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs

import pytest
import yaml

from corral.manifests import all_objects, object_key, policy, render
from corral.model import load_fleet
from corral.model.schema import PREFLIGHT_TAINT_KEY
from tests.certs.certgen import make_cert
from tests.doctor.conftest import healthy_state
from tests.manifests.test_cluster_policy import evaluate_pod_policy
from tests.nodes.ssh_fakes import FakeSshNetwork

from .guides import GuideError, missing_output, read_steps, run_guide

ROOT = Path(__file__).resolve().parents[2]
GUIDES = ROOT / "docs" / "getting-started"
HERE = Path(__file__).resolve().parent
FAKE_BIN = HERE / "fake_bin"
REAL_PACKER = "/usr/bin/packer"   # Debian's packer, which fake_bin/packer hands `validate` to

# Every command a guide shows but the test does not run, with why. A guide's
# `# not run:` marker must be here, and everything here must be in a guide.
NOT_RUN = {
    "git clone https://github.com/corral-dev/corral.git && cd corral":
        "the test runs in a scratch copy of this checkout",
    "bash scripts/install":
        "installs .venv from the package index (minutes); tests/quickstart runs it as written on a fresh Debian 12",
    "aws sso login --profile corral-admin": "opens a browser",
    "gcloud auth login": "opens a browser",
    "az login": "opens a browser",
    "gcloud auth application-default login": "opens a browser",
    "kubectl --kubeconfig alice.kubeconfig -n corral-monitoring port-forward svc/prometheus 9090":
        "runs until stopped; the test serves a fake Prometheus (CORRAL_PROMETHEUS_URL) instead",
}


# Commands this tier leaves to the hostlab tier, which runs them for real on
# throwaway hosts that are the guide's own (names, addresses, user, key):
# command -> the test module that runs it. Not `# not run`: they are run.
ON_HOSTS = {
    "corral join kite --pool gpu-h100-dc1 -e site-dc1.yaml": "tests.getting_started.test_onprem_hosts",
}


DC1_ADDRESSES = [f"10.60.1.{n}" for n in range(11, 15)]   # onprem.md's gpu-[001:004].dc1.internal


def account() -> dict:
    """The fake cloud: the doctor's healthy account, plus what the guides' clusters use."""
    state = healthy_state()
    state["pulumi"] = {"version": state["pulumi"]["version"], "stacks": []}   # not logged in yet
    state["aws"]["instance_types"].update({"m7i.2xlarge": 8, "r7i.xlarge": 4})
    state["gcloud"]["machine_types"].update({"n2-standard-8": 8, "c3-highmem-4": 4})
    state["az"]["skus"].update({"Standard_D8s_v5": {"family": "standardDSv5Family", "vCPUs": 8},
                                "Standard_E8s_v5": {"family": "standardESv5Family", "vCPUs": 8},
                                # the Azure guide's GPU pool: 24 vCPUs, 1x A100 (quota family as `az vm list-skus` names it)
                                "Standard_NC24ads_A100_v4": {"family": "standardNCADSA100v4Family", "vCPUs": 24}})
    state["az"]["usage"]["standardNCADSA100v4Family"] = 96
    state["ping"]["answer"] = ["44.193.10.20"]       # the site's VPN gateway answers
    return state


def scratch_checkout(target: Path) -> Path:
    """The checkout's tracked files (no tests, no goldens), with the project's .venv linked in."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in files.decode().split("\0"):
        if not name or name.startswith("tests/") or not (ROOT / name).is_file():
            continue
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target / name)
    (target / ".venv").symlink_to(ROOT / ".venv")
    return target


class FakePrometheus:
    """TEST FAKE of Prometheus' query API at the network boundary: answers `corral usage`'s
    GPU-hour queries as if every Job the fake API server was given ran one hour on its GPUs."""

    def __init__(self, kube_state: Path) -> None:
        self.kube_state = kube_state
        self.queries: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                length = int(self.headers["Content-Length"])
                query = parse_qs(self.rfile.read(length).decode())["query"][0]
                outer.queries.append(query)
                body = json.dumps({"status": "success",
                                   "data": {"resultType": "vector", "result": outer.answer(query)}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def gpu_hours_by_namespace(self) -> dict[str, float]:
        hours: dict[str, float] = {}
        applied = json.loads(self.kube_state.read_text()).get("applied", []) if self.kube_state.exists() else []
        for job in (o for o in applied if o.get("kind") == "Job"):
            pod = job["spec"]["template"]["spec"]
            gpus = sum(int(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0))
                       for c in pod["containers"])
            namespace = job["metadata"]["namespace"]
            hours[namespace] = hours.get(namespace, 0.0) + gpus * 1.0
        return hours

    def answer(self, query: str) -> list[dict]:
        from corral.manifests import monitoring
        if monitoring.REQUESTS_BY_NAMESPACE in query or monitoring.BUSY_GPUS_BY_NAMESPACE in query:
            return [{"metric": {"namespace": ns}, "value": [0, str(h)]} for ns, h in self.gpu_hours_by_namespace().items()]
        return []

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Reader:
    """A reader's machine: the scratch checkout, HOME, PATH and the fakes' state."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.project = scratch_checkout(tmp_path / "corral")
        self.home = tmp_path / "home"
        self.home.mkdir()
        self.fake_state = tmp_path / "fake-cloud.json"
        self.fake_state.write_text(json.dumps(account()))
        self.kube_state = tmp_path / "fake-kube.json"
        self.kube_state.write_text(json.dumps({"serverVersion": "v1.31.4", "nodes": {}}))
        ca_pem, ca_key, _ = make_cert("kubernetes", 3650, is_ca=True)
        (tmp_path / "fake-ca.crt").write_text(ca_pem)
        (tmp_path / "fake-ca.key").write_text(ca_key)
        self.prometheus = FakePrometheus(self.kube_state)
        # the data centre's hosts (onprem.md), answering ssh-keyscan and ssh at their addresses
        self.hosts = FakeSshNetwork(tmp_path / "dc1")
        self.host_keys = {address: self.hosts.add(address) for address in DC1_ADDRESSES}
        self.env = {
            "HOME": str(self.home), "USER": "alice", "LANG": "C.UTF-8", "COLUMNS": "200", "TERM": "dumb",
            "PYTHONDONTWRITEBYTECODE": "1",
            # the reader's PATH: the fakes, then the system (no pulumi, no corral until installed)
            "PATH": f"{FAKE_BIN}{os.pathsep}/usr/local/bin{os.pathsep}/usr/bin{os.pathsep}/bin",
            "FAKE_DOCTOR_STATE": str(self.fake_state), "FAKE_DOCTOR_LOG": str(tmp_path / "fake-cloud-calls.jsonl"),
            "FAKE_PULUMI_OUTPUTS": str(tmp_path / "fake-pulumi-outputs"),
            "FAKE_KUBE_STATE": str(self.kube_state), "FAKE_KUBECTL_LOG": str(tmp_path / "fake-kubectl.jsonl"),
            "FAKE_KUBE_CA_CERT": str(tmp_path / "fake-ca.crt"), "FAKE_KUBE_CA_KEY": str(tmp_path / "fake-ca.key"),
            "CORRAL_PROMETHEUS_URL": self.prometheus.url, "FAKE_SSH_NETWORK": str(self.hosts.path),
        }

    def run(self, *guides: Path, until: str | None = None, on_hosts: bool = False) -> None:
        """Run the guides' steps, one after the other in one shell; fail with the first
        command that failed or printed less than the guide shows. `until`: stop after
        that command; `on_hosts`: run ON_HOSTS' commands too (the hostlab tier)."""
        steps = [step for guide in guides for step in read_steps(guide)]
        if until is not None:
            steps = steps[:[s.text for s in steps].index(until) + 1]
        if not on_hosts:
            steps = [step for step in steps if step.text not in ON_HOSTS]
        if any(s.text.startswith("packer ") for s in steps) and not Path(REAL_PACKER).exists():
            pytest.skip(f"{REAL_PACKER} is not installed (apt-get install packer; scripts/install --test does): "
                        "the guide's `packer validate` is the real one")
        self.outcomes = run_guide(steps, self.project, self.env, self.tmp / "run")
        for outcome in self.outcomes:
            if outcome.step.not_run:
                continue
            label = outcome.step.label
            assert outcome.returncode is not None, f"{label}: not reached"
            assert outcome.returncode == 0, f"{label}: exit {outcome.returncode}\n{outcome.output}"
            missing = missing_output(outcome)
            assert not missing, f"{label}: the guide shows {missing}, the command printed:\n{outcome.output}"

    def corral(self, *args: str) -> subprocess.CompletedProcess:
        """corral as the reader runs it once the guide is done (the installed pulumi on PATH)."""
        return subprocess.run([str(self.project / ".venv" / "bin" / "corral"), *args], cwd=self.project, check=False,
                              env={**self.env, "PATH": f"{self.home}/.pulumi/bin{os.pathsep}{self.env['PATH']}"},
                              capture_output=True, text=True, timeout=120)

    def output_of(self, command: str) -> str:
        return next(o.output for o in self.outcomes if o.step.text == command)

    def cloud(self) -> dict:
        return json.loads(self.fake_state.read_text())

    def cloud_calls(self) -> list[list[str]]:
        path = Path(self.env["FAKE_DOCTOR_LOG"])
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def applied(self) -> list[dict]:
        return json.loads(self.kube_state.read_text()).get("applied", [])


@pytest.fixture
def reader(tmp_path):
    machine = Reader(tmp_path)
    yield machine
    machine.prometheus.close()


def all_guides() -> list[Path]:
    return sorted(p for p in GUIDES.glob("*.md") if p.name != "README.md")


# --- the convention itself ---------------------------------------------------------


def test_every_guide_is_there_and_every_not_run_command_is_listed_with_its_reason():
    assert {p.name for p in all_guides()} == {"aws.md", "gcp.md", "azure.md", "onprem.md"}
    marked = {}
    for guide in all_guides():
        for step in read_steps(guide):
            if step.not_run:
                assert step.text in NOT_RUN, f"{step.label}: marked `# not run` but not listed in NOT_RUN"
                marked[step.text] = step.not_run
    assert set(marked) == set(NOT_RUN), f"listed in NOT_RUN, in no guide: {set(NOT_RUN) - set(marked)}"


def test_every_command_this_tier_leaves_out_is_run_by_a_hostlab_test():
    """No command escapes: one left to the hostlab tier is in a guide, unmarked, and
    the module named runs the guides up to it (its GUIDE_COMMAND) under the hostlab marker."""
    import importlib

    shown = {step.text: step for guide in all_guides() for step in read_steps(guide) if step.kind == "command"}
    for command, module_name in ON_HOSTS.items():
        assert command in shown and not shown[command].not_run, command
        module = importlib.import_module(module_name)
        assert module.GUIDE_COMMAND == command, module_name
        assert module.pytestmark.name == "hostlab", module_name


def a_guide(tmp_path: Path, text: str) -> Path:
    guide = tmp_path / "guide.md"
    guide.write_text(text)
    return guide


def test_a_flag_that_does_not_exist_fails_the_guide(reader):
    guide = a_guide(reader.tmp, "```console\n$ . .venv/bin/activate\n$ corral validate --strict\n```\n")
    with pytest.raises(AssertionError, match=r"guide.md:3: corral validate --strict: exit 2"):
        reader.run(guide)


def test_output_a_guide_shows_but_the_command_does_not_print_fails_the_guide(reader):
    guide = a_guide(reader.tmp, "```console\n$ . .venv/bin/activate\n$ corral validate\n"
                                "ok clusters/heron.yaml: heron (aws/us-west-2, ...)\nok clusters/osprey.yaml\n```\n")
    with pytest.raises(AssertionError, match=r"shows \['ok clusters/osprey.yaml'\]"):
        reader.run(guide)


def test_a_command_marked_not_run_must_be_listed_with_its_reason(tmp_path):
    guide = a_guide(tmp_path, "```console\n$ rm -rf clusters   # not run: trust me\n```\n")
    [step] = read_steps(guide)
    assert step.not_run == "trust me" and step.text not in NOT_RUN


def test_commands_outside_console_blocks_are_refused(tmp_path):
    guide = a_guide(tmp_path, "text\n\n```sh\ncorral up kite\n```\n")
    with pytest.raises(GuideError, match=r"guide.md:3: commands go in ```console blocks"):
        read_steps(guide)


def test_a_later_command_does_not_run_after_one_failed_and_edits_and_files_apply(reader):
    guide = a_guide(reader.tmp, "```diff\n--- a/stacks/README.md\n+++ b/stacks/README.md\n@@ -1,2 +1,2 @@\n"
                                "-# Stack settings\n+# Stack settings, edited\n \n```\n\n"
                                "```yaml\n# file: notes/job.yaml\nkind: Job\n```\n\n"
                                "```console\n$ grep -c edited stacks/README.md && cat notes/job.yaml\n"
                                "kind: Job\n$ false\n$ touch never\n```\n")
    outcomes = run_guide(read_steps(guide), reader.project, reader.env, reader.tmp / "order")
    assert [o.returncode for o in outcomes] == [0, 0, 0, 1, None]
    assert (reader.project / "notes" / "job.yaml").read_text() == "kind: Job\n"
    assert not (reader.project / "never").exists()


# --- AWS ------------------------------------------------------------------------------


def check_gpu_job(reader: Reader, cluster_name: str, pool_name: str, job_name: str = "nvidia-smi") -> None:
    """The Job the guide applied would run on the team's GPU pool: corral's placement
    policy admits it in that namespace, and it tolerates every taint the pool's nodes
    keep once their GPU checks passed."""
    cluster = load_fleet([reader.project / "clusters"]).clusters[cluster_name]
    jobs = [o for o in reader.applied() if o.get("kind") == "Job" and o["metadata"]["name"] == job_name]
    assert len(jobs) == 1, reader.applied()
    job = jobs[0]
    namespace = job["metadata"]["namespace"]
    team = next(t for t in cluster.scheduling.teams if namespace in t.namespaces)
    pool = next(p for p in cluster.node_pools if p.name == pool_name)
    assert pool.name in team.reserved_pools
    pod = job["spec"]["template"]["spec"]
    objects = {object_key(o): o for o in all_objects(render(cluster))}
    placement = objects[f"ValidatingAdmissionPolicy/{policy.PLACEMENT_POLICY_NAME}"]["spec"]
    allowed, messages = evaluate_pod_policy(placement, namespace, pod)
    assert allowed, messages
    assert f"Namespace/{namespace}" in objects, "the team's namespace is one of corral's add-ons"
    for taint in cluster.node_taints(pool):
        if taint.key == PREFLIGHT_TAINT_KEY:
            continue  # lifted by the health agent once the node's GPUs pass (docs/gpu-health.md)
        assert any(t["key"] == taint.key and t.get("effect") == taint.effect and
                   (t.get("operator") == "Exists" or t.get("value") == taint.value)
                   for t in pod.get("tolerations", [])), f"the Job does not tolerate {taint}"
    gpus = sum(int(c["resources"]["limits"]["nvidia.com/gpu"]) for c in pod["containers"])
    assert 1 <= gpus <= pool.gpu.count
    # the pool's nodes: the labels they register with, and the two corral-node-approver gives them
    labels = {**cluster.node_labels(pool), policy.POOL_NODE_LABEL: pool.name, policy.TEAM_NODE_LABEL: team.name}
    assert all(labels.get(key) == value for key, value in pod.get("nodeSelector", {}).items()), \
        f"the Job's nodeSelector {pod.get('nodeSelector')} matches no node of {pool.name}: {labels}"


@dataclass(frozen=True)
class CloudGuide:
    """What a cloud guide builds, to hold its outcome to."""
    guide: str
    cluster: str
    cloud: str
    region: str
    pools: list[tuple[str, int]]       # (name, GPUs per machine), in order
    gpu_pool: str | None               # the pool the guide's GPU Job runs on (None: no Job)
    backend: str
    booted_image_known: Callable[[dict, str], bool] | None   # (fake cloud, image) -> the cloud has it
    warnings: set[str] = frozenset()   # doctor checks that may warn here, and why (see the guide)


CLOUD_GUIDES = [
    CloudGuide("aws.md", "kite", "aws", "us-east-1", [("cpu", 0), ("gpu-a10g", 4)], "gpu-a10g",
               "s3://acme-corral-pulumi-state", lambda cloud, image: image in cloud["aws"]["images"]),
    # testIamPermissions is an HTTPS call to Google that a test cannot reach: doctor warns.
    CloudGuide("gcp.md", "lark", "gcp", "us-central1", [("cpu", 0), ("gpu-l4", 4)], "gpu-l4",
               "gs://acme-corral-pulumi-state",
               lambda cloud, image: "projects/corral-lark/global/images/family/corral-gpu-node" == image
               and image in cloud["gcloud"]["images"], warnings={"cloud.permissions"}),
    # Azure machines boot the managed image Packer's azure-arm build made (by its ARM id).
    CloudGuide("azure.md", "lemur", "azure", "eastus2", [("cpu", 0), ("gpu-a100", 1)], "gpu-a100",
               "azblob://corral-state?storage_account=acmecorralstate",
               lambda cloud, image: image.endswith("/resourceGroups/corral-images/providers/Microsoft.Compute/images/"
                                                   "corral-gpu-node-k8s-1-36-4-nvidia-580-173-02")
               and image in cloud["az"]["resources"]),
]


@pytest.fixture(scope="module")
def kite(tmp_path_factory):
    """The AWS guide, then the on-prem guide continuing it in the same shell (run once for both tests)."""
    machine = Reader(tmp_path_factory.mktemp("kite"))
    machine.run(GUIDES / "aws.md", GUIDES / "onprem.md")
    yield machine
    machine.prometheus.close()


def test_the_aws_guide_runs_from_an_empty_account_to_a_gpu_job(kite):
    check_cloud_guide(kite, CLOUD_GUIDES[0])


@pytest.mark.parametrize("case", CLOUD_GUIDES[1:], ids=lambda case: case.guide)
def test_a_cloud_guide_runs_from_an_empty_account_to_a_gpu_job(reader, case):
    reader.run(GUIDES / case.guide)
    check_cloud_guide(reader, case)


def azure_boot_images(cluster, clusters: Path) -> dict[str, str]:
    """VM or scale set -> the image id it boots, in the plan `pulumi up` ran (plan_stack, as the fake does)."""
    from corral.infra.plan import plan_stack

    machines = {}
    for resource in plan_stack(cluster, clusters).resources:
        profile = resource["inputs"].get("virtualMachineProfile", resource["inputs"])
        if resource["type"] in ("azure-native:compute:VirtualMachine", "azure-native:compute:VirtualMachineScaleSet"):
            machines[resource["name"]] = profile["storageProfile"]["imageReference"].get("id")
    assert any(name.startswith(f"{cluster.name}-gpu-a100") for name in machines), machines
    return machines


def check_cloud_guide(reader: Reader, case: CloudGuide) -> None:
    project, name = reader.project, case.cluster

    # the cluster file and its stack, as the guide's commands left them
    cluster = load_fleet([project / "clusters"]).clusters[name]
    assert (cluster.control_plane.cloud, cluster.control_plane.region) == (case.cloud, case.region)
    pools = [(p.name, p.gpu.count if p.gpu else 0) for p in cluster.node_pools]
    assert pools[:len(case.pools)] == case.pools   # (the on-prem guide adds its pool after them)
    assert [s.name for s in cluster.sites] == ["dc1"]
    stack = yaml.safe_load((project / "stacks" / f"Pulumi.{name}.yaml").read_text())["config"]
    if case.booted_image_known is not None:
        image = stack["corral:nodeImage"]
        assert stack["corral:gpuNodeImage"] == image and case.booted_image_known(reader.cloud(), image), \
            "the image the stack boots is the one Packer built"
        if case.cloud == "azure":
            assert set(azure_boot_images(cluster, project / "clusters").values()) == {image}, \
                "every VM and scale set boots the image Packer built (not the Marketplace image)"

    # doctor: nothing to fix, every check it makes ran, read-only (the fakes refuse any write)
    verdict = json.loads(reader.corral("doctor", name, "-o", "json").stdout)
    assert verdict["ok"] is True and verdict["counts"]["fail"] == 0, verdict
    assert {c["check"] for c in verdict["checks"] if c["status"] == "warn"} <= case.warnings, verdict
    assert {c["check"] for c in verdict["checks"]} >= {"pulumi.cli", "pulumi.login", "pulumi.stack", "pulumi.config",
                                                       "cloud.credentials", "cloud.permissions", "cloud.images",
                                                       "cloud.quotas", "site.vpn"}

    # `pulumi up` ran the cluster's program: its stack has every resource `corral plan` counted
    summary = re.search(rf"{name} \({case.cloud}\): (\d+) resources", reader.output_of(f"corral plan {name}"))
    stacks = {s["name"]: s for s in reader.cloud()["pulumi"]["stacks"]}
    assert stacks[name]["resourceCount"] == int(summary[1]) > 100
    assert reader.cloud()["pulumi"]["url"] == case.backend
    outputs = json.loads(Path(f"{reader.env['FAKE_PULUMI_OUTPUTS']}.{name}").read_text())
    assert set(outputs["vpn"]) == {"dc1"}

    # no secret the guide handled (the stack's token, the VPN key, the admin kubeconfig) is left in a file
    secrets = [outputs["bootstrapToken"], *outputs["vpnSharedKeys"].values(), "TEST FAKE admin kubeconfig"]
    for folder in (project, reader.home):
        for path in folder.rglob("*"):
            if path.is_file() and not path.is_symlink() and ".venv" not in path.relative_to(folder).parts:
                text = path.read_text(errors="replace")
                assert not [s for s in secrets if s in text], f"a secret was written to {path}"

    # the personal kubeconfig: a client certificate for alice, 0600
    kubeconfig = project / "alice.kubeconfig"
    assert oct(kubeconfig.stat().st_mode & 0o777) == "0o600"
    assert json.loads(kubeconfig.read_text())["users"][0]["name"] == "alice"

    if case.gpu_pool is not None:
        check_gpu_job(reader, name, case.gpu_pool)
    else:
        assert not [o for o in reader.applied() if o.get("kind") == "Job"]


def test_the_onprem_guide_joins_racks_to_the_aws_guide_cluster(kite):
    reader, project = kite, kite.project

    cluster = load_fleet([project / "clusters"]).clusters["kite"]
    pool = next(p for p in cluster.node_pools if p.name == "gpu-h100-dc1")
    assert pool.provider == "onprem" and pool.site == "dc1" and pool.gpu.count == 8
    assert [pool.host_addresses[h] for h in pool.host_names] == DC1_ADDRESSES

    # the known hosts file holds exactly the keys each host presented, under its name
    recorded = sorted(line.split() for line in (project / "clusters" / "kite.known_hosts").read_text().splitlines()
                      if line.strip() and not line.startswith("#"))
    presented = sorted([f"gpu-{n:03d}.dc1.internal", *key] for n, address in enumerate(DC1_ADDRESSES, 1)
                       for key in reader.host_keys[address])
    assert recorded == presented

    # doctor reached every host as the join will, host key checked, and found nothing to fix
    verdict = json.loads(reader.corral("doctor", "kite", "-o", "json").stdout)
    assert verdict["ok"] is True, verdict
    statuses = {c["check"]: c["status"] for c in verdict["checks"] if c["check"].startswith("onprem.")}
    assert statuses == {"onprem.hostkeys": "pass", "onprem.ssh": "pass", "onprem.sudo": "pass", "onprem.os": "pass"}

    check_gpu_job(reader, "kite", "gpu-h100-dc1", job_name="h100-smoke")
