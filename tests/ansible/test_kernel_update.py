"""A kernel update on a GPU host still comes up with an NVIDIA module (issue 24, item 2).

On a real throwaway host (tests/hostlab), the nvidia_driver role runs as on
metal for a host whose kernel is a Debian flavour's (a fake 6.1.0-90-amd64:
a container cannot boot a kernel, so the role is told the release it runs).
Then a kernel update arrives the way Debian ships one - a new ABI package
pulled by the flavour's metapackage - and the host must get a module for it
from DKMS in the kernel's own hook, because the role installed the flavour's
headers metapackage and not only the running kernel's headers. A kernel that
arrives without its headers is refused by corral's kernel hook, so the boot
loader is never pointed at a kernel without its GPUs.

The packages are TEST FAKES shaped like Debian's (tests/hostlab/aptrepo.py:
kernel_packages; the dkms hook models dkms's: a module only when the
kernel's headers are there); apt, dpkg, run-parts and the role run for real.
"""

from __future__ import annotations

import json

import pytest

from tests.hostlab.aptrepo import KEYRING_NAME, KERNEL_ABIS
from tests.nodes import joinlab

pytestmark = pytest.mark.hostlab

HOST = "ku-gpu-001.sf1.internal"
RUNNING, UPDATE, WITHOUT_HEADERS = (f"{abi}-amd64" for abi in KERNEL_ABIS)

PLAYBOOK = """
- name: The NVIDIA driver on a GPU host whose kernel is a Debian flavour's
  hosts: all
  gather_facts: true
  gather_subset: ['!all', 'min']
  roles:
    - role: nvidia_driver
"""


def module(host, release: str) -> bool:
    return host.path(f"/lib/modules/{release}/updates/dkms/nvidia.ko").exists()


@pytest.fixture(scope="module")
def kernel_host(hostlab, hostlab_repo, tmp_path_factory):
    lab, repo = hostlab, hostlab_repo
    workdir = tmp_path_factory.mktemp("kernel-update")
    host = lab.boot([HOST])[0]
    try:
        joinlab.put_key(repo, host)
        # The host runs kernel RUNNING, installed from "Debian" (the fake flavour repo).
        repo.configure_host(host, ["debian-kernel"])
        host.run(f"apt-get install -y -q linux-image-amd64 && test -e /boot/vmlinuz-{RUNNING}", timeout=300)
        (workdir / "playbook.yml").write_text(PLAYBOOK)
        role = joinlab.run_playbook(lab, [host], workdir, workdir / "playbook.yml", {
            "corral_pool": "h100", "corral_gpu_model": "H100", "corral_gpu_count": 8,
            "corral_nvidia_driver_version": "550.127.05",
            "corral_nvidia_repo_url": repo.url("cuda"), "corral_nvidia_repo_key_url": f"file://{joinlab.KEY_ON_HOST}",
            # As on metal, for a host running RUNNING (a container has no kernel of its own).
            "corral_nvidia_install_kernel_headers": True,
            "corral_kernel_release": RUNNING,
        }, name="kernel")
        states = {"role": role, "module_running": module(host, RUNNING)}
        # The update arrives in the mirror; unattended-upgrades (or `apt
        # upgrade`) moves the flavour's metapackages to it.
        keyring = f"/usr/share/keyrings/{KEYRING_NAME}"
        host.path("/etc/apt/sources.list.d/kernel-update.list").write_text(
            repo.sources_line("debian-kernel-update", keyring) + "\n")
        states["upgrade"] = host.run(
            "apt-get update -q -o Dir::Etc::sourcelist=sources.list.d/kernel-update.list "
            "-o Dir::Etc::sourceparts=- -o APT::Get::List-Cleanup=0 "
            "&& apt-get install -y -q --only-upgrade linux-image-amd64 linux-headers-amd64 2>&1",
            check=False, timeout=300)
        states["module_update"] = module(host, UPDATE)
        # A kernel installed on its own, without headers: DKMS cannot build for it.
        states["alone"] = host.run(f"apt-get install -y -q linux-image-{WITHOUT_HEADERS} 2>&1", check=False, timeout=300)
        states["alone_status"] = host.run(f"dpkg-query -W -f='${{Status}}' linux-image-{WITHOUT_HEADERS}",
                                          check=False).stdout
        print("\nkernel update:", json.dumps({k: v for k, v in states.items() if isinstance(v, (bool, str))}))
        yield states
    finally:
        lab.remove_host(host)


def test_the_role_installs_the_flavours_headers_and_builds_for_the_running_kernel(kernel_host):
    role = kernel_host["role"]
    assert role["rc"] == 0, role["stdout"][-8000:] + role["stderr"][-3000:]
    assert kernel_host["module_running"]


def test_a_kernel_update_gets_an_nvidia_module_from_its_own_hook(kernel_host):
    upgrade = kernel_host["upgrade"]
    assert upgrade.returncode == 0, upgrade.stdout
    assert f"linux-headers-{UPDATE}" in upgrade.stdout, upgrade.stdout
    assert kernel_host["module_update"], (
        f"no nvidia module for {UPDATE} after the kernel update: its headers did not come with it\n{upgrade.stdout}")


def test_a_kernel_without_a_module_is_refused_before_it_becomes_the_boot_kernel(kernel_host):
    alone = kernel_host["alone"]
    assert alone.returncode != 0, alone.stdout
    assert f"no NVIDIA kernel module was built for kernel {WITHOUT_HEADERS}" in alone.stdout
    # Unpacked but not configured: its postinst (and so update-grub) did not finish.
    assert "half-configured" in kernel_host["alone_status"] or "unpacked" in kernel_host["alone_status"]
