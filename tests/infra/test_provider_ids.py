"""Provider IDs: every cloud machine that runs a kubelet registers with the ID
its cloud's cluster-autoscaler knows it by; on-prem nodes with none.

The boot snippet (corral/templates/scripts/provider-id.sh.j2) is rendered per
cloud with its metadata address pointed at a fake metadata server on
127.0.0.1 and run with bash; the fake answers only requests that carry what
the real service demands (IMDSv2 token, Metadata-Flavor, Metadata: true).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import jinja2
import pytest
import yaml

from corral.machine.api_server import ControlPlaneTls, render_kubeadm_init_config
from corral.machine.cloud_init import render_api_server_cloud_init, render_pool_cloud_init
from corral.machine.files import TEMPLATES, render
from corral.machine.kubeadm import CRI_SOCKET, JOIN_TEMPLATE, KUBEADM_DIR, PROVIDER_ID_PLACEHOLDER, JoinToken
from corral.machine.kubelet_node import METADATA_URL, PROVIDER_ID_SCHEMES, PROVIDER_ID_SCRIPT, render_provider_id_script
from corral.machine.pool_node import pool_secret_files
from corral.machine.secret_fetch import SecretRef
from corral.manifests.policy import autoscaler_args
from corral.model import load_fleet
from corral.model.layout import layout

from .conftest import EXAMPLES, ROOT

TOKEN = "abcdef.0123456789abcdef"
DIGEST = "sha256:" + "ab" * 32
AWS_SESSION_TOKEN = "fake-imds-session-token"
AZURE_API_VERSION = "2021-02-01"


# --- The fake metadata server --------------------------------------------------


class FakeMetadata:
    """What one machine's metadata service answers: path -> text, by cloud."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}
        self.requests: list[str] = []


def _handler(state: FakeMetadata) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_args) -> None:  # quiet test output
            pass

        def _send(self, status: int, body: str = "") -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_PUT(self) -> None:  # noqa: N802 (http.server's naming)
            state.requests.append(f"PUT {self.path}")
            # IMDSv2: a token only for a PUT that says how long it should live.
            if self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                self._send(200, AWS_SESSION_TOKEN)
            else:
                self._send(400)

        def do_GET(self) -> None:  # noqa: N802
            state.requests.append(f"GET {self.path}")
            url = urlsplit(self.path)
            if url.path.startswith("/latest/meta-data/"):
                if self.headers.get("X-aws-ec2-metadata-token") != AWS_SESSION_TOKEN:
                    return self._send(401)
                key = "aws:" + url.path.removeprefix("/latest/meta-data/")
            elif url.path.startswith("/computeMetadata/v1/"):
                if self.headers.get("Metadata-Flavor") != "Google":
                    return self._send(403)
                key = "gcp:" + url.path.removeprefix("/computeMetadata/v1/")
            elif url.path.startswith("/metadata/instance/compute/"):
                query = parse_qs(url.query)
                if self.headers.get("Metadata") != "true" or query.get("api-version") != [AZURE_API_VERSION]:
                    return self._send(400)
                if query.get("format") != ["text"]:
                    return self._send(400)
                key = "azure:" + url.path.removeprefix("/metadata/instance/compute/")
            else:
                return self._send(404)
            if key not in state.values:
                return self._send(404)
            self._send(200, state.values[key])

    return Handler


@pytest.fixture
def fake_metadata_server() -> Iterator[tuple[str, FakeMetadata]]:
    """A fake instance metadata service on loopback: (base URL, its state)."""
    state = FakeMetadata()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", state
    finally:
        server.shutdown()
        server.server_close()


def run_snippet(cloud: str, base_url: str, tmp_path: Path) -> subprocess.CompletedProcess:
    script = tmp_path / f"provider-id-{cloud}.sh"
    script.write_text(render_provider_id_script(cloud, base_url))
    env = {"PATH": os.environ["PATH"], "no_proxy": "*", "NO_PROXY": "*"}
    return subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=120, env=env)


