"""Each API server approves its own kubelet's serving-certificate requests, and only its own.

The kubelet-csr-approver add-on approves the other nodes' requests
(corral/manifests/policy.py csr_approver_args). It cannot bind an address to
a node name, so it no longer takes the API servers' addresses: otherwise any
node could ask for a serving certificate naming an API server's address,
signed by the cluster CA that every API client trusts (issue 25, item 12).
An API server instead approves, with its own admin credential, exactly the
requests of its own node identity for its own name and address: right after
the boot script joined it, and every few minutes after, for the kubelet's
rotations (a serving certificate lives a year; the kubelet asks for a new one
before it expires).

The timer costs the API server nothing while no request can be pending
(issue 28: corral's components make no polling reads at steady state): the
script reads the kubelet's current serving certificate on disk first, and
asks the API server only while there is none (the first boot) or once it is
into the window in which the kubelet rotates it. client-go's certificate
manager, which the kubelet uses, rotates at a jittered 70-90% of the
certificate's lifetime (`nextRotationDeadline`/`jitteryDuration`,
k8s.io/client-go/util/certificate/certificate_manager.go); the script starts
asking at ROTATION_WINDOW_PERCENT, a little before. When it asks, it lists
only the kubelet-serving requests (the `spec.signerName` field selector of
certificates/v1) from the watch cache (`resourceVersion=0`), not every CSR
from etcd.
"""

from __future__ import annotations

from corral.model.layout import Machine

from .files import File, render
from .part import Part, Phase

SCRIPT_PATH = "/usr/local/sbin/corral-approve-own-serving-csr"
SERVICE = "corral-approve-own-serving-csr.service"
TIMER = "corral-approve-own-serving-csr.timer"
ADMIN_KUBECONFIG = "/etc/kubernetes/admin.conf"
# Where the kubelet keeps its current serving certificate with serverTLSBootstrap
# (its "kubelet-server" certificate store in --cert-dir, /var/lib/kubelet/pki).
KUBELET_SERVING_CERT = "/var/lib/kubelet/pki/kubelet-server-current.pem"
ROTATION_WINDOW_PERCENT = 65
# Soon after the boot script's join (the kubelet asks at once), then often
# enough that a rotation waits minutes, not hours.
FIRST_DELAY = "30s"
INTERVAL = "5min"
ENABLE_COMMAND = f"systemctl daemon-reload && systemctl enable --now {TIMER}"


def render_script(node_name: str, address: str, kubeconfig: str = ADMIN_KUBECONFIG,
                  serving_cert: str = KUBELET_SERVING_CERT) -> str:
    return render("certs/approve-own-serving-csr.sh.j2", node_name=node_name, address=address, kubeconfig=kubeconfig,
                  serving_cert=serving_cert, rotation_window_percent=ROTATION_WINDOW_PERCENT)


def part(server: Machine) -> Part:
    files = (
        File(SCRIPT_PATH, render_script(server.name, server.ip), "0755"),
        File(f"/etc/systemd/system/{SERVICE}", render("certs/approve-own-serving-csr.service.j2", script_path=SCRIPT_PATH)),
        File(f"/etc/systemd/system/{TIMER}", render("certs/approve-own-serving-csr.timer.j2",
                                                     first_delay=FIRST_DELAY, interval=INTERVAL)),
    )
    return Part(files, (ENABLE_COMMAND,), Phase.METRICS)
