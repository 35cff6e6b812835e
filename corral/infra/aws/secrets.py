"""The cluster's secrets in AWS Secrets Manager, and machine roles that read only their own.

One secret per machine role (`corral/<cluster>/<key>`: etcd member N, the
API servers, each cloud pool), in the cluster's region, encrypted with the
account's `aws/secretsmanager` key. Nothing grants read on a secret except
`grant`: an inline policy on the reader's IAM role allowing
`secretsmanager:GetSecretValue` on exactly that secret's ARN. Machines fetch
it at boot with their instance profile's credentials (IMDSv2, hop limit 1,
so pods never reach them).
"""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws

from corral.infra.platform import ClusterContext, pick
from corral.machine.secret_fetch import SecretRef

from .common import tags

EC2_ASSUME_ROLE = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}],
}
READ_ACTIONS = ["secretsmanager:GetSecretValue"]


def secret_name(ctx: ClusterContext, key: str) -> str:
    return f"corral/{ctx.cluster.name}/{key}"


def read_policy(secret_arn: str) -> dict:
    """Read one secret, nothing else."""
    return {
        "Version": "2012-10-17",
        "Statement": [{"Sid": "ReadOwnSecret", "Effect": "Allow", "Action": READ_ACTIONS, "Resource": secret_arn}],
    }


class MachineRole:
    """An EC2 machine identity: an IAM role and the instance profile that carries it."""

    def __init__(self, ctx: ClusterContext, name: str, description: str, parent: pulumi.Resource):
        opts = pulumi.ResourceOptions(parent=parent)
        self.role = aws.iam.Role(
            name, description=description, assume_role_policy=json.dumps(EC2_ASSUME_ROLE),
            tags=tags(ctx, name), opts=opts,
        )
        self.profile = aws.iam.InstanceProfile(name, role=self.role.name, tags=tags(ctx, name), opts=opts)


class SecretStore(pulumi.ComponentResource):
    """platform.SecretStore on AWS Secrets Manager; identities are `aws.iam.Role`s.

    Attributes: secrets (key -> aws.secretsmanager.Secret), read_policies
    ((key, reader) -> aws.iam.RolePolicy).
    """

    def __init__(self, name: str, ctx: ClusterContext, opts: pulumi.ResourceOptions | None = None):
        super().__init__("corral:aws:SecretStore", name, None, opts)
        self.ctx = ctx
        self.secrets: dict[str, aws.secretsmanager.Secret] = {}
        self.read_policies: dict[tuple[str, str], aws.iam.RolePolicy] = {}
        self.register_outputs({})

    def ref(self, key: str) -> SecretRef:
        return SecretRef("aws", self.ctx.cluster.control_plane.region, secret_name(self.ctx, key))

    def put(self, key: str, value: pulumi.Input[str]) -> SecretRef:
        ref = self.ref(key)
        resource_name = self.ctx.resource_name("secret", key)
        secret = aws.secretsmanager.Secret(
            resource_name,
            name=ref.name,
            description=f"corral: {key} secrets of cluster {self.ctx.cluster.name}, read at boot by that role only",
            # Replaced secrets are re-created under the same name at once (the
            # value is Pulumi state, nothing is lost), not held for 7-30 days.
            recovery_window_in_days=0,
            tags=tags(self.ctx, ref.name, **{"corral-secret": key}),
            opts=pulumi.ResourceOptions(parent=self),
        )
        aws.secretsmanager.SecretVersion(
            resource_name,
            secret_id=secret.id,
            secret_string=pulumi.Output.secret(value),
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.secrets[key] = secret
        return ref

    def grant(self, key: str, reader: str, identity: aws.iam.Role) -> None:
        secret = pick(self.secrets, key, "secret")
        self.read_policies[(key, reader)] = aws.iam.RolePolicy(
            self.ctx.resource_name("read", key, "by", reader.removeprefix(self.ctx.cluster.name + "-")),
            role=identity.id,
            policy=secret.arn.apply(lambda arn: json.dumps(read_policy(arn))),
            opts=pulumi.ResourceOptions(parent=self),
        )
