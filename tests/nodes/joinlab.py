"""A small cluster whose on-prem pool is throwaway lab hosts, for `corral join`.

Shared by the real-host join test and `benchmarks/bench_join.py`: it writes
a cluster file whose hosts are lab hosts, an extra-vars file pointing the
roles at the lab's signed apt repository of test fakes (what a site's mirror
would be), join material, the fake kubectl (tests/nodes/fake_kubectl) that
takes the run's fresh bootstrap token in place of an API server, and the
environment Ansible runs in. The cluster file gives every host its address
and the site's ssh user and key (the hosts' names resolve nowhere on this
machine: corral reaches them by address), and `corral hosts trust` records
their host keys before any join, so every join checks them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from corral.model.containerd import default_containerd, pause_image
from corral.util import write_atomic

REPO = Path(__file__).resolve().parents[2]
CA_HASH = "sha256:" + "0123456789abcdef" * 4
KEY_ON_HOST = "/etc/corral-test/site-mirror-key.asc"
CLUSTER = "kestrel"


def host_names(gpu: int, cpu: int, prefix: str = "jn") -> tuple[list[str], list[str]]:
    return ([f"{prefix}-gpu-{i:03d}.sf1.internal" for i in range(1, gpu + 1)],
            [f"{prefix}-cpu-{i:03d}.sf1.internal" for i in range(1, cpu + 1)])


def cluster_text(site_cidr: str, gpu_hosts: list[str], cpu_hosts: list[str],
                 addresses: dict[str, str] | None = None, ssh: str = "") -> str:
    """The lab cluster; `addresses` (host -> address) gives each pool an addresses
    list beside its hosts list, one entry per host; `ssh` the site's ssh settings."""
    def where(hosts: list[str]) -> str:
        return f"\n    addresses: {json.dumps([addresses[h] for h in hosts])}" if addresses else ""

    pools = []
    if gpu_hosts:
        pools.append(f"""  - name: gpu-h100
    provider: onprem
    site: sf1
    hosts: {json.dumps(gpu_hosts)}{where(gpu_hosts)}
    gpu: {{model: H100, count: 8, driver: "550.127.05", fabricManager: true}}
    # The lab hosts' only NIC; a container has no RDMA, so the role persists
    # the QoS settings and skips applying them.
    roce: {{interfaces: [host0], mtu: 9000, pfcPriority: 3, dscp: 26, ecn: true}}
""")
    if cpu_hosts:
        pools.append(f"""  - name: cpu-edge
    provider: onprem
    site: sf1
    hosts: {json.dumps(cpu_hosts)}{where(cpu_hosts)}
""")
    return f"""apiVersion: corral.dev/v1
kind: Cluster
name: {CLUSTER}
kubernetes: {{version: "1.31.4", podCIDR: 10.128.0.0/14, serviceCIDR: 10.96.0.0/16}}
controlPlane:
  cloud: azure
  region: eastus2
  zones: ["1", "2", "3"]
  networkCIDR: 10.200.0.0/20
  apiServers: {{count: 3, machineType: Standard_D8s_v5}}
  etcd: {{members: 3, machineType: Standard_E8s_v5}}
sites:
  - name: sf1
    cidrs: [{site_cidr}]
    vpn: {{peerAddress: 203.0.113.10, bgpASN: 65010}}{f"{chr(10)}    ssh: {ssh}" if ssh else ""}
network:
  # Across the site's VPN (Azure: 1400) less 50 bytes of VXLAN; it fits the
  # lab's 1500-byte veth too.
  flannel: {{backend: vxlan, directRouting: true, mtu: 1350}}
scheduling:
  teams:
    - {{name: robotics, namespaces: [robotics], reservedPools: [{"gpu-h100" if gpu_hosts else "cpu-edge"}]}}
nodePools:
{"".join(pools)}"""


def with_host(text: str, pool_hosts: list[str], host) -> str:
    """Cluster text with lab `host` added to the pool whose hosts are `pool_hosts` (and addresses)."""
    names = [*pool_hosts, host.name]
    text = text.replace(f"hosts: {json.dumps(pool_hosts)}", f"hosts: {json.dumps(names)}", 1)
    lines = text.splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.strip() == f"hosts: {json.dumps(names)}")
    addresses = json.loads(lines[at + 1].split(":", 1)[1])
    lines[at + 1] = f"    addresses: {json.dumps([*addresses, host.ip])}\n"
    return "".join(lines)


