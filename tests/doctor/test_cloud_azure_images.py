"""Azure's boot images in `corral doctor`: the stack's corral:nodeImage / corral:gpuNodeImage
(ARM ids, looked up with `az resource show --ids`), the Marketplace image only while
nodeImage is unset, and a GPU pool with neither setting refused, against the fake az."""

from __future__ import annotations

from corral.doctor import Status
from corral.doctor.cloud_azure import check_credentials, check_images
from corral.doctor.pulumi_checks import check_config

from .conftest import SUBSCRIPTION

IMAGES = f"/subscriptions/{SUBSCRIPTION}/resourceGroups/corral-images/providers/Microsoft.Compute"
NODE_IMAGE = f"{IMAGES}/images/corral-node"
GPU_IMAGE = f"{IMAGES}/galleries/corral/images/corral-gpu-node/versions/1.31.4"
GPU_POOL = """  - name: gpu-a100
    provider: azure
    machineType: Standard_NC24ads_A100_v4
    zones: ["2"]
    minSize: 0
    maxSize: 4
    gpu: {model: A100, count: 1}
"""


def jaguar_with_gpu_pool(world, images: dict[str, str]) -> None:
    """jaguar plus a cloud GPU pool, its stack setting `images` (key -> ARM id)."""
    path = world.clusters / "jaguar.yaml"
    text = path.read_text()
    assert "nodePools:\n" in text
    path.write_text(text.replace("nodePools:\n", "nodePools:\n" + GPU_POOL, 1))
    settings = "".join(f"  {key}: {value}\n" for key, value in images.items())
    world.stack("jaguar", f"config:\n  azure-native:location: eastus2\n  azure-native:subscriptionId: {SUBSCRIPTION}\n"
                          + settings)


def built(world, *ids: str, state: str = "Succeeded") -> None:
    world.state["az"]["resources"] = {i: {"properties": {"provisioningState": state}} for i in ids}


def images_found(world):
    ctx = world.context("jaguar")
    check_config(ctx)
    check_credentials(ctx)
    return check_images(ctx)


def test_the_images_the_stack_sets_are_looked_up_by_id_and_the_marketplace_is_not(world):
    jaguar_with_gpu_pool(world, {"corral:nodeImage": NODE_IMAGE, "corral:gpuNodeImage": GPU_IMAGE})
    built(world, NODE_IMAGE, GPU_IMAGE)
    found = images_found(world)
    assert [(f.status, f.finding) for f in found] == [
        (Status.passed, f"{NODE_IMAGE} is Succeeded (booted by control plane, cpu-d64)"),
        (Status.passed, f"{GPU_IMAGE} is Succeeded (booted by gpu-a100)"),
    ]
    calls = [c for c in world.calls() if c[0] == "az"]
    assert ["az", "resource", "show", "--ids", GPU_IMAGE, "--output", "json"] in calls
    assert not [c for c in calls if c[1:3] == ["vm", "image"]], "no Marketplace lookup when nodeImage is set"


def test_a_missing_or_unfinished_image_fails_with_the_build_command(world):
    jaguar_with_gpu_pool(world, {"corral:nodeImage": NODE_IMAGE, "corral:gpuNodeImage": GPU_IMAGE})
    built(world, NODE_IMAGE)
    missing = {f.finding.split(" ")[0]: f for f in images_found(world)}[GPU_IMAGE]
    assert missing.status is Status.fail and "not found" in missing.finding and "gpu-a100" in missing.finding
    assert "-only=azure-arm.gpu-node" in missing.fix
    built(world, NODE_IMAGE, GPU_IMAGE, state="Creating")
    assert {f.status for f in images_found(world)} == {Status.fail}


def test_with_only_a_gpu_image_the_rest_boot_the_marketplace_image_which_is_checked(world):
    jaguar_with_gpu_pool(world, {"corral:gpuNodeImage": GPU_IMAGE})
    built(world, GPU_IMAGE)
    assert [(f.status, f.finding) for f in images_found(world)] == [
        (Status.passed, f"{GPU_IMAGE} is Succeeded (booted by gpu-a100)"),
        (Status.passed, "Debian:debian-12:12-gen2:latest is offered in eastus2 "
                        "(the control plane and CPU pools boot it)"),
    ]


def test_an_azure_gpu_pool_without_any_image_fails_the_stack_check(world):
    jaguar_with_gpu_pool(world, {})
    found = [f for f in check_config(world.context("jaguar")) if f.status is Status.fail]
    assert [f.finding for f in found] == [
        "stacks/Pulumi.jaguar.yaml: GPU pool gpu-a100 needs corral:gpuNodeImage (or corral:nodeImage): "
        "the Marketplace image has no NVIDIA driver"]
    assert found[0].fix == "pulumi config set -s jaguar corral:gpuNodeImage IMAGE-ID  (node-images/)"


def test_an_azure_gpu_pool_on_node_image_is_a_warning_as_on_aws_and_gcp(world):
    jaguar_with_gpu_pool(world, {"corral:nodeImage": NODE_IMAGE})
    found = check_config(world.context("jaguar"))
    assert [(f.status, f.finding) for f in found] == [
        (Status.warn, "stacks/Pulumi.jaguar.yaml: corral:gpuNodeImage is not set: GPU pools boot corral:nodeImage, "
                      "which needs the NVIDIA driver then")]
