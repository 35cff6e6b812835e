"""Cloud-init user data: one renderer of a machine role, the same on every cloud.

The user data holds the files and commands of the role's parts after the
secret fetch (secret_fetch.part), and a reference to the machine's secret,
never the secret itself (cloud user data is readable from instance metadata).
Template: corral/templates/cloud-init/cloud-config.yaml.j2.
"""

from __future__ import annotations

from corral.model import CloudPool, Cluster
from corral.model.layout import Layout, Machine

from . import secret_fetch
from .files import render
from .part import Role
from .roles import api_server_role, etcd_member_role, pool_node_role
from .secret_fetch import SecretRef


def user_data(role: Role, ref: SecretRef) -> str:
    """`role`'s user data; the machine fetches its secret `ref` first."""
    booted = Role(role.kind, role.machine, (secret_fetch.part(ref), *role.parts))
    return render(
        "cloud-init/cloud-config.yaml.j2",
        role=role.kind, machine=role.machine, secret_ref=ref, boot_commands=booted.boot_commands,
        files=[{"path": f.path, "content": f.content, "mode": f.mode} for f in booted.files],
        commands=booted.commands,
    )


def render_etcd_cloud_init(
    cluster: Cluster, member: Machine, members: tuple[Machine, ...], ref: SecretRef, events: bool = False
) -> str:
    """etcd member's user data: its configuration and scripts; its keys come from `ref`."""
    return user_data(etcd_member_role(cluster, member, members, events), ref)


def render_api_server_cloud_init(cluster: Cluster, lay: Layout, index: int, ref: SecretRef) -> str:
    """API server `index`'s user data; its keys and tokens come from `ref`."""
    return user_data(api_server_role(cluster, lay, index), ref)


def render_pool_cloud_init(cluster: Cluster, lay: Layout, pool: CloudPool, ref: SecretRef) -> str:
    """A pool node's user data: the join configuration with placeholders; the token comes from `ref`."""
    return user_data(pool_node_role(cluster, lay, pool), ref)