def site_mirror_vars(repo) -> dict:
    """What a data centre's mirror would serve, here the lab's fake repos (key: put_key)."""
    key_url = f"file://{KEY_ON_HOST}"
    return {
        "corral_nvidia_repo_url": repo.url("cuda"),
        "corral_nvidia_repo_key_url": key_url,
        "corral_nvidia_container_toolkit_repo_url": repo.url("nvidia-container-toolkit"),
        "corral_nvidia_container_toolkit_repo_key_url": key_url,
        "corral_kubernetes_repo_url": repo.url("kubernetes-v1.31"),
        "corral_kubernetes_repo_key_url": key_url,
        # Flat like the others (Docker's real repository has suites).
        "corral_containerd_repo_url": repo.url("docker"),
        "corral_containerd_repo_key_url": key_url,
        "corral_containerd_repo_suite": "/",
        "corral_containerd_repo_components": "",
        "corral_apt_mirror": None,
    }


def remove_hosts(lab, hosts) -> None:
    """Remove every host, going on past one that cannot be removed."""
    for host in hosts:
        try:
            lab.remove_host(host)
        except Exception as exc:  # keep removing the others
            print(f"could not remove {host.name}: {exc}")


def put_key(repo, host) -> None:
    """The lab repository's signing key where site_mirror_vars says it is."""
    key = host.path(KEY_ON_HOST)
    key.parent.mkdir(parents=True, exist_ok=True)
    key.write_text(repo.key_armored)


def changed_tasks(artifacts: list[Path]) -> dict[str, list[str]]:
    """host -> names of the tasks that changed it, from ansible-runner's job events."""
    changed: dict[str, list[str]] = {}
    for run in artifacts:
        for path in sorted((run / "job_events").glob("*.json"), key=lambda p: int(p.name.split("-")[0])):
            event = json.loads(path.read_text())
            data = event.get("event_data") or {}
            if event.get("event") == "runner_on_ok" and (data.get("res") or {}).get("changed"):
                changed.setdefault(data["host"], []).append(data.get("task", "?"))
    return changed


def artifact_dirs(setup: "JoinSetup") -> set[Path]:
    """The ansible-runner runs in the setup's runs folder so far."""
    root = setup.runs_dir / "artifacts"
    return {p for p in root.iterdir() if p.is_dir()} if root.is_dir() else set()


@dataclass
class JoinSetup:
    clusters: Path
    outputs: Path
    extra_vars: Path
    runs_dir: Path
    env: dict[str, str]
    fake_bin: Path
    kubectl_log: Path
    # For testinfra and people: reaches the hosts by name (corral needs none).
    ssh_config: Path | None = None

    def tokens(self) -> list[str]:
        """Every bootstrap token the runs so far created (as the fake kubectl saw them)."""
        if not self.kubectl_log.exists():
            return []
        calls = [json.loads(line) for line in self.kubectl_log.read_text().splitlines()]
        return [f"{c['object']['stringData']['token-id']}.{c['object']['stringData']['token-secret']}"
                for c in calls if "object" in c]


def prepare(lab, repo, hosts, workdir: Path, gpu_hosts: list[str], cpu_hosts: list[str]) -> JoinSetup:
    """Write the cluster file, outputs, site overrides; put the repo key on each host."""
    clusters = workdir / "clusters"
    clusters.mkdir(exist_ok=True)
    write_atomic(clusters / f"{CLUSTER}.yaml", cluster_text(
        str(lab.config.network), gpu_hosts, cpu_hosts, addresses={h.name: h.ip for h in hosts},
        ssh=f"{{user: root, privateKeyFile: {lab.key_path}}}"))
    outputs = workdir / "outputs.json"
    outputs.write_text(json.dumps({"apiEndpoint": "10.200.0.5:6443", "caCertHash": CA_HASH}))
    # No API server in the lab: the fake kubectl takes the run's bootstrap token.
    fake_bin = workdir / "fake-bin"
    fake_bin.mkdir(exist_ok=True)
    if not (fake_bin / "kubectl").exists():
        (fake_bin / "kubectl").symlink_to(Path(__file__).resolve().with_name("fake_kubectl"))
    kubeconfig = workdir / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n# TEST FAKE: the fake kubectl reads nothing here\n")
    kubeconfig.chmod(0o600)
    outputs.chmod(0o600)
    for host in hosts:
        put_key(repo, host)
    extra = workdir / "site-mirror.json"
    extra.write_text(json.dumps(site_mirror_vars(repo)))
    ssh_config = lab.write_ssh_config(workdir / "ssh_config", hosts=hosts)
    env = lab.ansible_env()
    env.update({
        # The lab's control path, so stopping a host also closes Ansible's
        # master connection to it (else a test's "unreachable" host is not).
        # Address, user, key and host key checking come from the cluster file
        # (lab.ansible_env's ANSIBLE_HOST_KEY_CHECKING=False is overridden by it).
        "ANSIBLE_SSH_ARGS": (f"-o ControlMaster=auto -o ControlPersist=120s "
                             f"-o ControlPath={lab.control_dir}/%C -o ServerAliveInterval=5"),
        # Fresh fact cache: a host re-created under an old name has new facts.
        "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(workdir / "facts"),
        "ANSIBLE_LOCAL_TEMP": str(workdir / "ansible-tmp"),
        "KUBECONFIG": str(kubeconfig),
        "FAKE_KUBECTL_LOG": str(workdir / "kubectl.jsonl"),
    })
    setup = JoinSetup(clusters, outputs, extra, workdir / "runs", env, fake_bin, workdir / "kubectl.jsonl",
                      ssh_config)
    trusted = trust_hosts(setup)
    if trusted.returncode != 0:
        raise RuntimeError(f"corral hosts trust failed: {trusted.stdout}{trusted.stderr}")
    return setup


