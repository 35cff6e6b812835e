"""The kube lab: the real etcd, kube-apiserver, kube-controller-manager and kube-scheduler
on loopback, started as corral's API server role configures them.

The binaries are built from their Go modules at the version corral pins (scripts/build-kube,
tools/kube/go.mod; cached outside the clone). Nothing here is a stand-in: the lab takes
the kubeadm InitConfiguration corral renders for a cluster's first API server, lets the
real kubeadm issue the certificates and kubeconfigs and write the control plane's static
pod manifests, and runs each manifest's command as a process. Only what belongs to a
machine is swapped for the lab's own (and listed in `MACHINE_VALUES`): addresses and
ports on loopback, the external etcd's endpoints, the folder everything lives in. So
corral's admission configuration, encryption configuration, audit policy, API priority
and fairness sizing and scheduler configuration reach the real programs unchanged, and a
flag or field the pinned release no longer has stops the lab (a failure, not a skip).

    lab = KubeLab(Path("/tmp/lab"), lab_cluster_file(Path("/tmp/clusters"), "v1.37.2")).up()
    lab.kubectl("get", "--raw", "/readyz")
    lab.down()

`bash scripts/kube-lab up DIR [CLUSTER_FILE]` / `down DIR` does the same from a shell.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tests import gobuild
from tests.gobuild import GoBuildUnavailable

ROOT = Path(__file__).resolve().parents[2]
STATE_FILE = "lab.json"
READY_SECONDS = 120

# What the lab swaps for its own because it belongs to a machine, not to corral's design.
MACHINE_VALUES = (
    "InitConfiguration.localAPIEndpoint.bindPort (a free port) and kube-apiserver --bind-address=127.0.0.1",
    "the server address in kubeadm's kubeconfigs (127.0.0.1 and the lab's port)",
    "InitConfiguration.nodeRegistration.name (the lab has no kubelet)",
    "ClusterConfiguration.controlPlaneEndpoint (127.0.0.1:port, not the load balancer)",
    "ClusterConfiguration.etcd.external (the lab's one etcd member and its certificates)",
    "etcd: corral's member configuration with the lab's data directory, loopback URLs on free ports, one "
    "member (initial-cluster) whose peer URL is plain HTTP (no peers to authenticate), the lab's certificates",
    "ClusterConfiguration.certificatesDir and every /etc/kubernetes and /var/log/kubernetes path (under the lab)",
    "kube-controller-manager's and kube-scheduler's --secure-port (free ports: labs run side by side)",
)


class KubeLabError(RuntimeError):
    """A real program refused corral's configuration, or did not become ready."""


# A machine without Go cannot build the real programs.
KubeUnavailable = GoBuildUnavailable


def available() -> tuple[bool, str]:
    """Can this machine run the kube tier? (ok, reason): the real programs are built with Go."""
    return gobuild.available("build-kube", "CORRAL_KUBE_BIN")


def bin_dir() -> Path:
    """The folder of the real binaries, built once per version (scripts/build-kube)."""
    try:
        return gobuild.built_bin_dir("build-kube", "CORRAL_KUBE_BIN")
    except gobuild.GoBuildFailed as why:
        raise KubeLabError(str(why)) from None


def built_version(bins: Path) -> str:
    """The Kubernetes release of the built programs ("v1.37.2"), as kubeadm says it."""
    return subprocess.run([str(bins / "kubeadm"), "version", "-o", "short"], capture_output=True, text=True,
                          timeout=30, check=True).stdout.strip()


