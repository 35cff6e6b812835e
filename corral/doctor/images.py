"""The images a cluster's machines boot, as the stack names them (every cloud: on Azure an
image's ARM id, and the Marketplace image while corral:nodeImage is unset, cloud_azure.py)."""

from __future__ import annotations

from collections.abc import Callable

from .checks import Context, Finding, Status


def boot_images(ctx: Context) -> dict[str, list[str]]:
    """Image -> what boots it: the control plane and CPU pools `corral:nodeImage`,
    GPU pools `corral:gpuNodeImage` (default nodeImage): corral/infra/<cloud>/common.py."""
    node, gpu = ctx.config("corral:nodeImage"), ctx.config("corral:gpuNodeImage") or ctx.config("corral:nodeImage")
    images: dict[str, list[str]] = {}
    if isinstance(node, str) and node:
        images.setdefault(node, []).append("control plane")
    for pool in ctx.cluster.cloud_pools:
        image = gpu if pool.gpu else node
        if isinstance(image, str) and image:
            images.setdefault(image, []).append(pool.name)
    return images


def each_boot_image(ctx: Context, describe: Callable[[Context, str, list[str]], Finding]) -> list[Finding]:
    """`describe(ctx, image, what boots it)` for every image the stack sets."""
    images = boot_images(ctx)
    if not images:
        return [Finding("cloud.images", Status.skip, "no image set in the stack (see pulumi.config)")]
    return [describe(ctx, image, users) for image, users in images.items()]
