"""Kueue in the kube lab, installed the way `pulumi up` installs it and run for real.

`pulumi up` installs Kueue from its Helm chart with corral's values (corral/manifests/kueue.py
`chart`, corral/infra/addons.py: pulumi_kubernetes helm.v4.Chart renders the chart with helm's
template engine and applies every object). Here the same chart (charts/kueue of the
sigs.k8s.io/kueue module at the pinned tag, what the OCI chart is packaged from) is rendered by
the real helm with the same values and applied to the lab's real kube-apiserver: the CRDs with
their conversion webhooks, the RBAC, the webhook configurations, the manager's ConfigMap, the
empty certificate Secret. The manager itself, built from the same module (scripts/build-kueue),
runs as a process on the machine under the chart's ServiceAccount, with the configuration the
chart rendered into kueue-manager-config.

What the lab swaps, because it has no nodes, no kubelet and no Service routing, is listed in
`LAB_VALUES`. The manager runs on the host instead of the chart's Deployment, and the lab does
the kubelet's one job for it: it copies the certificate Secret the manager fills into the
folder the Deployment mounts it at. The webhook Service is an ExternalName of localhost, the one
Service type the API server resolves without kube-proxy (k8s.io/apiserver pkg/util/proxy
ResolveCluster: the name and the webhook's port), so every webhook and conversion call reaches
the manager on loopback with TLS verified against the name `kueue-webhook-service.kueue-system.svc`
of the manager's own certificate.
"""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .lab import KubeLab, KubeLabError, _wait, free_port

NAMESPACE = "kueue-system"
SERVICE_ACCOUNT = "kueue-controller-manager"      # charts/kueue/templates/rbac/serviceaccount.yaml
WEBHOOK_SERVICE = "kueue-webhook-service"
READY_SECONDS = 120

LAB_VALUES = (
    "the manager runs as a process on the machine, not as the chart's Deployment (the lab has no nodes)",
    "the Secret kueue-webhook-server-cert is copied into the manager's certificate folder once the manager "
    "filled it (the kubelet's secret volume in the Deployment)",
    "featureGates VisibilityOnDemand: false, and the chart's APIService for it left out: the visibility "
    "server keeps its certificates in the fixed folder /visibility (the Deployment's emptyDir), which a "
    "process on the machine may not create; corral does not use the visibility API",
    "Service kueue-webhook-service is an ExternalName of localhost (the lab has no kube-proxy), and each "
    "webhook's and CRD conversion's service port is the manager's webhook port",
    "the manager's webhook port, host (127.0.0.1) and certificate folder, and its metrics and health "
    "addresses (free ports on loopback, a lab folder)",
    "leaderElection.resourceNamespace kueue-system (a pod reads its namespace from its service account "
    "volume; controller-runtime asks for it outside one)",
)


def render_chart(kueue_dir: Path, values: dict, kube_version: str, workdir: Path) -> list[dict]:
    """Every object the chart renders with `values`, by the real helm (what helm.v4.Chart applies)."""
    values_file = workdir / "kueue-values.json"
    values_file.write_text(json.dumps(values))
    run = subprocess.run(
        [str(kueue_dir / "bin" / "helm"), "template", "kueue", str(kueue_dir / "charts" / "kueue"),
         "--namespace", NAMESPACE, "--values", str(values_file), "--kube-version", kube_version],
        capture_output=True, text=True, timeout=120)
    if run.returncode != 0:
        raise KubeLabError(f"helm template failed (exit {run.returncode}): {run.stderr[-3000:]}")
    return [doc for doc in yaml.safe_load_all(run.stdout) if doc]


def _route_webhooks(objects: list[dict], port: int) -> list[dict]:
    """The chart's objects with the lab's webhook routing (LAB_VALUES); the Deployment left out."""
    routed = []
    for obj in objects:
        kind, name = obj["kind"], obj["metadata"]["name"]
        if kind in ("Deployment", "APIService"):
            continue
        if kind == "Service" and name == WEBHOOK_SERVICE:
            obj = {**obj, "spec": {"type": "ExternalName", "externalName": "localhost"}}
        if kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            for webhook in obj.get("webhooks", []):
                webhook["clientConfig"]["service"]["port"] = port
        if kind == "CustomResourceDefinition":
            conversion = obj["spec"].get("conversion", {})
            if conversion.get("strategy") == "Webhook":
                conversion["webhook"]["clientConfig"]["service"]["port"] = port
        routed.append(obj)
    return routed


