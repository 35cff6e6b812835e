"""Debian's node_exporter on the etcd members, serving the textfiles the members' jobs write.

The snapshot job, the disk preflight and the certificate-expiry timer write
textfiles to TEXTFILE_DIR; Debian's prometheus-node-exporter reads that
directory and listens on the member's private address, port
NODE_EXPORTER_PORT, which the cloud firewalls open to the cluster's nodes only
(corral/infra/*/network.py). The monitoring add-on's global Prometheus scrapes
every member (corral/etcd/monitoring.py, job `etcd-members`). The Kubernetes
nodes' own node-exporter DaemonSet reads the same directory on the API servers.
"""

from __future__ import annotations

from .apt import apt_context
from .files import File, render
from .part import Part, Phase

# The one textfile directory of a machine: its jobs write here, node_exporter
# reads it (--collector.textfile.directory).
TEXTFILE_DIR = "/var/lib/node_exporter/textfile_collector"

# Debian's package: /usr/bin/prometheus-node-exporter $ARGS, ARGS from its /etc/default file.
NODE_EXPORTER_PACKAGE = "prometheus-node-exporter"
NODE_EXPORTER_SERVICE = "prometheus-node-exporter.service"
NODE_EXPORTER_DEFAULTS = "/etc/default/prometheus-node-exporter"
NODE_EXPORTER_DROP_IN = f"/etc/systemd/system/{NODE_EXPORTER_SERVICE}.d/10-corral.conf"
NODE_EXPORTER_INSTALL = "/usr/local/sbin/corral-install-node-exporter"
NODE_EXPORTER_PORT = 9100
# After the install: 30 x 2 s for the exporter to answer on its address.
NODE_EXPORTER_WAIT_ATTEMPTS = 30


def node_exporter_files(listen_address: str) -> list[File]:
    """Debian's node_exporter's settings, its unit's drop-in and the install script (run at first boot)."""
    context = {
        "listen_address": listen_address, "port": NODE_EXPORTER_PORT, "textfile_dir": TEXTFILE_DIR,
        "package": NODE_EXPORTER_PACKAGE, "service": NODE_EXPORTER_SERVICE, "defaults_path": NODE_EXPORTER_DEFAULTS,
        "wait_attempts": NODE_EXPORTER_WAIT_ATTEMPTS,
    }
    return [
        File(NODE_EXPORTER_DEFAULTS, render("etcd/node-exporter.default.j2", **context)),
        File(NODE_EXPORTER_DROP_IN, render("etcd/node-exporter.conf.j2", **context)),
        File(NODE_EXPORTER_INSTALL, render("etcd/install-node-exporter.sh.j2", **context, **apt_context()), "0755"),
    ]


def part(listen_address: str) -> Part:
    """Installed from the mirror at first boot: last, so a mirror that is down fails the boot
    visibly without leaving the member without its snapshot timer."""
    return Part(tuple(node_exporter_files(listen_address)), (NODE_EXPORTER_INSTALL,), Phase.NETWORK_INSTALLS)