AWS_MACHINE = {"aws:placement/availability-zone": "us-west-2b", "aws:instance-id": "i-0123456789abcdef0"}
GCP_MACHINE = {
    "gcp:project/project-id": "ibis-prod",
    "gcp:instance/zone": "projects/123456789012/zones/us-central1-c",
    "gcp:instance/name": "ibis-cpu-n2-c-x7k2",
}
AZURE_COMMON = {
    "azure:subscriptionId": "11111111-2222-3333-4444-555555555555",
    "azure:resourceGroupName": "Jaguar-RG",
}
AZURE_SCALE_SET_VM = {
    **AZURE_COMMON, "azure:vmScaleSetName": "jaguar-cpu-d64-2", "azure:name": "jaguar-cpu-d64-2_17",
}
AZURE_STANDALONE_VM = {**AZURE_COMMON, "azure:vmScaleSetName": "", "azure:name": "jaguar-apiserver-0"}


@pytest.mark.parametrize(("cloud", "machine", "expected"), [
    ("aws", AWS_MACHINE, "aws:///us-west-2b/i-0123456789abcdef0"),
    ("gcp", GCP_MACHINE, "gce://ibis-prod/us-central1-c/ibis-cpu-n2-c-x7k2"),
    ("azure", AZURE_SCALE_SET_VM,
     "azure:///subscriptions/11111111-2222-3333-4444-555555555555/resourceGroups/jaguar-rg/providers/"
     "Microsoft.Compute/virtualMachineScaleSets/jaguar-cpu-d64-2/virtualMachines/17"),
    ("azure", AZURE_STANDALONE_VM,
     "azure:///subscriptions/11111111-2222-3333-4444-555555555555/resourceGroups/jaguar-rg/providers/"
     "Microsoft.Compute/virtualMachines/jaguar-apiserver-0"),
], ids=["aws", "gcp", "azure-scale-set", "azure-standalone"])
def test_snippet_prints_the_provider_id_the_autoscaler_expects(cloud, machine, expected, fake_metadata_server, tmp_path):
    base_url, state = fake_metadata_server
    state.values.update(machine)
    result = run_snippet(cloud, base_url, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected + "\n"
    if cloud == "aws":
        assert state.requests[0] == "PUT /latest/api/token"  # IMDSv2 session first


@pytest.mark.parametrize(("cloud", "machine", "message"), [
    ("aws", {**AWS_MACHINE, "aws:instance-id": "i-0123; rm -rf /"}, "unexpected instance id"),
    ("aws", {"aws:placement/availability-zone": "us-west-2b"}, ""),  # no instance id: curl fails on 404
    ("gcp", {**GCP_MACHINE, "gcp:instance/name": ""}, "gave no instance name"),
    ("azure", {**AZURE_SCALE_SET_VM, "azure:name": "some-other-vm_3"}, "not named <scale set>_<instance id>"),
    ("azure", {**AZURE_SCALE_SET_VM, "azure:name": "jaguar-cpu-d64-2_abc"}, "not named <scale set>_<instance id>"),
], ids=["aws-odd-value", "aws-missing", "gcp-empty", "azure-foreign-name", "azure-flexible-name"])
def test_snippet_fails_clearly_instead_of_printing_a_wrong_id(cloud, machine, message, fake_metadata_server, tmp_path):
    base_url, state = fake_metadata_server
    state.values.update(machine)
    result = run_snippet(cloud, base_url, tmp_path)
    assert result.returncode != 0
    assert result.stdout == ""
    assert message in result.stderr


def test_unknown_cloud_is_a_clear_error():
    with pytest.raises(ValueError, match="no provider ID for cloud 'openstack'"):
        render_provider_id_script("openstack")


# --- Wiring: every cloud kubelet machine gets it, the same script as tested --------


def example(name: str):
    return load_fleet([EXAMPLES]).clusters[name]


CP_TLS = ControlPlaneTls(*[f"-----BEGIN X-----\n{i}\n-----END X-----\n" for i in range(9)])
TOKENS = [JoinToken(TOKEN, "API servers")]


def ref(cluster) -> SecretRef:
    """Where the machines' secrets would live (the user data names it, nothing more)."""
    return SecretRef(cluster.control_plane.cloud, "store", f"{cluster.name}-role")


def files_of(document: str) -> dict[str, dict]:
    return {f["path"]: f for f in yaml.safe_load(document)["write_files"]}


def kubelet_args(registration: dict) -> dict[str, str]:
    args = registration.get("kubeletExtraArgs") or {}
    return {a["name"]: a["value"] for a in args} if isinstance(args, list) else dict(args)


@pytest.mark.parametrize("name", ["jaguar", "heron", "ibis"])
def test_every_cloud_kubelet_machine_registers_with_a_provider_id(name):
    cluster = example(name)
    lay = layout(cluster)
    cloud = cluster.control_plane.cloud
    shipped = render_provider_id_script(cloud)
    assert f"METADATA={json.dumps(METADATA_URL)}" in shipped
    # The tested script is the shipped one but for the metadata address.
    assert render_provider_id_script(cloud, "http://127.0.0.1:1") == shipped.replace(METADATA_URL, "http://127.0.0.1:1")

    documents = {
        "first API server": render_api_server_cloud_init(cluster, lay, 0, ref(cluster)),
        "joining API server": render_api_server_cloud_init(cluster, lay, 1, ref(cluster)),
        **{f"pool {p.name}": render_pool_cloud_init(cluster, lay, p, ref(cluster)) for p in cluster.cloud_pools},
    }
    # The first API server's init config travels in the secret store (it holds the tokens).
    init = render_kubeadm_init_config(cluster, lay, TOKENS)
    init_registrations = [d["nodeRegistration"] for d in yaml.safe_load_all(init) if d and "nodeRegistration" in d]
    assert [kubelet_args(r)["provider-id"] for r in init_registrations] == [PROVIDER_ID_PLACEHOLDER]
    for what, document in documents.items():
        files = files_of(document)
        assert files[PROVIDER_ID_SCRIPT]["content"] == shipped, what
        assert files[PROVIDER_ID_SCRIPT]["permissions"] == "0755"
        configs = [path for path in files if path.startswith(KUBEADM_DIR)]
        assert configs, what
        for path in configs:
            registrations = [d["nodeRegistration"] for d in yaml.safe_load_all(files[path]["content"])
                             if d and "nodeRegistration" in d]
            assert len(registrations) == 1, (what, path)
            assert kubelet_args(registrations[0])["provider-id"] == PROVIDER_ID_PLACEHOLDER, (what, path)
        boot = next(f["content"] for path, f in files.items()
                    if path in ("/usr/local/sbin/corral-api-server", "/usr/local/sbin/corral-pool-node"))
        # Filled in before any kubeadm run, from the script's own assignment (set -e).
        assert f"PROVIDER_ID=$({PROVIDER_ID_SCRIPT})" in boot
        assert boot.index(PROVIDER_ID_PLACEHOLDER) < boot.index("kubeadm_attempts ")


def test_pool_boot_script_fills_in_the_provider_id_before_joining(fake_metadata_server, tmp_path):
    """The pool node's boot script, run with bash: the JoinConfiguration kubeadm
    gets names this machine's provider ID (kubeadm and node prep are fakes)."""
    base_url, state = fake_metadata_server
    state.values.update(AWS_MACHINE)
    heron = example("heron")
    pool = heron.cloud_pools[0]
    files = files_of(render_pool_cloud_init(heron, layout(heron), pool, ref(heron)))
    kubeadm_dir, sbin, bin_dir = tmp_path / "kubeadm", tmp_path / "sbin", tmp_path / "bin"
    for folder in (kubeadm_dir, sbin, bin_dir):
        folder.mkdir()
    (kubeadm_dir / "join.yaml").write_text(files[f"{KUBEADM_DIR}/join.yaml"]["content"])
    # What corral-fetch-secrets unpacked from the pool's secret.
    for secret_file in pool_secret_files(TOKEN, DIGEST):
        (kubeadm_dir / Path(secret_file.path).name).write_text(secret_file.content)
    (sbin / "corral-provider-id").write_text(files[PROVIDER_ID_SCRIPT]["content"].replace(METADATA_URL, base_url))
    (sbin / "corral-node-prep").write_text("#!/bin/bash\ntrue\n")
    joined = tmp_path / "joined.yaml"
    (bin_dir / "kubeadm").write_text(f'#!/bin/bash\n[ "$1 $2" = "join --config" ] && cp "$3" {joined}\n')
    (bin_dir / "hostname").write_text("#!/bin/bash\necho IP-10-201-8-7\n")
    for script in (*sbin.iterdir(), *bin_dir.iterdir()):
        script.chmod(0o755)
    boot = (files["/usr/local/sbin/corral-pool-node"]["content"]
            .replace(KUBEADM_DIR, str(kubeadm_dir)).replace("/usr/local/sbin/", f"{sbin}/")
            .replace("/etc/kubernetes/", f"{tmp_path}/"))
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "no_proxy": "*", "NO_PROXY": "*", "TMPDIR": str(tmp_path)}
    result = subprocess.run(["bash", "-c", boot], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    joined_config = yaml.safe_load(joined.read_text())
    registration = joined_config["nodeRegistration"]
    assert registration["name"] == "ip-10-201-8-7"
    assert kubelet_args(registration)["provider-id"] == "aws:///us-west-2b/i-0123456789abcdef0"
    # The fetched token and CA pin were filled in; the token and the filled copy are gone.
    assert joined_config["discovery"]["bootstrapToken"]["token"] == TOKEN
    assert joined_config["discovery"]["bootstrapToken"]["caCertHashes"] == [DIGEST]
    assert not (kubeadm_dir / "bootstrap-token").exists()
    assert TOKEN not in (kubeadm_dir / "join.yaml").read_text()  # the user data's copy keeps its placeholders
    assert not [p for p in tmp_path.glob("tmp.*")]  # mktemp's filled copy removed


def test_pool_boot_stops_when_the_metadata_service_has_no_answer(fake_metadata_server, tmp_path):
    base_url, _state = fake_metadata_server  # knows nothing: every read is a 404
    ibis = example("ibis")
    files = files_of(render_pool_cloud_init(ibis, layout(ibis), ibis.cloud_pools[0], ref(ibis)))
    sbin, bin_dir = tmp_path / "sbin", tmp_path / "bin"
    sbin.mkdir(), bin_dir.mkdir()
    (tmp_path / "join.yaml").write_text(files[f"{KUBEADM_DIR}/join.yaml"]["content"])
    (sbin / "corral-provider-id").write_text(files[PROVIDER_ID_SCRIPT]["content"].replace(METADATA_URL, base_url))
    (sbin / "corral-node-prep").write_text("#!/bin/bash\ntrue\n")
    marker = tmp_path / "kubeadm-ran"
    (bin_dir / "kubeadm").write_text(f"#!/bin/bash\ntouch {marker}\n")
    for script in (*sbin.iterdir(), *bin_dir.iterdir()):
        script.chmod(0o755)
    boot = (files["/usr/local/sbin/corral-pool-node"]["content"]
            .replace(f"{KUBEADM_DIR}/join.yaml", str(tmp_path / "join.yaml"))
            .replace("/usr/local/sbin/", f"{sbin}/").replace("/etc/kubernetes/", f"{tmp_path}/"))
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "no_proxy": "*", "NO_PROXY": "*", "TMPDIR": str(tmp_path)}
    result = subprocess.run(["bash", "-c", boot], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode != 0
    assert not marker.exists()  # never joined without its provider ID
    assert PROVIDER_ID_PLACEHOLDER in (tmp_path / "join.yaml").read_text()


# --- On-prem nodes: the same template, no provider ID ---------------------------------


def _role_template_vars() -> dict:
    """The `vars:` the kubelet_join role renders the shared JoinConfiguration with."""
    tasks = yaml.safe_load((ROOT / "ansible/roles/kubelet_join/tasks/main.yml").read_text())

    def walk(items) -> Iterator[dict]:
        for task in items or []:
            yield task
            for key in ("block", "rescue", "always"):
                yield from walk(task.get(key))

    (task,) = [t for t in walk(tasks) if (t.get("ansible.builtin.template") or {}).get("src") == "{{ corral_join_template }}"]
    return task["vars"]


def test_on_prem_join_configuration_has_no_provider_id():
    role_vars = _role_template_vars()
    assert "provider_id" not in role_vars  # the role never passes one
    jaguar = example("jaguar")
    onprem = next(p for p in jaguar.node_pools if p.provider == "onprem")
    values = {
        "api_endpoint": layout(jaguar).api_endpoint, "token": TOKEN, "ca_cert_hashes": [DIGEST],
        "node_name": "gpu-001.sf1.internal", "node_labels": jaguar.node_labels(onprem),
        "node_taints": [{"key": t.key, "value": t.value, "effect": t.effect} for t in jaguar.node_taints(onprem)],
        "cri_socket": CRI_SOCKET, "kubernetes_version": jaguar.kubernetes.version,
        "patches_dir": "/etc/kubernetes/patches",
    }
    assert set(values) == set(role_vars)  # exactly what the role passes
    text = render(JOIN_TEMPLATE, **values)
    registration = yaml.safe_load(text)["nodeRegistration"]
    assert "provider-id" not in kubelet_args(registration)
    assert "node-labels" in kubelet_args(registration)
    assert "provider" not in text.replace("corral.dev/provider", "")


@pytest.mark.parametrize("version", ["1.31.4", "1.30.8"])
def test_join_template_with_a_provider_id_is_identical_under_every_whitespace_setting(version):
    """Ansible renders with trim_blocks, cloud-init without: the new branch keeps
    the template's whitespace rule."""
    template = TEMPLATES / JOIN_TEMPLATE
    for labels in ({}, {"corral.dev/pool": "cpu"}):
        values = {"api_endpoint": "10.0.0.5:6443", "token": TOKEN, "ca_cert_hashes": [DIGEST], "node_name": "n1",
                  "node_labels": labels, "node_taints": [], "kubernetes_version": version,
                  "provider_id": "gce://p/us-central1-a/n1"}
        outputs = set()
        for trim, lstrip, keep in itertools.product([False, True], repeat=3):
            env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(template.parent.parent)),
                                     undefined=jinja2.StrictUndefined,
                                     trim_blocks=trim, lstrip_blocks=lstrip, keep_trailing_newline=keep)
            outputs.add(env.get_template(JOIN_TEMPLATE).render(**values))
        assert len(outputs) == 1, "\n=====\n".join(outputs)
        args = kubelet_args(yaml.safe_load(outputs.pop())["nodeRegistration"])
        assert args["provider-id"] == "gce://p/us-central1-a/n1"
        assert ("node-labels" in args) == bool(labels)


# --- The autoscaler speaks the pools' cloud ------------------------------------------


@pytest.mark.parametrize("name", ["jaguar", "heron", "ibis"])
def test_autoscaler_cloud_provider_matches_the_pools_cloud_and_their_provider_ids(name, fake_metadata_server, tmp_path):
    cluster = example(name)
    assert cluster.cloud_pools
    (provider_arg,) = [a for a in autoscaler_args(cluster) if a.startswith("--cloud-provider=")]
    autoscaler_cloud = provider_arg.split("=", 1)[1]
    for pool in cluster.cloud_pools:
        assert PROVIDER_ID_SCHEMES[pool.provider] == autoscaler_cloud, pool.name
    # ... and the IDs the pools' machines register with use that provider's scheme.
    base_url, state = fake_metadata_server
    state.values.update({**AWS_MACHINE, **GCP_MACHINE, **AZURE_SCALE_SET_VM})
    result = run_snippet(cluster.control_plane.cloud, base_url, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"{autoscaler_cloud}://")
