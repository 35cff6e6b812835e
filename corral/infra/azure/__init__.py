"""Azure: the six components of `corral.infra.platform`, on azure-native.

One module per component (Typhoon style: the same inputs on every cloud):
network.py, etcd.py, apiservers.py, nodepools.py, hybridlink.py, secrets.py; what they
share is in common.py.
"""

from .apiservers import ApiServers
from .backup import SnapshotBucket
from .etcd import Etcd
from .hybridlink import HybridLink
from .network import Network
from .nodepools import NodePools
from .secrets import SecretStore

__all__ = ["ApiServers", "Etcd", "HybridLink", "Network", "NodePools", "SecretStore", "SnapshotBucket"]
