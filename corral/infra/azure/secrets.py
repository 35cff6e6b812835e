"""The cluster's secrets in Azure Key Vault, each readable by one machine identity only.

A Key Vault of the cluster's own, in its own resource group (so nothing that
holds rights on the cluster's resource group manages it), with Azure RBAC
authorization (no access policies): one secret per machine role (etcd member
N, the API servers, each cloud pool). The only read grant on a secret is the
built-in role "Key Vault Secrets User" for its reader's managed identity,
assigned on that secret (never on the vault or the resource group). Machines
fetch their secret at boot with their managed identity's token from IMDS;
nothing secret is in customData (readable on the machine in
/var/lib/waagent/CustomData and by whoever reads the VM model).

Stack settings: `corral:keyVaultName` overrides the vault's name (Key Vault
names are global DNS names, 3-24 characters; the default is derived from the
cluster's name and may be taken elsewhere).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import pulumi
import pulumi_azure_native as azure

from corral.infra.platform import ClusterContext, pick
from corral.machine.secret_fetch import SecretRef, default_vault_name

from .common import location, subscription_of, tags

# Built-in role "Key Vault Secrets User": read secret contents, nothing else.
SECRETS_USER_ROLE = "4633458b-17de-408a-b874-0445c86b69e6"
# Deleted vaults and secrets are recoverable for this long (Azure's minimum).
SOFT_DELETE_DAYS = 7


def vault_name(ctx: ClusterContext) -> str:
    """`corral:keyVaultName`, else `kv-<cluster>-<hash>` (3-24 characters, letters, digits, '-')."""
    return pulumi.Config("corral").get("keyVaultName") or default_vault_name(ctx.cluster.name)


def role_definition_id(subscription_path: pulumi.Input[str], role: str) -> pulumi.Output[str]:
    return pulumi.Output.concat(subscription_path, "/providers/Microsoft.Authorization/roleDefinitions/", role)


def custom_role(role_name: str, description: str, scope: pulumi.Input[str], *, actions: Sequence[str] = (),
                data_actions: Sequence[str] = (), opts: pulumi.ResourceOptions | None = None,
                ) -> azure.authorization.RoleDefinition:
    """A custom role defined at `scope` and assignable only there (and inside it). Its id is
    derived from its name, so every run of the program names the same role."""
    return azure.authorization.RoleDefinition(
        role_name,
        role_definition_id=str(uuid.uuid5(uuid.NAMESPACE_URL, f"corral/{role_name}")),
        role_name=role_name,
        description=description,
        scope=scope,
        assignable_scopes=[scope],
        permissions=[{"actions": list(actions), "data_actions": list(data_actions)}],
        opts=opts,
    )


class SecretStore(pulumi.ComponentResource):
    """platform.SecretStore on Azure Key Vault; identities are managed identities' principal ids.

    Attributes: vault, resource_group, secrets (key -> azure.keyvault.Secret),
    read_grants ((key, reader) -> azure.authorization.RoleAssignment).
    """

    def __init__(self, name: str, ctx: ClusterContext, opts: pulumi.ResourceOptions | None = None):
        super().__init__("corral:azure:SecretStore", name, None, opts)
        self.ctx = ctx
        child = pulumi.ResourceOptions(parent=self)
        rn = ctx.resource_name
        self.resource_group = azure.resources.ResourceGroup(
            rn("secrets-rg"), resource_group_name=rn("secrets-rg"), location=location(ctx), tags=tags(ctx), opts=child,
        )
        self.subscription_path = self.resource_group.id.apply(subscription_of)
        self.vault_name = vault_name(ctx)
        self.vault = azure.keyvault.Vault(
            rn("secrets"),
            vault_name=self.vault_name,
            resource_group_name=self.resource_group.name,
            location=location(ctx),
            properties=azure.keyvault.VaultPropertiesArgs(
                tenant_id=azure.authorization.get_client_config_output().tenant_id,
                sku=azure.keyvault.SkuArgs(family="A", name="standard"),
                # Azure RBAC decides who reads what, per secret (no vault-wide access policies).
                enable_rbac_authorization=True,
                enable_soft_delete=True,
                soft_delete_retention_in_days=SOFT_DELETE_DAYS,
                enabled_for_deployment=False,
                enabled_for_disk_encryption=False,
                enabled_for_template_deployment=False,
            ),
            tags=tags(ctx, **{"corral-role": "secrets"}),
            opts=child,
        )
        self.secrets: dict[str, azure.keyvault.Secret] = {}
        self.read_grants: dict[tuple[str, str], azure.authorization.RoleAssignment] = {}
        self.register_outputs({"vault_name": self.vault_name})

    def ref(self, key: str) -> SecretRef:
        return SecretRef("azure", self.vault_name, f"{self.ctx.cluster.name}-{key}")

    def put(self, key: str, value: pulumi.Input[str]) -> SecretRef:
        ref = self.ref(key)
        self.secrets[key] = azure.keyvault.Secret(
            self.ctx.resource_name("secret", key),
            secret_name=ref.name,
            vault_name=self.vault.name,
            resource_group_name=self.resource_group.name,
            properties=azure.keyvault.SecretPropertiesArgs(value=pulumi.Output.secret(value)),
            tags=tags(self.ctx, **{"corral-secret": key}),
            opts=pulumi.ResourceOptions(parent=self),
        )
        return ref

    def grant(self, key: str, reader: str, identity: pulumi.Input[str]) -> None:
        secret = pick(self.secrets, key, "secret")
        name = self.ctx.resource_name("read", key, "by", reader.removeprefix(self.ctx.cluster.name + "-"))
        self.read_grants[(key, reader)] = azure.authorization.RoleAssignment(
            name,
            # Role assignment names are GUIDs: one stable GUID per secret and reader.
            role_assignment_name=str(uuid.uuid5(uuid.NAMESPACE_URL, f"corral/{name}")),
            principal_id=identity,
            principal_type="ServicePrincipal",
            role_definition_id=role_definition_id(self.subscription_path, SECRETS_USER_ROLE),
            scope=secret.id,
            description=f"{reader} reads its own secret {key}",
            opts=pulumi.ResourceOptions(parent=self),
        )
