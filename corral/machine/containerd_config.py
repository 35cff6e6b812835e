"""containerd's /etc/containerd/config.toml as corral writes it on every node.

One template (corral/templates/containerd/config.toml.j2) for both paths: the
cloud node prep writes what `render_config` returns, and the on-prem
container_runtime role renders the same file with Ansible (its
corral_containerd_config_template). The file is written whole, not edited:
containerd 2.x moved every CRI key (config version 3: `pinned_images.sandbox`
instead of `sandbox_image`, `cni.bin_dirs`, the `io.containerd.cri.v1.*`
plugins), so edits written for version 2 would silently do nothing there.

Ansible renders with trim_blocks (its default); so does this module, so both
write the same bytes for the same inputs (a hostlab test compares them).
"""

from __future__ import annotations

from .files import environment

TEMPLATE = "containerd/config.toml.j2"
PATH = "/etc/containerd/config.toml"
# Where kubernetes-cni and flannel's CNI plugin are installed.
CNI_BIN_DIR = "/opt/cni/bin"
CNI_CONF_DIR = "/etc/cni/net.d"
# The runtime nvidia-container-toolkit installs (nvidia-container-toolkit
# package: /usr/bin/nvidia-container-runtime).
NVIDIA_RUNTIME_BINARY = "/usr/bin/nvidia-container-runtime"


def render_config(containerd_version: str, sandbox_image: str, *, nvidia_runtime: bool) -> str:
    """The whole config.toml for `containerd_version` (e.g. "2.3.6")."""
    env = environment().overlay(trim_blocks=True)
    return env.get_template(TEMPLATE).render(
        containerd_version=containerd_version,
        sandbox_image=sandbox_image,
        nvidia_runtime=nvidia_runtime,
        nvidia_runtime_binary=NVIDIA_RUNTIME_BINARY,
        cni_bin_dir=CNI_BIN_DIR,
        cni_conf_dir=CNI_CONF_DIR,
    )
