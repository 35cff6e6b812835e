"""The stack outputs: what `corral join` and operators read after `pulumi up`.

    apiEndpoint      "<api vip>:6443": the API servers' internal load balancer
                     (reachable from the sites over the VPN); host:port, as
                     kubeadm's discovery and the join template take it
    caCertificate    the Kubernetes CA certificate (PEM)
    caCertHash       "sha256:<hex>", kubeadm's --discovery-token-ca-cert-hash
    bootstrapToken   "[a-z0-9]{6}.[a-z0-9]{16}" (secret)
    adminKubeconfig  kubeconfig of `kubernetes-admin` (O=system:masters) (secret)
    vpn              site name -> what the data centre's VPN side needs
                     (HybridLink.sites: gateway addresses, tunnels, BGP)
    vpnSharedKeys    site name -> the IPsec pre-shared key (secret)
    nodeGroups       cloud pool name -> its groups, the same shape on every
                     cloud: [{provider, name (the ASG / zonal MIG / scale
                     set), region, zones, project (GCP), subscription and
                     resourceGroup (Azure)}]; {} without cloud pools. What
                     `corral nodes health --remediate` and `corral upgrade`
                     hold a node's providerID to before they replace its
                     instance (corral/health/instances.py). Not secret.
    snapshotRestoreRole  who may read the etcd snapshots: the AWS IAM role's
                     ARN, the GCP service account's email, the Azure Entra
                     ID principal's object id ("" when not configured);
                     `corral etcd restore --from-bucket` reads them as it
                     (SnapshotBucket.restore_role, added by program.py). Not secret.

`corral join` reads them with `pulumi stack output --json --show-secrets`,
or from a JSON file holding the same keys (`--outputs`); remediation and the
upgrade roll read `nodeGroups` the same ways.
"""

from __future__ import annotations

import base64
from typing import Any

import pulumi

from corral.model.layout import API_PORT

from .pki import Pki
from .platform import ClusterContext

OUTPUT_KEYS = ("apiEndpoint", "caCertificate", "caCertHash", "bootstrapToken", "adminKubeconfig", "vpn", "vpnSharedKeys",
               "nodeGroups", "snapshotRestoreRole")
SECRET_OUTPUT_KEYS = ("bootstrapToken", "adminKubeconfig", "vpnSharedKeys")


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def admin_kubeconfig(cluster: str, server: str, ca_pem: str, cert_pem: str, key_pem: str) -> str:
    """A kubeconfig for `kubernetes-admin`; every value is base64 or a plain name, so plain YAML is safe."""
    user = f"{cluster}-admin"
    return (
        "apiVersion: v1\n"
        "kind: Config\n"
        "clusters:\n"
        f"  - name: {cluster}\n"
        "    cluster:\n"
        f"      server: {server}\n"
        f"      certificate-authority-data: {_b64(ca_pem)}\n"
        "users:\n"
        f"  - name: {user}\n"
        "    user:\n"
        f"      client-certificate-data: {_b64(cert_pem)}\n"
        f"      client-key-data: {_b64(key_pem)}\n"
        "contexts:\n"
        f"  - name: {cluster}\n"
        "    context:\n"
        f"      cluster: {cluster}\n"
        f"      user: {user}\n"
        f"current-context: {cluster}\n"
    )


def stack_outputs(ctx: ClusterContext, pki: Pki, vpn_sites: dict[str, Any] | None,
                  node_groups: dict[str, list[dict[str, Any]]] | None = None) -> dict[str, Any]:
    """The outputs as a dict of Inputs (see the module docstring); `node_groups` is the
    NodePools component's `node_groups`."""
    name = ctx.cluster.name
    server = f"https://{ctx.layout.api_vip}:{API_PORT}"
    kubeconfig = pulumi.Output.all(pki.kubernetes_ca.cert_pem, pki.admin.cert_pem, pki.admin.key_pem).apply(
        lambda pems: admin_kubeconfig(name, server, *pems)
    )
    return {
        "apiEndpoint": ctx.layout.api_endpoint,
        "caCertificate": pki.kubernetes_ca.cert_pem,
        "caCertHash": pki.ca_cert_hash,
        "bootstrapToken": pulumi.Output.secret(pki.bootstrap_token),
        "adminKubeconfig": pulumi.Output.secret(kubeconfig),
        "vpn": dict(vpn_sites or {}),
        # Secret as a whole, so `pulumi stack output` never prints one of them.
        "vpnSharedKeys": pulumi.Output.secret(pulumi.Output.from_input(dict(pki.vpn_shared_keys))),
        "nodeGroups": dict(node_groups or {}),
    }


def export(outputs: dict[str, Any]) -> None:
    for key, value in outputs.items():
        pulumi.export(key, value)