def lab_cluster_file(folder: Path, version: str, source: Path = ROOT / "clusters" / "jaguar.yaml") -> Path:
    """The kube tier's cluster: an example cluster at the built release's version, less what
    that release cannot run yet, each said here.

    - its cloud pools: cloud pools need the cluster-autoscaler of the cluster's minor, and
      no release of it is confirmed for every minor corral builds (corral refuses that);
      the on-prem pools, its teams, queues and policies stay;
    - Coscheduling: scheduler-plugins has no release for 1.35 or later (corral refuses it
      there; gang scheduling is Kueue's all-or-nothing admission).
    """
    from ruamel.yaml import YAML

    yaml_rt = YAML()
    document = yaml_rt.load(source.read_text())
    document["kubernetes"]["version"] = version.lstrip("v")
    document["kubernetes"].pop("containerd", None)
    document["nodePools"] = [p for p in document["nodePools"] if "hosts" in p or "addresses" in p]
    scheduling = document.get("scheduling") or {}
    scheduling.pop("coscheduling", None)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / source.name
    with open(path, "w") as fh:
        yaml_rt.dump(document, fh)
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _pem(obj) -> bytes:
    from cryptography.hazmat.primitives import serialization

    if hasattr(obj, "public_bytes") and not hasattr(obj, "private_bytes"):
        return obj.public_bytes(serialization.Encoding.PEM)
    return obj.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def write_etcd_pki(pki: Path) -> None:
    """The external etcd's CA, its server certificate for 127.0.0.1 and the API server's
    client certificate, at the paths corral's ClusterConfiguration names (in production
    they come from the secret store, issued by corral's Pulumi PKI)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    validity = (now - datetime.timedelta(hours=1), now + datetime.timedelta(days=2))

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name("etcd-ca")).issuer_name(name("etcd-ca"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(validity[0]).not_valid_after(validity[1])
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))

    def leaf(cn: str, usage, sans=()) -> tuple[bytes, bytes]:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (x509.CertificateBuilder().subject_name(name(cn)).issuer_name(ca.subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(validity[0]).not_valid_after(validity[1])
                   .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
        return _pem(builder.sign(ca_key, hashes.SHA256())), _pem(key)

    (pki / "etcd").mkdir(parents=True, exist_ok=True)
    (pki / "etcd" / "ca.crt").write_bytes(_pem(ca))
    server = leaf("etcd-server", ExtendedKeyUsageOID.SERVER_AUTH,
                  [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")])
    client = leaf("kube-apiserver-etcd-client", ExtendedKeyUsageOID.CLIENT_AUTH)
    for path, (cert, key) in {"etcd/server": server, "apiserver-etcd-client": client}.items():
        (pki / f"{path}.crt").write_bytes(cert)
        (pki / f"{path}.key").write_bytes(key)
        (pki / f"{path}.key").chmod(0o600)


@dataclass
class KubeLab:
    """One control plane on loopback, in `root`, for the cluster of `cluster_file`."""

    root: Path
    cluster_file: Path
    bins: Path | None = None
    # corral's machine programs (scripts/build-runtime): the etcd its members run.
    runtime_bins: Path | None = None
    ports: dict[str, int] = field(default_factory=dict)
    pids: dict[str, int] = field(default_factory=dict)

    # -- paths -------------------------------------------------------------------------------

    def host_path(self, path: str) -> Path:
        """Where a machine path (/etc/kubernetes/..., /var/log/kubernetes/...) lives in the lab."""
        return self.root / "host" / path.lstrip("/")

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig kubeadm wrote (system:masters, the cluster's break-glass)."""
        return self.host_path("/etc/kubernetes/super-admin.conf")

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    def binary(self, name: str) -> str:
        """A real program: etcd and etcdctl at corral's member version, the rest from the
        Kubernetes build."""
        if name in ("etcd", "etcdctl"):
            assert self.runtime_bins is not None
            return str(self.runtime_bins / name)
        assert self.bins is not None
        return str(self.bins / name)

    # -- corral's files ----------------------------------------------------------------------

    def _render(self) -> Path:
        """corral's API server files, and its init configuration with the machine values swapped."""
        from corral.machine import api_server
        from corral.machine.kubeadm import JoinToken
        from corral.machine.scheduler import SCHEDULER_CONFIG, SCHEDULER_KUBECONFIG, render_scheduler_config
        from corral.model import load_cluster
        from corral.model.layout import layout

        cluster = load_cluster(self.cluster_file)
        lay = layout(cluster)
        self.cluster_name = cluster.name
        for file in api_server.part(cluster, lay, 0).files:
            if file.path.startswith("/etc/kubernetes/") and file.path != SCHEDULER_CONFIG:
                target = self.host_path(file.path)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(file.content)
        # The scheduler reads its kubeconfig at the path its configuration names.
        scheduler_config = self.host_path(SCHEDULER_CONFIG)
        scheduler_config.write_text(render_scheduler_config(
            cluster, kubeconfig=str(self.host_path(SCHEDULER_KUBECONFIG))))
        encryption = self.host_path(api_server.ENCRYPTION_CONFIG)
        encryption.parent.mkdir(parents=True, exist_ok=True)
        encryption.write_text(api_server.encryption_config(base64.b64encode(secrets.token_bytes(32)).decode()))
        self.host_path(api_server.AUDIT_LOG_DIR).mkdir(parents=True, exist_ok=True)

        token = f"{secrets.token_hex(3)}.{secrets.token_hex(8)}"
        documents = list(yaml.safe_load_all(api_server.render_kubeadm_init_config(
            cluster, lay, [JoinToken(token, "kube lab")])))
        init = next(d for d in documents if d["kind"] == "InitConfiguration")
        config = next(d for d in documents if d["kind"] == "ClusterConfiguration")
        # The server's own address stays as corral renders it (the API server advertises it
        # in the kubernetes Service, and refuses a loopback one); the process listens on
        # 127.0.0.1 only (--bind-address in up()).
        init["localAPIEndpoint"]["bindPort"] = self.ports["apiserver"]
        init["nodeRegistration"]["name"] = "kube-lab"
        if "patches" in init:
            init["patches"]["directory"] = str(self.host_path(init["patches"]["directory"]))
            Path(init["patches"]["directory"]).mkdir(parents=True, exist_ok=True)
        config["controlPlaneEndpoint"] = f"127.0.0.1:{self.ports['apiserver']}"
        config["certificatesDir"] = str(self.host_path("/etc/kubernetes/pki"))
        external = config["etcd"]["external"]
        external["endpoints"] = [f"https://127.0.0.1:{self.ports['etcd']}"]
        for key in ("caFile", "certFile", "keyFile"):
            external[key] = str(self.host_path(external[key]))
        config["apiServer"].setdefault("certSANs", []).append("127.0.0.1")
        path = self.root / "init.yaml"
        path.write_text(yaml.safe_dump_all(documents, sort_keys=False))
        return path

    # -- kubeadm -----------------------------------------------------------------------------

    def kubeadm(self, *args: str, timeout: float = 120) -> str:
        run = subprocess.run([self.binary("kubeadm"), *args], capture_output=True, text=True, timeout=timeout)
        if run.returncode != 0:
            raise KubeLabError(f"kubeadm {' '.join(args)} refused (exit {run.returncode}):\n"
                               f"{(run.stdout + run.stderr)[-4000:]}")
        return run.stdout

    def _prepare(self, init: Path) -> dict[str, list[str]]:
        """kubeadm issues the certificates and kubeconfigs and writes the static pod manifests
        for corral's configuration; the control plane's commands, as those manifests run them."""
        kubernetes_dir = self.host_path("/etc/kubernetes")
        self.kubeadm("init", "phase", "certs", "all", "--config", str(init))
        self.kubeadm("init", "phase", "kubeconfig", "all", "--config", str(init),
                     "--kubeconfig-dir", str(kubernetes_dir))
        # kubeadm points the controller-manager's and scheduler's kubeconfigs at the server's
        # own address, which on this machine is the loopback address the API server binds.
        for conf in kubernetes_dir.glob("*.conf"):
            kubeconfig = yaml.safe_load(conf.read_text())
            for entry in kubeconfig["clusters"]:
                entry["cluster"]["server"] = self.server
            conf.write_text(yaml.safe_dump(kubeconfig, sort_keys=False))
        manifests = self.root / "manifests"
        manifests.mkdir(exist_ok=True)
        run = subprocess.run([self.binary("kubeadm"), "init", "phase", "control-plane", "all", "--config", str(init),
                              "--dry-run"], capture_output=True, text=True, timeout=120,
                             env={**os.environ, "KUBEADM_INIT_DRYRUN_DIR": str(manifests)})
        if run.returncode != 0:
            raise KubeLabError(f"kubeadm init phase control-plane refused corral's configuration:\n"
                               f"{(run.stdout + run.stderr)[-4000:]}")
        commands = {}
        for component in ("kube-apiserver", "kube-controller-manager", "kube-scheduler"):
            pod = yaml.safe_load((manifests / f"{component}.yaml").read_text())
            (container,) = pod["spec"]["containers"]
            commands[component] = [self._on_host(arg) for arg in container["command"]]
        return commands

    def _on_host(self, arg: str) -> str:
        """A static pod's argument as a process on this machine runs it: the binary from the
        build, machine paths under the lab's folder."""
        if "=" not in arg:
            return self.binary(arg) if "/" not in arg else arg
        flag, value = arg.split("=", 1)
        for prefix in ("/etc/kubernetes/", "/var/log/kubernetes/"):
            if value.startswith(prefix):
                value = str(self.host_path(value))
        return f"{flag}={value}"

    def up(self) -> "KubeLab":
        """Start etcd and the control plane; wait until the API server's /readyz passes."""
        _reset(self.root)
        (self.root / "logs").mkdir()
        if self.bins is None:
            self.bins = bin_dir()
        if self.runtime_bins is None:
            self.runtime_bins = gobuild.runtime_bin_dir()
        self.ports = {name: free_port() for name in
                      ("etcd", "etcd-peer", "etcd-metrics", "apiserver", "controller-manager", "scheduler")}
        self._save()
        init = self._render()
        write_etcd_pki(self.host_path("/etc/kubernetes/pki"))
        commands = self._prepare(init)
        try:
            self._start_etcd()
            apiserver = [*commands["kube-apiserver"], "--bind-address=127.0.0.1"]
            self._start("kube-apiserver", apiserver)
            _wait(lambda: self._ready() or self._died("kube-apiserver"), READY_SECONDS, "kube-apiserver")
            self._died("kube-apiserver")
            for component in ("kube-controller-manager", "kube-scheduler"):
                port = self.ports[component.removeprefix("kube-")]
                command = [a for a in commands[component] if not a.startswith("--secure-port=")]
                self._start(component, [*command, f"--secure-port={port}"])
            time.sleep(1)
            for component in ("kube-controller-manager", "kube-scheduler"):
                self._died(component)
        except BaseException:
            self.down()
            raise
        return self

    def _etcd_config(self) -> Path:
        """corral's configuration of the cluster's first etcd member (what cloud-init writes to
        /etc/etcd/etcd.conf.yaml), with the machine values swapped (ETCD_MACHINE_VALUES); every
        other key (quota, feature gates, client certificate auth) is corral's."""
        from corral.machine.etcd_member import render_etcd_config
        from corral.model import load_cluster
        from corral.model.layout import layout

        cluster = load_cluster(self.cluster_file)
        lay = layout(cluster)
        member = lay.etcd_members[0]
        config = yaml.safe_load(render_etcd_config(cluster, member, (member,)))
        pki = self.host_path("/etc/kubernetes/pki") / "etcd"
        client, peer, metrics = (f"127.0.0.1:{self.ports[name]}" for name in ("etcd", "etcd-peer", "etcd-metrics"))
        config.update({
            "data-dir": str(self.root / "etcd"),
            "listen-client-urls": f"https://{client}", "advertise-client-urls": f"https://{client}",
            "listen-peer-urls": f"http://{peer}", "initial-advertise-peer-urls": f"http://{peer}",
            "initial-cluster": f"{config['name']}=http://{peer}",
            "listen-metrics-urls": f"http://{metrics}",
            "log-level": "warn",
        })
        config["client-transport-security"].update(
            {"cert-file": str(pki / "server.crt"), "key-file": str(pki / "server.key"),
             "trusted-ca-file": str(pki / "ca.crt")})
        config.pop("peer-transport-security")
        path = self.root / "etcd.conf.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    def _start_etcd(self) -> None:
        self._start("etcd", [self.binary("etcd"), f"--config-file={self._etcd_config()}"])

    def etcd_metrics(self) -> str:
        """The member's Prometheus metrics (plain HTTP on loopback, as corral configures them)."""
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.ports['etcd-metrics']}/metrics", timeout=10) as reply:
            return reply.read().decode()

    def etcdctl(self, *args: str) -> subprocess.CompletedProcess:
        """etcdctl against the lab's member, as the API server's etcd client."""
        pki = self.host_path("/etc/kubernetes/pki")
        return subprocess.run([self.binary("etcdctl"), f"--endpoints=https://127.0.0.1:{self.ports['etcd']}",
                               f"--cacert={pki}/etcd/ca.crt", f"--cert={pki}/apiserver-etcd-client.crt",
                               f"--key={pki}/apiserver-etcd-client.key", *args],
                              capture_output=True, timeout=60)

    def _ready(self) -> bool:
        run = subprocess.run([self.binary("kubectl"), "--kubeconfig", str(self.kubeconfig), "get", "--raw",
                              "/readyz"], capture_output=True, text=True, timeout=30)
        return run.returncode == 0 and run.stdout.strip() == "ok"

    def _died(self, name: str) -> bool:
        """Raise with the log's tail when a component exited (a refused flag ends it at once)."""
        if self._alive(name):
            return False
        raise KubeLabError(f"{name} exited; the end of its log ({self.root / 'logs' / (name + '.log')}):\n"
                           f"{self.log_tail(name)}")

    # -- processes ---------------------------------------------------------------------------

    def _start(self, name: str, command: list[str]) -> None:
        log = open(self.root / "logs" / f"{name}.log", "ab")
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        log.close()
        self.pids[name] = proc.pid
        self._save()

    def _save(self) -> None:
        (self.root / STATE_FILE).write_text(json.dumps(
            {"cluster_file": str(self.cluster_file), "ports": self.ports, "pids": self.pids,
             "kubeconfig": str(self.kubeconfig), "bins": str(self.bins), "runtime_bins": str(self.runtime_bins)},
            indent=1))

    def log_tail(self, name: str, lines: int = 40) -> str:
        path = self.root / "logs" / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def _alive(self, name: str) -> bool:
        pid = self.pids.get(name)
        if not pid:
            return False
        try:
            waited, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # started by another process (scripts/kube-lab up)
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                return False
            return stat.rsplit(")", 1)[1].split()[0] != "Z"
        return waited == 0

    def down(self) -> None:
        for name in reversed(list(self.pids)):
            pid = self.pids[name]
            try:
                os.killpg(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
        deadline = time.monotonic() + 20
        for name in list(self.pids):
            while self._alive(name) and time.monotonic() < deadline:
                time.sleep(0.1)
            if self._alive(name):
                try:
                    os.killpg(self.pids[name], signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.pids.clear()
        if (self.root / STATE_FILE).exists():
            self._save()

    @classmethod
    def load(cls, root: Path) -> "KubeLab":
        state = json.loads((root / STATE_FILE).read_text())
        runtime = state.get("runtime_bins")
        return cls(root, Path(state["cluster_file"]), Path(state["bins"]),
                   Path(runtime) if runtime and runtime != "None" else None, state["ports"], state["pids"])

    def create_namespace(self, name: str, labels: dict | None = None) -> str:
        """A namespace, once the controller-manager gave it its default service account
        (pods are refused until then)."""
        obj = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels or {}}}
        self.kubectl("apply", "--server-side", "--field-manager=kube-lab", "-f", "-", input=json.dumps(obj))
        _wait(lambda: self.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode == 0,
              30, f"namespace {name}'s default service account")
        return name

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 120) -> subprocess.CompletedProcess:
        run = subprocess.run([self.binary("kubectl"), "--kubeconfig", str(self.kubeconfig), *args],
                             input=input, capture_output=True, text=True, timeout=timeout)
        if check and run.returncode != 0:
            raise KubeLabError(f"kubectl {' '.join(args)} failed (exit {run.returncode}): {run.stderr[-3000:]}")
        return run


def _wait(predicate, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.25)
    raise KubeLabError(f"{what} not ready after {seconds:.0f} s")


def _reset(root: Path) -> None:
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
