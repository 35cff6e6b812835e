"""The machines' bootstrap, wired to Pulumi: each role's secret in the cloud's secret store,
each machine's user data, and who may read which secret.

What a machine runs at boot is the machine layer's (corral/machine/: the roles,
their parts and the cloud-init renderer); this module knows only the three
roles, their secret bundles and the store. No secret is ever in user data:
each machine role has ONE secret in the cloud's secret store
(`platform.SecretStore`), which the machine fetches first at boot with its own
identity. `machine_secrets(ctx, pki, store)` creates the secrets,
`user_data(ctx, refs)` renders the (plain) user data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from corral.machine import cloud_init, roles
from corral.machine.api_server import ControlPlaneTls
from corral.machine.etcd_member import EtcdMemberTls
from corral.machine.kubeadm import DEFAULT_TOKEN_TTL_HOURS, MAX_TOKEN_TTL_HOURS
from corral.machine.secret_fetch import SecretRef

if TYPE_CHECKING:  # Pulumi is imported only where Outputs are wired.
    import pulumi

    from .pki import Pki
    from .platform import ClusterContext

# The secret-store keys of each machine role: one secret per role.
APISERVER_SECRET = "apiserver"


def etcd_secret_key(member_name: str) -> str:
    """`etcd-0`, `etcd-events-2` (of `<cluster>-etcd-0`...): member N's own secret."""
    return member_name.split("-", 1)[1] if "-" in member_name else member_name


def pool_secret_key(pool_name: str) -> str:
    return f"pool-{pool_name}"


@dataclass
class MachineSecrets:
    """Where each machine role's secret lives (plain references, for user data)."""

    etcd: dict[str, SecretRef] = field(default_factory=dict)  # member name -> ref
    api_servers: SecretRef | None = None
    pools: dict[str, SecretRef] = field(default_factory=dict)  # pool name -> ref


@dataclass
class UserData:
    """Every machine's cloud-init (references only, no secret), in the shapes the components take."""

    etcd: list[pulumi.Output[str]] = field(default_factory=list)
    events_etcd: list[pulumi.Output[str]] = field(default_factory=list)
    api_servers: list[pulumi.Output[str]] = field(default_factory=list)
    pools: dict[str, pulumi.Output[str]] = field(default_factory=dict)


def token_ttl_hours() -> int:
    """`corral:bootstrapTokenTtlHours` (stack config), else DEFAULT_TOKEN_TTL_HOURS."""
    import pulumi

    hours = pulumi.Config("corral").get_int("bootstrapTokenTtlHours")
    if hours is None:
        return DEFAULT_TOKEN_TTL_HOURS
    if not 1 <= hours <= MAX_TOKEN_TTL_HOURS:
        raise ValueError(
            f"corral:bootstrapTokenTtlHours is {hours}; bootstrap tokens must expire within "
            f"1..{MAX_TOKEN_TTL_HOURS} hours (stacks/Pulumi.<cluster>.yaml)"
        )
    return hours


def machine_secrets(ctx: ClusterContext, pki: Pki, store: Any) -> MachineSecrets:
    """One secret per machine role in `store` (a platform.SecretStore); their references."""
    import pulumi

    cluster, lay = ctx.cluster, ctx.layout
    roles.check_secret_bundles(cluster, lay)
    refs = MachineSecrets()

    for member in (*lay.etcd_members, *lay.events_members):
        certs = pki.etcd_members[member.name]
        value = pulumi.Output.all(
            pki.etcd_ca.cert_pem, certs.server.cert_pem, certs.server.key_pem, certs.peer.cert_pem, certs.peer.key_pem,
        ).apply(lambda pems: roles.etcd_member_secret(EtcdMemberTls(*pems)))
        refs.etcd[member.name] = store.put(etcd_secret_key(member.name), pulumi.Output.secret(value))

    control_plane_tls = pulumi.Output.all(
        pki.kubernetes_ca.cert_pem, pki.kubernetes_ca.key_pem,
        pki.front_proxy_ca.cert_pem, pki.front_proxy_ca.key_pem,
        pki.service_account_key.private_key_pem, pki.service_account_key.public_key_pem,
        pki.etcd_ca.cert_pem, pki.apiserver_etcd_client.cert_pem, pki.apiserver_etcd_client.key_pem,
    ).apply(lambda pems: ControlPlaneTls(*pems))
    value = pulumi.Output.all(
        control_plane_tls, pki.bootstrap_token, pki.init_token, pki.ca_cert_hash, pki.encryption_key,
    ).apply(lambda values: roles.api_server_secret(cluster, lay, *values))
    refs.api_servers = store.put(APISERVER_SECRET, pulumi.Output.secret(value))

    for pool in cluster.cloud_pools:
        value = pulumi.Output.all(pki.pool_tokens[pool.name], pki.ca_cert_hash).apply(
            lambda values: roles.pool_secret(*values)
        )
        refs.pools[pool.name] = store.put(pool_secret_key(pool.name), pulumi.Output.secret(value))
    return refs


def user_data(ctx: ClusterContext, refs: MachineSecrets) -> UserData:
    """Every machine's user data: plain cloud-init with a reference to its secret."""
    import pulumi

    cluster, lay = ctx.cluster, ctx.layout
    result = UserData()
    for members, target, events in ((lay.etcd_members, result.etcd, False), (lay.events_members, result.events_etcd, True)):
        for member in members:
            document = cloud_init.render_etcd_cloud_init(cluster, member, members, refs.etcd[member.name], events)
            target.append(pulumi.Output.from_input(document))
    assert refs.api_servers is not None
    for server in lay.api_servers:
        document = cloud_init.render_api_server_cloud_init(cluster, lay, server.index, refs.api_servers)
        result.api_servers.append(pulumi.Output.from_input(document))
    for pool in cluster.cloud_pools:
        document = cloud_init.render_pool_cloud_init(cluster, lay, pool, refs.pools[pool.name])
        result.pools[pool.name] = pulumi.Output.from_input(document)
    return result


def grant_readers(store: Any, etcd: Any, events_etcd: Any, api_servers: Any, node_pools: Any) -> None:
    """Each machine identity may read its own role's secret, nothing else."""
    for component in (etcd, events_etcd):
        if component is None:
            continue
        for member, identity in component.identities.items():
            store.grant(etcd_secret_key(member), member, identity)
    servers = api_servers.identities
    distinct = {id(identity): identity for identity in servers.values()}
    if len(distinct) == 1 and len(servers) > 1:
        # AWS and GCP: one identity for every API server, one grant.
        store.grant(APISERVER_SECRET, "apiservers", next(iter(distinct.values())))
    else:
        for server, identity in servers.items():
            store.grant(APISERVER_SECRET, server, identity)
    if node_pools is not None:
        for pool, identity in node_pools.identities.items():
            store.grant(pool_secret_key(pool), pool, identity)

