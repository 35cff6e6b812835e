"""etcd snapshots on Azure: a blob container only the etcd members may write to.

A storage account of its own (in its own resource group, like the Key
Vault), Entra ID authorization only (shared keys off: no account key exists
that could leak), blob versioning on, public access off, a management policy
deleting blobs and old versions after `snapshots.retentionDays`. Azure has
no built-in "create blobs only" role (Storage Blob Data Contributor may also
read and delete), so a custom role with just the blob write/add data
actions is assigned to each member's managed identity on the container.

Who reads a snapshot (issue 25, item 6): a read needs a data action, and
with shared keys off there is no key and no account SAS to read with. The
built-in Reader role has no data actions ("It doesn't provide read
permissions to data in Azure Storage, but only to account management
resources": Azure Storage docs, "Assign an Azure role for access to blob
data"), so a read-only user sees the account and the container, never a
blob. The only read grant is Storage Blob Data Reader
(2a2b9908-6ea1-4ae2-8e65-a410df84e7d1: containers/read and blobs/read) on
this container, for the restore identity: the Entra ID principal (a group,
user or service principal) whose object id is stack setting
`corral:snapshotRestorePrincipalId`, output as `snapshotRestoreRole`;
`corral etcd restore --from-bucket` downloads as the signed-in `az` user,
who must be it or in it. Without the setting nobody can read the snapshots
(the output is empty and the restore command says so). A principal with a
broader data role on the subscription or resource group (Storage Blob Data
Owner/Contributor/Reader there) still reads them: role assignments only add.
Encryption at rest stays Microsoft-managed keys: a customer-managed key in
Key Vault would not change who reads (Azure Storage decrypts for any
authorized request), only who controls the key material.
"""

from __future__ import annotations

import uuid

import pulumi
import pulumi_azure_native as azure

from corral.infra.platform import ClusterContext
from corral.machine.etcd_snapshot import snapshot_location

from .common import location, subscription_of, tags
from .secrets import custom_role, role_definition_id

# Built-in role "Storage Blob Data Reader": read containers and blobs, nothing else.
BLOB_DATA_READER_ROLE = "2a2b9908-6ea1-4ae2-8e65-a410df84e7d1"
RESTORE_PRINCIPAL_SETTING = "snapshotRestorePrincipalId"
WRITE_DATA_ACTIONS = [
    "Microsoft.Storage/storageAccounts/blobServices/containers/blobs/write",
    "Microsoft.Storage/storageAccounts/blobServices/containers/blobs/add/action",
]


def management_policy(container: str, retention_days: int) -> dict:
    return {"rules": [{
        "name": "expire-etcd-snapshots",
        "enabled": True,
        "type": "Lifecycle",
        "definition": {
            "filters": {"blob_types": ["blockBlob"], "prefix_match": [f"{container}/"]},
            "actions": {
                "base_blob": {"delete": {"days_after_modification_greater_than": retention_days}},
                "version": {"delete": {"days_after_creation_greater_than": retention_days}},
            },
        },
    }]}


def restore_principal_id() -> str:
    """Stack setting `corral:snapshotRestorePrincipalId`: an Entra ID object id (a GUID), or ""."""
    configured = pulumi.Config("corral").get(RESTORE_PRINCIPAL_SETTING) or ""
    if configured:
        try:
            uuid.UUID(configured)
        except ValueError:
            raise ValueError(f"stack setting corral:{RESTORE_PRINCIPAL_SETTING}: {configured!r} is not an Entra ID "
                             "object id (a GUID such as 00000000-0000-0000-0000-000000000000)") from None
    return configured


