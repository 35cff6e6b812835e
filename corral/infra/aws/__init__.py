"""corral's control plane on AWS (pulumi_aws 7): the six components of `platform.py`.

    Network     VPC, per-zone control/public/node subnets, NAT, security groups
    Etcd        members on fixed addresses, data on provisioned-IOPS EBS (io2/io1/gp3)
    ApiServers  instances behind an internal NLB on 6443 (/readyz health check)
    NodePools   launch template + ASG per cloud pool, cluster-autoscaler tags
    HybridLink  VPN gateway + customer gateway + VPN connection per site
    SecretStore Secrets Manager, one secret per machine role, each role's IAM
                policy reading only its own

The region is the stack's `aws:region`; other stack settings (AMI ids, root
device name, VPN ASN) are listed in `common.py`.
"""

from .apiservers import ApiServers
from .backup import SnapshotBucket
from .etcd import Etcd
from .hybrid import HybridLink
from .network import Network
from .nodepools import NodePools
from .secrets import SecretStore

__all__ = ["ApiServers", "Etcd", "HybridLink", "Network", "NodePools", "SecretStore", "SnapshotBucket"]