@dataclass
class KueueLab:
    """The pinned Kueue on a running KubeLab."""

    lab: KubeLab
    kueue_dir: Path
    values: dict
    root: Path = field(init=False)
    ports: dict[str, int] = field(default_factory=dict)
    process: subprocess.Popen | None = None
    objects: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.root = self.lab.root / "kueue"

    @property
    def log(self) -> Path:
        return self.root / "kueue-manager.log"

    def install(self) -> "KueueLab":
        """Render and apply the chart; wait until its CRDs are established."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.ports = {name: free_port() for name in ("webhook", "metrics", "health")}
        version = self.lab.kubectl("version", "-o", "json").stdout
        kube_version = json.loads(version)["serverVersion"]["gitVersion"]
        self.objects = render_chart(self.kueue_dir, self.values, kube_version, self.root)
        routed = _route_webhooks(json.loads(json.dumps(self.objects)), self.ports["webhook"])
        crds = [o for o in routed if o["kind"] == "CustomResourceDefinition"]
        self._apply(crds)
        self.lab.kubectl("wait", "--for=condition=Established", "crd", "-l", "app.kubernetes.io/name=kueue",
                         "--timeout=60s")
        self._apply([o for o in routed if o["kind"] != "CustomResourceDefinition"])
        return self

    def _apply(self, objects: list[dict]) -> None:
        self.lab.kubectl("apply", "--server-side", "--field-manager=corral", "--force-conflicts", "-f", "-",
                         input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))

    def manager_config(self) -> dict:
        """The configuration the chart rendered into kueue-manager-config, with the lab's addresses."""
        configmap = next(o for o in self.objects if o["kind"] == "ConfigMap"
                         and o["metadata"]["name"] == "kueue-manager-config")
        config = yaml.safe_load(configmap["data"]["controller_manager_config.yaml"])
        config["webhook"] = {**config.get("webhook", {}), "port": self.ports["webhook"], "host": "127.0.0.1",
                             "certDir": str(self.root / "webhook-certs")}
        config["metrics"] = {**config.get("metrics", {}), "bindAddress": f"127.0.0.1:{self.ports['metrics']}"}
        config["health"] = {**config.get("health", {}),
                            "healthProbeBindAddress": f"127.0.0.1:{self.ports['health']}"}
        config["featureGates"] = {**config.get("featureGates", {}), "VisibilityOnDemand": False}
        config["leaderElection"] = {**config.get("leaderElection", {}), "resourceNamespace": NAMESPACE}
        return config

    def _kubeconfig(self) -> Path:
        """A kubeconfig for the chart's ServiceAccount: the manager runs with the chart's RBAC."""
        token = self.lab.kubectl("create", "token", SERVICE_ACCOUNT, "-n", NAMESPACE,
                                 "--duration=2h").stdout.strip()
        admin = yaml.safe_load(self.lab.kubeconfig.read_text())
        ca = admin["clusters"][0]["cluster"]["certificate-authority-data"]
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "kueue",
            "clusters": [{"name": "lab", "cluster": {"server": self.lab.server, "certificate-authority-data": ca}}],
            "users": [{"name": SERVICE_ACCOUNT, "user": {"token": token}}],
            "contexts": [{"name": "kueue", "context": {"cluster": "lab", "user": SERVICE_ACCOUNT}}],
        }
        path = self.root / "kueue-manager.kubeconfig"
        path.touch(mode=0o600)
        path.write_text(json.dumps(config))
        return path

    def start(self, config: dict | None = None) -> subprocess.Popen:
        """Run the manager on `config` (default: the chart's, with the lab's addresses)."""
        config_file = self.root / "controller_manager_config.yaml"
        config_file.write_text(yaml.safe_dump(config if config is not None else self.manager_config()))
        log = open(self.log, "ab")
        self.process = subprocess.Popen(
            [str(self.kueue_dir / "bin" / "kueue-manager"), f"--config={config_file}",
             f"--kubeconfig={self._kubeconfig()}"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        self._mount_certificates()
        return self.process

    def _mount_certificates(self) -> None:
        """Copy the certificate Secret into the webhook's folder once the manager filled it."""
        folder = self.root / "webhook-certs"
        folder.mkdir(mode=0o700, exist_ok=True)

        def filled() -> bool:
            if self.process is not None and self.process.poll() is not None:
                raise KubeLabError(f"kueue-manager exited ({self.process.returncode}):\n{self.log_tail()}")
            got = self.lab.kubectl("get", "secret", "kueue-webhook-server-cert", "-n", NAMESPACE, "-o", "json")
            data = json.loads(got.stdout).get("data") or {}
            if "tls.crt" not in data:
                return False
            for key, value in data.items():
                target = folder / key
                target.write_bytes(base64.b64decode(value))
                target.chmod(0o600)
            return True
        _wait(filled, READY_SECONDS, "the manager's webhook certificate Secret")

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ports['health']}/readyz", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def wait_ready(self) -> None:
        def up() -> bool:
            if self.process is not None and self.process.poll() is not None:
                raise KubeLabError(f"kueue-manager exited ({self.process.returncode}):\n{self.log_tail()}")
            return self.ready()
        _wait(up, READY_SECONDS, f"kueue-manager (log {self.log})")

    def log_tail(self, lines: int = 30) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def uninstall(self) -> None:
        """Stop the manager and take out what would call it: the webhook configurations (a webhook
        whose manager is gone refuses every request it matches, failurePolicy Fail) and the CRDs'
        conversion webhooks (strategy None again); then the chart's other objects. The CRDs and
        Kueue's objects stay: their finalizers are the stopped manager's to remove, and the
        session's other tests apply the release's CRDs and corral's queues over them."""
        self.stop()
        for obj in self.objects:
            kind, name = obj["kind"], obj["metadata"]["name"]
            if kind in ("Deployment", "APIService"):
                continue                                   # never applied (_route_webhooks)
            if kind == "CustomResourceDefinition":
                if obj["spec"].get("conversion", {}).get("strategy") == "Webhook":
                    self.lab.kubectl("patch", "crd", name, "--type=merge", "-p",
                                     '{"spec": {"conversion": {"strategy": "None", "webhook": null}}}', check=False)
                continue
            args = ["delete", kind.lower(), name, "--ignore-not-found", "--wait=false"]
            if obj["metadata"].get("namespace"):
                args += ["-n", obj["metadata"]["namespace"]]
            self.lab.kubectl(*args, check=False)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)

