"""The machine layer: what a machine runs at boot, below infra, etcd, certs, health and manifests.

One module per part of a machine's boot, each owning its paths, constants and
templates (secret_fetch, data_disk, etcd_member, etcd_snapshot, node_exporter,
cert_expiry, api_server with kubeadm/audit/encryption, scheduler, kubelet_node,
metadata_block, pool_node, apt); `files` and `part` are the primitives (File,
render, bundle; Part, Role, Phase); `roles` makes the three cloud machine roles
from the parts, and `cloud_init` renders a role as user data. This layer knows
the model and nothing above it (docs/architecture.md).
"""