def trust_hosts(setup: JoinSetup, *extra: str):
    """`corral hosts trust` the lab cluster (ssh-keyscan against the hosts' addresses)."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "corral", "hosts", "trust", CLUSTER, "--clusters",
                           str(setup.clusters), *extra], env=env_with(setup), capture_output=True, text=True,
                          timeout=300)


def corral_join_argv(setup: JoinSetup, *extra: str) -> list[str]:
    import sys

    return [sys.executable, "-m", "corral", "join", CLUSTER, "--clusters", str(setup.clusters),
            "--outputs", str(setup.outputs), "--extra-vars", str(setup.extra_vars),
            "--runs-dir", str(setup.runs_dir), *extra]


def env_with(setup: JoinSetup) -> dict[str, str]:
    env = dict(setup.env)
    env.setdefault("COLUMNS", "200")
    env.pop("CORRAL_CLUSTERS", None)
    return {k: v for k, v in env.items() if isinstance(v, str)} | {
        "PATH": f"{setup.fake_bin}{os.pathsep}{os.environ['PATH']}"}


IMAGE_PLAYBOOK = REPO / "node-images" / "image.yml"


def run_playbook(lab, hosts, workdir: Path, playbook: Path, host_vars: dict, name: str) -> dict:
    """ansible-playbook `playbook` against lab `hosts` (as root, the repo's roles), with
    `host_vars` as their variables; rc, stdout, stderr and wall time. `name` keeps the
    run's files in `workdir` apart from other runs'."""
    import subprocess
    import time

    inventory = workdir / f"{name}-inventory.json"
    inventory.write_text(json.dumps({"all": {"hosts": {h.name: {"ansible_user": "root"} for h in hosts},
                                             "vars": host_vars}}))
    ssh_config = lab.write_ssh_config(workdir / f"{name}-ssh-config", hosts=hosts)
    env = lab.ansible_env()
    env.update(ANSIBLE_SSH_ARGS=f"-F {ssh_config} -o ControlMaster=no",
               ANSIBLE_CACHE_PLUGIN_CONNECTION=str(workdir / f"{name}-facts"),
               ANSIBLE_LOCAL_TEMP=str(workdir / "ansible-tmp"),
               ANSIBLE_ROLES_PATH=str(REPO / "ansible" / "roles"),
               ANSIBLE_CONFIG=str(REPO / "ansible" / "ansible.cfg"))
    t0 = time.monotonic()
    result = subprocess.run(["ansible-playbook", "-i", str(inventory), str(playbook)],
                            env={k: v for k, v in env.items() if isinstance(v, str)},
                            capture_output=True, text=True, timeout=1800)
    return {"rc": result.returncode, "stdout": result.stdout, "stderr": result.stderr,
            "wall": time.monotonic() - t0}


def bake_image(lab, repo, builder, workdir: Path) -> dict:
    """Run node-images/image.yml against `builder`, as Packer runs it against a build VM.

    Returns rc, stdout, stderr and wall time. The lab has no cloud metadata
    service, so cloud-init stays out of the image (a copy would search
    datasources at every boot).
    """
    put_key(repo, builder)
    return run_playbook(lab, [builder], workdir, IMAGE_PLAYBOOK, {
        # The lab cluster's Kubernetes, and its containerd and pause image (the catalog's for 1.31),
        # as a Packer build for that cluster passes them.
        **site_mirror_vars(repo), "corral_kubernetes_version": "1.31.4",
        "corral_containerd_version": default_containerd("1.31.4"), "corral_containerd_sandbox_image": pause_image("1.31.4"),
        "corral_nvidia_driver_version": "550.127.05", "corral_image_cloud_init": False,
    }, name="image")
