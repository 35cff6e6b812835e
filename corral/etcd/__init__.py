"""etcd lifecycle: status, snapshots to object storage, restore, member replacement and growth.

    client.py     etcdctl/etcdutl subprocesses with JSON output (3.4 and 3.5)
    lifecycle.py  health gates and one-member-at-a-time membership changes
    restore.py    the whole cluster rebuilt from one snapshot over ssh
    snapshot.py   the members' snapshot job (systemd timer), its bucket layout and metrics
    preflight.py  the disk latency probe run before a member starts

docs/etcd.md says how an operator uses them (`corral etcd ...`).
"""

from .client import EndpointHealth, EndpointStatus, EtcdError, Etcdctl, Member, SnapshotStatus, Tls
from .lifecycle import (ClusterStatus, add_member, cluster_status, grow, remove_member, replace_member,
                        require_healthy)

__all__ = [
    "ClusterStatus", "EndpointHealth", "EndpointStatus", "EtcdError", "Etcdctl", "Member", "SnapshotStatus", "Tls",
    "add_member", "cluster_status", "grow", "remove_member", "replace_member", "require_healthy",
]
