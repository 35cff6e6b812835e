"""Certificate expiry metrics on the control-plane machines: a script and an hourly timer on each.

On the API servers: the certificates kubeadm manages. On the etcd members:
their server, peer and CA certificates (/etc/etcd/pki, issued by the Pulumi
program for 3 years; node_exporter on the members reads the same textfile
directory, and the global Prometheus scrapes them: node_exporter.py).

kubeadm issues the API servers' certificates on the machines (serving,
kubelet and etcd client, front-proxy client, and the client certificates in
controller-manager.conf, scheduler.conf, admin.conf), so no state holds them,
and `corral certs --metrics` runs on an operator's machine. This job writes
them where the cluster's own Prometheus reads them: TEXTFILE_DIR on the
machine, which the monitoring add-on's node-exporter DaemonSet (on every
node, API servers included) reads; the shards federate the metric to the
global Prometheus, where `CertificateExpiringSoon` (corral/certs/rules.py) fires.

Same series shape as `corral certs --metrics` (`corral.certs.rules.metrics_text`):
source="machine", where="MACHINE:PATH", subject=the RFC 2253 subject.
"""

from __future__ import annotations

from .files import File, render
from .node_exporter import TEXTFILE_DIR
from .part import Part, Phase

# The series `corral certs --metrics` writes too (corral/certs/rules.py alerts on it).
EXPIRY_METRIC = "corral_certificate_expiry_timestamp_seconds"
SCRIPT_PATH = "/usr/local/sbin/corral-cert-expiry-metrics"
SERVICE = "corral-cert-expiry-metrics.service"
TIMER = "corral-cert-expiry-metrics.timer"
METRICS_FILE = f"{TEXTFILE_DIR}/corral_certificates.prom"
KUBERNETES_DIR = "/etc/kubernetes"
# An etcd member's certificates are in /etc/etcd/pki (no kubeconfigs there).
ETCD_DIR = "/etc/etcd"
SOURCE = "machine"
# Hourly: a renewal by hand shows within the hour; the alert's window is 30 days.
INTERVAL = "1h"
# The certificates are on disk when the timer starts: at first boot the boot
# script has run kubeadm before the enable, at later boots they persist.
FIRST_DELAY = "10s"
# After the API server's boot script: kubeadm has issued the certificates by then.
ENABLE_COMMAND = f"systemctl daemon-reload && systemctl enable --now {TIMER}"


def render_script(where: str, config_dir: str = KUBERNETES_DIR, metrics_file: str = METRICS_FILE,
                  role: str = "API server") -> str:
    """The script for machine `where`, reading `config_dir`/pki and `config_dir`/*.conf; tests point
    the directories at temporary ones."""
    return render("certs/cert-expiry-metrics.sh.j2", where=where, config_dir=config_dir, role=role,
                  metrics_file=metrics_file, textfile_dir=TEXTFILE_DIR, metric=EXPIRY_METRIC, source=SOURCE, timer=TIMER)


def expiry_metrics_files(where: str, config_dir: str = KUBERNETES_DIR, role: str = "API server") -> list[File]:
    """Script, service and timer for control-plane machine `where` (its layout name)."""
    return [
        File(SCRIPT_PATH, render_script(where, config_dir, role=role), "0755"),
        File(f"/etc/systemd/system/{SERVICE}", render("certs/cert-expiry-metrics.service.j2", script_path=SCRIPT_PATH)),
        File(f"/etc/systemd/system/{TIMER}", render("certs/cert-expiry-metrics.timer.j2",
                                                     interval=INTERVAL, first_delay=FIRST_DELAY)),
    ]


def part(where: str, config_dir: str = KUBERNETES_DIR, role: str = "API server") -> Part:
    return Part(tuple(expiry_metrics_files(where, config_dir, role)), (ENABLE_COMMAND,), Phase.METRICS)
