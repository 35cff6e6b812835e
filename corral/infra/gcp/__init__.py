"""corral's control plane on GCP: the six components of `corral.infra.platform`.

One module per component (network, etcd, apiservers, nodepools, hybrid, secrets);
`common` holds stack settings, naming and labels, and machine-family facts.
"""

from .apiservers import ApiServers
from .backup import SnapshotBucket
from .etcd import ETCD_DEVICE_NAME, ETCD_DEVICE_PATH, Etcd
from .hybrid import HybridLink
from .network import Network
from .nodepools import NodePools
from .secrets import SecretStore

__all__ = ["ETCD_DEVICE_NAME", "ETCD_DEVICE_PATH", "ApiServers", "Etcd", "HybridLink", "Network", "NodePools", "SecretStore", "SnapshotBucket"]
