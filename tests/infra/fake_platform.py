"""A FAKE cloud package for the core's tests: the six components of
`corral/infra/platform.py`, each registering a few `fake:` resources.

It lets the program, Pki, bootstrap and plan be tested on their own (what
the program hands each component, what the plan records), independently of
the real cloud packages, which have their own tests. Each component keeps
its arguments (`calls`) so tests can check what the program passed.
"""

from __future__ import annotations

from typing import Any

import pulumi

from corral.machine.etcd_snapshot import snapshot_location
from corral.machine.secret_fetch import SecretRef

calls: dict[str, list[dict[str, Any]]] = {}


def _record(component: str, **arguments: Any) -> None:
    calls.setdefault(component, []).append(arguments)


def reset() -> None:
    calls.clear()


class Network(pulumi.ComponentResource):
    def __init__(self, name, ctx, opts=None):
        super().__init__("corral:fake:Network", name, None, opts)
        _record("Network", name=name, ctx=ctx)
        self.vpc = pulumi.CustomResource(
            "fake:index:Network", f"{name}-vpc",
            {"cidr": ctx.cluster.control_plane.network_cidr, "zones": [z.zone for z in ctx.layout.zones]},
            pulumi.ResourceOptions(parent=self),
        )
        self.register_outputs({})


class SecretStore(pulumi.ComponentResource):
    """Secrets as `fake:index:Secret` resources, grants as `fake:index:Grant`."""

    def __init__(self, name, ctx, opts=None):
        super().__init__("corral:fake:SecretStore", name, None, opts)
        self.prefix = ctx.cluster.name
        self.cloud = ctx.cluster.control_plane.cloud  # the fetch script knows real clouds only
        self.secrets: dict[str, pulumi.CustomResource] = {}
        self.grants: list[tuple[str, str, str]] = []  # (key, reader, identity)
        self.register_outputs({})

    def ref(self, key):
        return SecretRef(self.cloud, "fake-store", f"{self.prefix}-{key}")

    def put(self, key, value):
        self.secrets[key] = pulumi.CustomResource(
            "fake:index:Secret", f"{self.prefix}-secret-{key}", {"value": value}, pulumi.ResourceOptions(parent=self),
        )
        return self.ref(key)

    def grant(self, key, reader, identity):
        self.grants.append((key, reader, identity))
        pulumi.CustomResource(
            "fake:index:Grant", f"{self.prefix}-secret-{key}-{reader}", {"secret": self.ref(key).name, "identity": identity},
            pulumi.ResourceOptions(parent=self),
        )


class SnapshotBucket(pulumi.ComponentResource):
    """The bucket as `fake:index:Bucket`, write grants as `fake:index:BucketGrant`."""

    def __init__(self, name, ctx, opts=None):
        super().__init__("corral:fake:SnapshotBucket", name, None, opts)
        self.location = snapshot_location(ctx.cluster)
        self.writers: list[tuple[str, Any]] = []
        self.restore_role = f"restore-{self.location.bucket}"
        pulumi.CustomResource("fake:index:Bucket", name, {"bucket": self.location.bucket},
                              pulumi.ResourceOptions(parent=self))
        self.register_outputs({})

    def grant_write(self, writer, identity):
        self.writers.append((writer, identity))
        pulumi.CustomResource("fake:index:BucketGrant", f"{self.location.bucket}-{writer}",
                              {"identity": identity}, pulumi.ResourceOptions(parent=self))


class Etcd(pulumi.ComponentResource):
    def __init__(self, name, ctx, network, members, user_data, opts=None):
        super().__init__("corral:fake:Etcd", name, None, opts)
        _record("Etcd", name=name, members=list(members), user_data=list(user_data))
        self.identities = {member.name: f"identity-{member.name}" for member in members}
        disk = ctx.cluster.control_plane.etcd.disk
        for member, document in zip(members, user_data, strict=True):
            pulumi.CustomResource(
                "fake:index:Disk", f"{member.name}-data",
                {"zone": member.zone, "type": disk.type, "sizeGiB": disk.size_gib, "iops": disk.iops},
                pulumi.ResourceOptions(parent=self, protect=True, retain_on_delete=True),
            )
            pulumi.CustomResource(
                "fake:index:Vm", member.name,
                {"zone": member.zone, "privateIp": member.ip, "userData": document},
                pulumi.ResourceOptions(parent=self),
            )
        self.register_outputs({})


class ApiServers(pulumi.ComponentResource):
    def __init__(self, name, ctx, network, user_data, opts=None):
        super().__init__("corral:fake:ApiServers", name, None, opts)
        _record("ApiServers", name=name, user_data=list(user_data))
        self.identities = {server.name: "identity-apiservers" for server in ctx.layout.api_servers}
        for server, document in zip(ctx.layout.api_servers, user_data, strict=True):
            pulumi.CustomResource(
                "fake:index:Vm", server.name,
                {"zone": server.zone, "privateIp": server.ip, "userData": document},
                pulumi.ResourceOptions(parent=self),
            )
        pulumi.CustomResource(
            "fake:index:LoadBalancer", f"{name}-lb", {"address": ctx.layout.api_vip, "port": 6443},
            pulumi.ResourceOptions(parent=self),
        )
        self.register_outputs({})


class NodePools(pulumi.ComponentResource):
    def __init__(self, name, ctx, network, user_data, opts=None):
        super().__init__("corral:fake:NodePools", name, None, opts)
        _record("NodePools", name=name, user_data=dict(user_data))
        self.identities = {pool.name: f"identity-pool-{pool.name}" for pool in ctx.cluster.cloud_pools}
        self.resizers: dict = {}
        # The stack output nodeGroups, in the shape every cloud's NodePools gives it.
        self.node_groups = {pool.name: [{"provider": "fake", "name": f"{ctx.cluster.name}-{pool.name}",
                                         "region": ctx.cluster.control_plane.region, "zones": ["fake-zone"]}]
                            for pool in ctx.cluster.cloud_pools}
        for pool in ctx.cluster.cloud_pools:
            pulumi.CustomResource(
                "fake:index:Group", f"{ctx.cluster.name}-{pool.name}",
                {"minSize": pool.min_size, "maxSize": pool.max_size, "userData": user_data[pool.name]},
                pulumi.ResourceOptions(parent=self),
            )
        # Every key any cloud's autoscaler may need, with fake values.
        self.cloud_settings = {"ARM_SUBSCRIPTION_ID": "fake-sub", "ARM_RESOURCE_GROUP": "fake-rg",
                               "GCP_PROJECT": "fake-project"}
        self.register_outputs({})

    def allow_resize(self, identities):
        self.resizers = dict(identities)


class HybridLink(pulumi.ComponentResource):
    def __init__(self, name, ctx, network, shared_keys, opts=None):
        super().__init__("corral:fake:HybridLink", name, None, opts)
        _record("HybridLink", name=name, shared_keys=dict(shared_keys))
        self.sites: dict[str, pulumi.Output[dict]] = {}
        for site_name, key in shared_keys.items():
            connection = pulumi.CustomResource(
                "fake:index:VpnConnection", f"{ctx.cluster.name}-{site_name}",
                {"sharedKey": key}, pulumi.ResourceOptions(parent=self),
            )
            self.sites[site_name] = pulumi.Output.from_input({
                "gatewayAddress": "198.51.100.7",
                "connection": connection.id,
            })
        self.register_outputs({})
