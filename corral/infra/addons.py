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

from collections.abc import Mapping

import pulumi
import pulumi_kubernetes as k8s

from corral.manifests import ManifestError, render
from corral.manifests.policy import CLOUD_SETTINGS_CONFIGMAP, CLOUD_SETTINGS_KEYS

from .platform import ClusterContext

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


def _retain(args: pulumi.ResourceTransformArgs) -> pulumi.ResourceTransformResult | None:
    """Keep namespaces and CRDs in the cluster when their add-on goes away (see RETAINED_KINDS)."""
    if any(args.type_ == f"kubernetes:{group}:{kind}" for kind in RETAINED_KINDS
           for group in ("core/v1", "apiextensions.k8s.io/v1")):
        return pulumi.ResourceTransformResult(args.props, pulumi.ResourceOptions.merge(
            args.opts, pulumi.ResourceOptions(retain_on_delete=True)))
    return None


class Addons(pulumi.ComponentResource):
    """The cluster's add-ons (corral.manifests), one ConfigGroup per add-on.

    kubeconfig: the admin kubeconfig (stack output `adminKubeconfig`).
    cloud_settings: values only the program knows, for the cluster-autoscaler's
    ConfigMap (keys per cloud in `CLOUD_SETTINGS_KEYS`; AWS needs none).
    Attributes: provider, ready, groups (add-on name -> ConfigGroup).
    """

    def __init__(
        self,
        name: str,
        ctx: ClusterContext,
        kubeconfig: pulumi.Input[str],
        cloud_settings: Mapping[str, pulumi.Input[str]] | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("corral:addons:Addons", name, None, opts)
        cluster = ctx.cluster
        try:
            addons = render(cluster)
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
        for addon in addons:
            self.groups[addon.name] = k8s.yaml.v2.ConfigGroup(
                f"{name}-{addon.name}",
                objs=[dict(obj) for obj in addon.objects],
                opts=pulumi.ResourceOptions.merge(on_cluster, pulumi.ResourceOptions(transforms=[_retain])),
            )
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
