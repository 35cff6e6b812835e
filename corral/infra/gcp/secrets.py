"""The cluster's secrets in GCP Secret Manager, and service accounts that read only their own.

One secret per machine role (`<cluster>-<key>`: etcd member N, the API
servers, each cloud pool), replicated only in the cluster's region. The one
grant on each is `roles/secretmanager.secretAccessor` for its reader's
service account, bound on that secret (never on the project). Machines fetch
it at boot with their service account's token from the metadata server;
the secret is never in instance metadata, which any pod on the VM and any
principal with compute.instances.get can read.
"""

from __future__ import annotations

import hashlib

import pulumi
import pulumi_gcp as gcp

from corral.infra.platform import ClusterContext, pick
from corral.machine.secret_fetch import SecretRef

from .common import gce_name, labels

SECRET_ACCESSOR = "roles/secretmanager.secretAccessor"
# GCE's service-account ids: 6-30 characters.
SERVICE_ACCOUNT_ID_MAX = 30


def secret_id(ctx: ClusterContext, key: str) -> str:
    return f"{ctx.cluster.name}-{key}"


def account_id(ctx: ClusterContext, *parts: str) -> str:
    """`<cluster>-<parts>` as a service-account id; a long one is cut and given a hash suffix."""
    wanted = ctx.resource_name(*parts)
    if len(wanted) <= SERVICE_ACCOUNT_ID_MAX:
        return gce_name(wanted, SERVICE_ACCOUNT_ID_MAX)
    digest = hashlib.sha256(wanted.encode()).hexdigest()[:6]
    return gce_name(f"{wanted[:SERVICE_ACCOUNT_ID_MAX - 7].rstrip('-')}-{digest}", SERVICE_ACCOUNT_ID_MAX)


def machine_account(ctx: ClusterContext, parts: tuple[str, ...], description: str, parent: pulumi.Resource) -> gcp.serviceaccount.Account:
    """A machine's own service account; it holds no role until something grants one."""
    name = account_id(ctx, *parts)
    return gcp.serviceaccount.Account(
        name, account_id=name, display_name=description[:100], opts=pulumi.ResourceOptions(parent=parent),
    )


def member(account: gcp.serviceaccount.Account | pulumi.Output[str]) -> pulumi.Output[str]:
    email = account.email if isinstance(account, gcp.serviceaccount.Account) else account
    return pulumi.Output.from_input(email).apply(lambda address: f"serviceAccount:{address}")


class SecretStore(pulumi.ComponentResource):
    """platform.SecretStore on GCP Secret Manager; identities are service-account emails.

    Attributes: secrets (key -> gcp.secretmanager.Secret), read_grants
    ((key, reader) -> gcp.secretmanager.SecretIamMember).
    """

    def __init__(self, name: str, ctx: ClusterContext, opts: pulumi.ResourceOptions | None = None):
        super().__init__("corral:gcp:SecretStore", name, None, opts)
        self.ctx = ctx
        self.secrets: dict[str, gcp.secretmanager.Secret] = {}
        self.read_grants: dict[tuple[str, str], gcp.secretmanager.SecretIamMember] = {}
        self.register_outputs({})

    def ref(self, key: str) -> SecretRef:
        # The project is the machine's own (the metadata server says which).
        return SecretRef("gcp", "", secret_id(self.ctx, key))

    def put(self, key: str, value: pulumi.Input[str]) -> SecretRef:
        ref = self.ref(key)
        name = gce_name(ref.name)
        secret = gcp.secretmanager.Secret(
            name,
            secret_id=name,
            replication={"user_managed": {"replicas": [{"location": self.ctx.cluster.control_plane.region}]}},
            labels=labels(self.ctx, corral_secret=key),
            opts=pulumi.ResourceOptions(parent=self),
        )
        gcp.secretmanager.SecretVersion(
            name,
            secret=secret.id,
            secret_data=pulumi.Output.secret(value),
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.secrets[key] = secret
        return ref

    def grant(self, key: str, reader: str, identity: pulumi.Input[str]) -> None:
        secret = pick(self.secrets, key, "secret")
        self.read_grants[(key, reader)] = gcp.secretmanager.SecretIamMember(
            self.ctx.resource_name("read", key, "by", reader.removeprefix(self.ctx.cluster.name + "-")),
            secret_id=secret.id,
            role=SECRET_ACCESSOR,
            member=member(pulumi.Output.from_input(identity)),
            opts=pulumi.ResourceOptions(parent=self),
        )
