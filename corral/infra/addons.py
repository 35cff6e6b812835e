"""Applying the add-on manifests with pulumi-kubernetes, once the API is up.

Why Pulumi and not the first API server's bootstrap (docs/addons.md has the
whole argument): every `pulumi up` re-applies the manifests, so a change to a
team's pools, a pool's max or `directRouting` reaches the cluster the same
way it reaches the cloud; `corral plan` shows each add-on and, in a real
preview, each object; an add-on the cluster no longer has is deleted. The
price: `pulumi up` must run where the API servers' private address is
reachable (on the VPN, in the data centre, or a runner inside the control
plane's network), and the first `up` waits for the API to become ready.

Wiring (corral/infra/program.py, after the API servers and the stack outputs):

    from .addons import Addons
    addons = Addons(
        name("addons"), ctx, deployment.outputs["adminKubeconfig"],
        cloud_settings={...},   # Azure: ARM_SUBSCRIPTION_ID, ARM_RESOURCE_GROUP; GCP: GCP_PROJECT
        opts=pulumi.ResourceOptions(depends_on=[api_servers]),
    )
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import TYPE_CHECKING

import pulumi
import pulumi_kubernetes as k8s

from corral.manifests import ManifestError, kueue
from corral.manifests.fleet_addons import cluster_addons, manager_kueue_settings
from corral.manifests.policy import CLOUD_SETTINGS_CONFIGMAP, CLOUD_SETTINGS_KEYS

from .platform import ClusterContext

if TYPE_CHECKING:
    from corral.model.fleet import LoadedFleet

# How long the first `pulumi up` waits for the API servers to answer /readyz:
# VMs boot, etcd forms, kubeadm init runs. Later runs find it ready at once.
API_READY_TIMEOUT_SECONDS = 20 * 60
API_READY_POLL_SECONDS = 10

# Add-ons whose objects outlive their removal from the cluster file: deleting
# a team's namespace would delete every workload in it. Removing a team
# forgets the namespace (Pulumi state) and leaves it to an admin.
RETAINED_KINDS = ("Namespace", "CustomResourceDefinition")


def _readyz(kubeconfig: str, timeout: float) -> None:
    """Poll the API server of `kubeconfig` until /readyz answers 200, or raise."""
    import base64
    import ssl
    import tempfile
    import time
    import urllib.error
    import urllib.request
    from pathlib import Path

    from ruamel.yaml import YAML

    config = YAML(typ="safe", pure=True).load(kubeconfig)
    cluster = config["clusters"][0]["cluster"]
    user = config["users"][0]["user"]
    with tempfile.TemporaryDirectory() as tmp:
        cert, key = Path(tmp, "cert.pem"), Path(tmp, "key.pem")
        cert.write_bytes(base64.b64decode(user["client-certificate-data"]))
        key.write_bytes(base64.b64decode(user["client-key-data"]))
        context = ssl.create_default_context(cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
        context.load_cert_chain(str(cert), str(key))
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{cluster['server']}/readyz", context=context, timeout=10) as answer:
                    if answer.status == 200:
                        return
                    last = f"HTTP {answer.status}"
            except (urllib.error.URLError, OSError) as err:
                last = str(err)
            time.sleep(API_READY_POLL_SECONDS)
    raise TimeoutError(
        f"the API server {cluster['server']} was not ready after {timeout:.0f}s ({last}); "
        "is it reachable from where `pulumi up` runs (VPN)?"
    )


class _ApiReadyProvider(pulumi.dynamic.ResourceProvider):
    """A gate resource: created once the API answers /readyz (pulumi-kubernetes does not wait)."""

    def create(self, props):
        _readyz(props["kubeconfig"], float(props["timeout"]))
        return pulumi.dynamic.CreateResult(id_="ready", outs={"server": props["server"]})

    def diff(self, _id, olds, news):
        # A new API endpoint (a rebuilt control plane) must be waited for again.
        changed = olds.get("server") != news.get("server")
        return pulumi.dynamic.DiffResult(changes=changed, replaces=["server"] if changed else [])


class ApiServerReady(pulumi.dynamic.Resource):
    def __init__(self, name: str, kubeconfig: pulumi.Input[str], server: str, opts: pulumi.ResourceOptions | None = None):
        super().__init__(
            _ApiReadyProvider(), name,
            {"kubeconfig": pulumi.Output.secret(kubeconfig), "server": server, "timeout": API_READY_TIMEOUT_SECONDS},
            opts,
        )


# The API servers' token: kubeadm's default group (they join as control plane,
# with the rights `kubeadm init` binds to it). Every pool's token: its pool's
# own group (corral.nodes.join.pool_token_group), which kubeadm's
# `kubeadm:node-autoapprove-bootstrap` binding does not cover, so its kubelet
# client requests are approved only by corral-node-approver, and only for that
# pool's machines (corral/manifests/node_approver.py binds the groups what
# `kubeadm join` needs).
BOOTSTRAP_TOKEN_GROUP = "system:bootstrappers:kubeadm:default-node-token"
API_SERVERS_TOKEN = "apiservers"
POOL_TOKEN_PREFIX = "pool-"


def token_group(what: str) -> str:
    """The auth-extra-groups of the token `what` joins with ("apiservers", "pool-<name>")."""
    from corral.nodes.join import pool_token_group

    if what == API_SERVERS_TOKEN:
        return BOOTSTRAP_TOKEN_GROUP
    if what.startswith(POOL_TOKEN_PREFIX):
        return pool_token_group(what[len(POOL_TOKEN_PREFIX):])
    raise ValueError(f"bootstrap token {what!r}: expected {API_SERVERS_TOKEN!r} or '{POOL_TOKEN_PREFIX}<pool>'")
# How far ahead of this machine's clock the rotation time may be (the clock that wrote it).
ROTATION_CLOCK_SKEW = datetime.timedelta(minutes=5)


def token_expiration(rotation: str | None, ttl_hours: int, now: datetime.datetime) -> str:
    """When the tokens of `rotation` expire (RFC 3339, UTC).

    `corral:bootstrapTokenRotation` is the time the tokens were issued, an
    RFC 3339 time ("2026-11-24T06:00:00Z"): they expire `ttl_hours` after it,
    the same on every `pulumi up` until the next rotation. Unset, the tokens
    expire `ttl_hours` after this run, so each `pulumi up` extends the same
    tokens (a warning says so).

    A rotation time in the future (beyond ROTATION_CLOCK_SKEW) would make
    tokens outlive their bound, and one whose tokens have expired would
    register dead tokens: both are refused, with the time to use.
    """
    if rotation is None:
        issued = now
    else:
        try:
            issued = datetime.datetime.fromisoformat(rotation.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(
                f"corral:bootstrapTokenRotation is {rotation!r}: give the time the tokens are issued, "
                "RFC 3339 (e.g. 2026-11-24T06:00:00Z), in stacks/Pulumi.<cluster>.yaml"
            ) from None
        if issued.tzinfo is None:
            issued = issued.replace(tzinfo=datetime.timezone.utc)
    expires = issued.astimezone(datetime.timezone.utc) + datetime.timedelta(hours=ttl_hours)
    if rotation is not None:
        now_text = now.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        if issued > now + ROTATION_CLOCK_SKEW:
            raise ValueError(
                f"corral:bootstrapTokenRotation is {rotation!r}, in the future: its tokens would live until "
                f"{expires:%Y-%m-%dT%H:%M:%SZ}, past their {ttl_hours} h bound. Give the time you issue them "
                f"(now: {now_text}) in stacks/Pulumi.<cluster>.yaml"
            )
        if expires <= now:
            raise ValueError(
                f"corral:bootstrapTokenRotation is {rotation!r}: its tokens expired at {expires:%Y-%m-%dT%H:%M:%SZ} "
                f"({ttl_hours} h after it), and new machines could not join. Rotate them: set it to now "
                f"({now_text}) in stacks/Pulumi.<cluster>.yaml"
            )
    return expires.strftime("%Y-%m-%dT%H:%M:%SZ")


def bootstrap_token_secret(token: str, description: str, expiration: str, group: str) -> dict:
    """The kube-system Secret that makes `token` a bootstrap token in `group` (what `kubeadm token create` writes)."""
    token_id, token_secret = token.split(".", 1)
    return {
        "name": f"bootstrap-token-{token_id}",
        "string_data": {
            "token-id": token_id,
            "token-secret": token_secret,
            "expiration": expiration,
            "usage-bootstrap-authentication": "true",
            "usage-bootstrap-signing": "true",
            "auth-extra-groups": group,
            "description": description,
        },
    }


def _retain(args: pulumi.ResourceTransformArgs) -> pulumi.ResourceTransformResult | None:
    """Keep namespaces and CRDs in the cluster when their add-on goes away (see RETAINED_KINDS)."""
    if any(args.type_ == f"kubernetes:{group}:{kind}" for kind in RETAINED_KINDS
           for group in ("core/v1", "apiextensions.k8s.io/v1")):
        return pulumi.ResourceTransformResult(args.props, pulumi.ResourceOptions.merge(
            args.opts, pulumi.ResourceOptions(retain_on_delete=True)))
    return None


def _kueue_chart(name: str, chart: kueue.KueueChart, opts: pulumi.ResourceOptions) -> k8s.helm.v4.Chart:
    """Kueue's controller, CRDs, RBAC and webhooks from its Helm chart at the pinned version
    (`chart`: corral/manifests/kueue.py), after its namespace (opts). helm.v4.Chart renders the
    chart in the provider and applies each object like the ConfigGroups, server-side."""
    return k8s.helm.v4.Chart(
        f"{name}-{kueue.ADDON}-chart",
        name=chart.release,
        chart=chart.chart,
        version=chart.version,
        namespace=chart.namespace,
        values=chart.values,
        opts=opts,
    )


class Addons(pulumi.ComponentResource):
    """The cluster's add-ons (corral.manifests), one ConfigGroup per add-on.

    kubeconfig: the admin kubeconfig (stack output `adminKubeconfig`).
    cloud_settings: values only the program knows, for the cluster-autoscaler's
    ConfigMap (keys per cloud in `CLOUD_SETTINGS_KEYS`; AWS needs none).
    bootstrap_tokens: what joins with which token (the API servers, each cloud
    pool) -> the token (secret). Each becomes a bootstrap-token Secret in
    kube-system expiring `token_ttl_hours` after its rotation
    (`token_expiration`); a rotation (new tokens) replaces the Secrets, which
    revokes the old tokens at once.
    fleet: the fleet file (fleet.yaml), whose MultiKueue objects the cluster
    gets when it is the manager or a worker (corral/manifests/fleet_addons.py).
    Attributes: provider, ready, groups (add-on name -> ConfigGroup),
    kueue_chart (the Kueue Helm chart, or None), bootstrap_tokens (what -> k8s Secret).
    """

    def __init__(
        self,
        name: str,
        ctx: ClusterContext,
        kubeconfig: pulumi.Input[str],
        cloud_settings: Mapping[str, pulumi.Input[str]] | None = None,
        opts: pulumi.ResourceOptions | None = None,
        bootstrap_tokens: Mapping[str, pulumi.Input[str]] | None = None,
        token_ttl_hours: int = 24,
        token_rotation: str | None = None,
        fleet: LoadedFleet | None = None,
    ):
        super().__init__("corral:addons:Addons", name, None, opts)
        cluster = ctx.cluster
        try:
            # With the fleet's MultiKueue objects when the cluster is its manager or a worker.
            addons = cluster_addons(cluster, fleet)
        except ManifestError as err:
            raise ValueError(f"add-ons: {err}") from None

        child = pulumi.ResourceOptions(parent=self)
        server = f"https://{ctx.layout.api_endpoint}"
        self.ready = ApiServerReady(f"{name}-api-ready", kubeconfig, server, child)
        self.provider = k8s.Provider(
            f"{name}-provider",
            kubeconfig=pulumi.Output.secret(kubeconfig),
            # Objects are applied as corral's field manager and conflicts
            # with hand edits are overwritten: the cluster file wins.
            enable_server_side_apply=True,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.ready]),
        )
        on_cluster = pulumi.ResourceOptions(parent=self, provider=self.provider, depends_on=[self.ready])

        self.groups: dict[str, k8s.yaml.v2.ConfigGroup] = {}
        self.kueue_chart: k8s.helm.v4.Chart | None = None
        for addon in addons:
            # Kueue's queues are its CRDs' kinds: they wait for the chart that installs them.
            after = [self.kueue_chart] if addon.name == kueue.QUEUES_ADDON and self.kueue_chart else []
            self.groups[addon.name] = k8s.yaml.v2.ConfigGroup(
                f"{name}-{addon.name}",
                objs=[dict(obj) for obj in addon.objects],
                opts=pulumi.ResourceOptions.merge(
                    on_cluster, pulumi.ResourceOptions(transforms=[_retain], depends_on=after)),
            )
            if addon.name == kueue.ADDON:
                self.kueue_chart = _kueue_chart(
                    # On the fleet's manager the configuration carries its multiKueue section.
                    name, kueue.chart(cluster, manager_kueue_settings(cluster, fleet)),
                    # Its CRDs are retained like the ConfigGroups' (RETAINED_KINDS): turning Kueue
                    # off must not delete every Workload and queue of the cluster with them.
                    pulumi.ResourceOptions.merge(on_cluster, pulumi.ResourceOptions(
                        depends_on=[self.groups[addon.name]], transforms=[_retain])))
            # Namespaces Kubernetes itself creates (default, kube-system, ...)
            # cannot be created again (pulumi-kubernetes >= 4.29 does not
            # upsert): their labels (Pod Security) are server-side patches.
            for obj in addon.patches:
                namespace = obj["metadata"]["name"]
                k8s.core.v1.NamespacePatch(
                    f"{name}-{addon.name}-{namespace}",
                    metadata=obj["metadata"],
                    opts=on_cluster,
                )

        # Grafana's admin login (generated, secret): corral/infra/grafana_admin.py.
        self.grafana_admin = None
        if "monitoring" in self.groups:
            from .grafana_admin import grafana_admin_secret

            self.grafana_admin = grafana_admin_secret(name, on_cluster, self.groups["monitoring"])

        self.bootstrap_tokens: dict[str, k8s.core.v1.Secret] = {}
        if bootstrap_tokens:
            if token_rotation is None:
                from .platform import warn_once

                warn_once(
                    "corral:bootstrapTokenRotation is not set: every `pulumi up` extends the same bootstrap "
                    f"tokens by {token_ttl_hours} h. Set it to the time you issue tokens and change it to rotate "
                    f"them: pulumi config set corral:bootstrapTokenRotation \"$(date -u +%Y-%m-%dT%H:%M:%SZ)\" "
                    f"-s {cluster.name} (docs/security.md, Rotating each secret)."
                )
            expiration = token_expiration(token_rotation, token_ttl_hours, datetime.datetime.now(datetime.timezone.utc))
            for what, token in bootstrap_tokens.items():
                secret = pulumi.Output.secret(token).apply(
                    lambda value, what=what: bootstrap_token_secret(
                        value, f"corral: machines of {what} join with this token", expiration, token_group(what))
                )
                self.bootstrap_tokens[what] = k8s.core.v1.Secret(
                    f"{name}-bootstrap-token-{what}",
                    metadata={"name": secret["name"], "namespace": "kube-system"},
                    type="bootstrap.kubernetes.io/token",
                    string_data=secret["string_data"],
                    opts=on_cluster,
                )

        self.cloud_settings = None
        if "cluster-autoscaler" in self.groups:
            needed = CLOUD_SETTINGS_KEYS[cluster.control_plane.cloud]
            given = dict(cloud_settings or {})
            missing = [key for key in needed if key not in given]
            if missing:
                raise ValueError(
                    f"add-ons: the cluster-autoscaler on {cluster.control_plane.cloud} needs "
                    f"cloud_settings {', '.join(missing)} (see corral/infra/addons.py)"
                )
            if needed:
                self.cloud_settings = k8s.core.v1.ConfigMap(
                    f"{name}-{CLOUD_SETTINGS_CONFIGMAP}",
                    metadata={"name": CLOUD_SETTINGS_CONFIGMAP, "namespace": "kube-system"},
                    data={key: given[key] for key in needed},
                    opts=on_cluster,
                )
        self.register_outputs({"addons": list(self.groups)})