class SnapshotBucket(pulumi.ComponentResource):
    """platform.SnapshotBucket on Azure Blob Storage (zone-redundant).

    Attributes: location, account, container, write_role, restore_role (the
    restore principal's object id, "" when not set), read_grant (its Storage
    Blob Data Reader assignment, or None), write_grants (writer ->
    azure.authorization.RoleAssignment).
    """

    def __init__(self, name: str, ctx: ClusterContext, opts: pulumi.ResourceOptions | None = None):
        super().__init__("corral:azure:SnapshotBucket", name, None, opts)
        name = ctx.resource_name("etcd-snapshots")  # children: `<cluster>-etcd-snapshots`
        self.ctx = ctx
        self.location = snapshot_location(ctx.cluster)
        retention = ctx.cluster.control_plane.etcd.snapshots.retention_days
        child = pulumi.ResourceOptions(parent=self)
        rn = ctx.resource_name
        group = azure.resources.ResourceGroup(
            rn("snapshots-rg"), resource_group_name=rn("snapshots-rg"), location=location(ctx), tags=tags(ctx),
            opts=child,
        )
        self.account = azure.storage.StorageAccount(
            name,
            account_name=self.location.store,
            resource_group_name=group.name,
            location=location(ctx),
            kind="StorageV2",
            sku={"name": "Standard_ZRS"},
            allow_blob_public_access=False,
            allow_shared_key_access=False,
            default_to_o_auth_authentication=True,
            minimum_tls_version="TLS1_2",
            enable_https_traffic_only=True,
            tags=tags(ctx, **{"corral-role": "etcd-snapshots"}),
            # The cluster's backups: `pulumi destroy` must not take them along.
            opts=pulumi.ResourceOptions(parent=self, protect=True, retain_on_delete=True),
        )
        azure.storage.BlobServiceProperties(
            f"{name}-blob-service", account_name=self.account.name, resource_group_name=group.name, blob_services_name="default",
            is_versioning_enabled=True, opts=child,
        )
        self.container = azure.storage.BlobContainer(
            f"{name}-container", account_name=self.account.name, resource_group_name=group.name,
            container_name=self.location.bucket, public_access="None", opts=child,
        )
        azure.storage.ManagementPolicy(
            f"{name}-lifecycle", account_name=self.account.name, resource_group_name=group.name, management_policy_name="default",
            policy=management_policy(self.location.bucket, retention), opts=child,
        )
        role_name = rn("etcd-snapshot-writer")
        self.write_role = custom_role(
            role_name, f"Create blobs in {self.location.store}/{self.location.bucket}; no read, list or delete",
            self.container.id, data_actions=WRITE_DATA_ACTIONS, opts=child,
        )
        self.restore_role = restore_principal_id()
        self.read_grant = None
        if self.restore_role:
            reader = rn("etcd-snapshot-restore")
            self.read_grant = azure.authorization.RoleAssignment(
                reader,
                role_assignment_name=str(uuid.uuid5(uuid.NAMESPACE_URL, f"corral/{reader}")),
                principal_id=self.restore_role,
                role_definition_id=role_definition_id(group.id.apply(subscription_of), BLOB_DATA_READER_ROLE),
                scope=self.container.id,
                description=f"restores etcd of {ctx.cluster.name}: reads its snapshots",
                opts=child,
            )
        self.write_grants: dict[str, azure.authorization.RoleAssignment] = {}
        self.register_outputs({"account": self.location.store, "container": self.location.bucket,
                               "restore_role": self.restore_role})

    def grant_write(self, writer: str, identity: pulumi.Input[str]) -> None:
        name = self.ctx.resource_name("snapshots", "by", writer.removeprefix(self.ctx.cluster.name + "-"))
        self.write_grants[writer] = azure.authorization.RoleAssignment(
            name,
            role_assignment_name=str(uuid.uuid5(uuid.NAMESPACE_URL, f"corral/{name}")),
            principal_id=identity,
            principal_type="ServicePrincipal",
            role_definition_id=self.write_role.id,
            scope=self.container.id,
            description=f"{writer} uploads etcd snapshots",
            opts=pulumi.ResourceOptions(parent=self),
        )
