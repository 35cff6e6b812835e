"""Grafana's admin login: a generated password in a Secret, created by `pulumi up`.

Grafana has no anonymous access (corral/templates/manifests/grafana.yaml.j2):
it reads its admin's name and password from the files of the Secret
`corral-monitoring/grafana-admin`. The password is a `random.RandomPassword`
(https://www.pulumi.com/registry/packages/random/api-docs/randompassword/:
`result` is a secret output), so it is encrypted in the stack's state, shown
as `[secret]` in every plan and preview, and in no rendered manifest or
golden. Read it with

    kubectl -n corral-monitoring get secret grafana-admin \\
        -o jsonpath='{.data.admin-password}' | base64 -d

Rotate it by replacing the resource (`pulumi up --replace <urn of
<cluster>-addons-grafana-admin-password>`) and restarting Grafana, which
creates its admin from the files at each start (its state is an emptyDir).
"""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as k8s
import pulumi_random as random

from corral.manifests.monitoring import (
    GRAFANA_ADMIN_PASSWORD_KEY,
    GRAFANA_ADMIN_SECRET,
    GRAFANA_ADMIN_USER_KEY,
)
from corral.manifests.policy import MONITORING_NAMESPACE

ADMIN_USER = "admin"
# 32 letters and digits: ~190 bits, and nothing a shell or URL must quote.
PASSWORD_LENGTH = 32


def grafana_admin_secret(name: str, on_cluster: pulumi.ResourceOptions,
                         monitoring: pulumi.Resource) -> k8s.core.v1.Secret:
    """The Secret Grafana's Deployment mounts, after the monitoring add-on (its namespace)."""
    password = random.RandomPassword(
        f"{name}-grafana-admin-password", length=PASSWORD_LENGTH, special=False,
        opts=pulumi.ResourceOptions(parent=on_cluster.parent),
    )
    return k8s.core.v1.Secret(
        f"{name}-grafana-admin",
        metadata={"name": GRAFANA_ADMIN_SECRET, "namespace": MONITORING_NAMESPACE,
                  "labels": {"app.kubernetes.io/name": "grafana", "app.kubernetes.io/managed-by": "corral"}},
        type="Opaque",
        string_data={
            GRAFANA_ADMIN_USER_KEY: ADMIN_USER,
            GRAFANA_ADMIN_PASSWORD_KEY: pulumi.Output.secret(password.result),
        },
        opts=pulumi.ResourceOptions.merge(on_cluster, pulumi.ResourceOptions(depends_on=[monitoring])),
    )
