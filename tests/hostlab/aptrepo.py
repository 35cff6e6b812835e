"""A local, signed apt repository of *test fakes* for the hostlab hosts.

Why: the roles install NVIDIA's CUDA drivers, the NVIDIA container toolkit
and Kubernetes from upstream apt repositories that cannot be reached here (and
the real packages would need a GPU and a control plane anyway).  This module
builds packages with the upstream **names, versions and dependency shapes**
whose programs are small, clearly marked fakes (``# TEST FAKE: ...``), signs
the repositories with a throwaway gpg key and serves them over HTTP on the lab
bridge.  A role under test then only needs its repository URL and key
variables pointed here; everything else (apt pins, holds, ``signed-by=``
keyrings, service enablement) runs for real.

Layout served (flat repositories, like upstream; ``deb [signed-by=K] URL /``)::

    /compute/cuda/repos/debian12/x86_64/      cuda-drivers, nvidia-driver, ...
    /libnvidia-container/stable/deb/amd64/    nvidia-container-toolkit, ...
    /core:/stable:/v1.31/deb/                 kubeadm, kubelet, ... (per minor)

Fake sources live in ``fakepkgs/``; see README.md for what each fake models.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import http.server
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterable, Sequence

from corral.model.containerd import package_version
from corral.model.versions import DEFAULT_CONTAINERD, NVIDIA_CONTAINER_TOOLKIT
from tests import gobuild

from .lab import Host, Lab, LabConfig, LabError, _flock, _run

FAKEPKGS = Path(__file__).with_name("fakepkgs")

#: Bump when the package recipes below change; part of the build cache key.
REPO_RECIPE_VERSION = 3

#: CUDA version shown by nvidia-smi for a driver branch.
CUDA_FOR_BRANCH = {"535": "12.2", "550": "12.4", "555": "12.5", "560": "12.6",
                   "565": "12.7", "570": "12.8", "575": "12.9", "580": "13.0"}

#: Default GPU memory (MiB) nvidia-smi reports for well-known models.
GPU_MEMORY = {"NVIDIA H100 80GB HBM3": 81559, "NVIDIA H200": 143771,
              "NVIDIA A100-SXM4-80GB": 81920, "NVIDIA L40S": 46068}

KEYRING_NAME = "corral-hostlab-archive-keyring.gpg"

#: ABIs of the fake Debian kernels: installed, arriving by update, arriving alone (no headers).
KERNEL_ABIS = ("6.1.0-90", "6.1.0-91", "6.1.0-92")


# --------------------------------------------------------------------------
# package recipes
# --------------------------------------------------------------------------

@dataclasses.dataclass
class FakePackage:
    """One .deb: control fields, files and which systemd units to manage."""

    name: str
    version: str
    description: str
    depends: list[str] = dataclasses.field(default_factory=list)
    recommends: list[str] = dataclasses.field(default_factory=list)
    provides: list[str] = dataclasses.field(default_factory=list)
    conflicts: list[str] = dataclasses.field(default_factory=list)
    replaces: list[str] = dataclasses.field(default_factory=list)
    #: destination path -> ("fake", program source name) | ("file", source) | ("text", content)
    #: | ("exec", content of an executable) | ("link", symlink target)
    #: | ("program", absolute path of a real program built on this machine, e.g. by scripts/build-runtime)
    files: dict[str, tuple[str, str]] = dataclasses.field(default_factory=dict)
    #: systemd units enabled at install (and started, unless in ``no_start``)
    units: list[str] = dataclasses.field(default_factory=list)
    no_start: bool = False
    #: units shipped but left disabled (the admin/role must enable them)
    disabled_units: list[str] = dataclasses.field(default_factory=list)
    conffiles: list[str] = dataclasses.field(default_factory=list)
    build: dict = dataclasses.field(default_factory=dict)
    section: str = "misc"
    #: shell run at the end of postinst "configure" (e.g. the kernel hooks)
    postinst_script: str = ""


@dataclasses.dataclass
class RepoSpec:
    """One flat repository: where it is served and what it carries."""

    name: str
    path: str
    origin: str
    label: str
    packages: list[FakePackage]


def _doc(name: str) -> tuple[str, str]:
    return ("text", f"{name}: TEST FAKE package built by corral's hostlab "
                    "(tests/hostlab/aptrepo.py). It is not the real software.\n")


def cuda_packages(driver_version: str, gpu_model: str, gpu_count: int) -> list[FakePackage]:
    """Packages of NVIDIA's Debian 12 CUDA repo for one driver version."""
    v = f"{driver_version}-1"
    branch = driver_version.split(".")[0]
    build = {"driver_version": driver_version, "cuda_version": CUDA_FOR_BRANCH.get(branch, "12.4"),
             "gpu_model": gpu_model, "gpu_count": gpu_count,
             "gpu_memory_mib": GPU_MEMORY.get(gpu_model, 81559)}
    return [
        FakePackage("nvidia-kernel-open-dkms", v, "NVIDIA open GPU kernel module (TEST FAKE: no module)",
                    files={"/usr/share/doc/nvidia-kernel-open-dkms/TEST-FAKE": _doc("nvidia-kernel-open-dkms"),
                           # dkms's hooks, which the real package gets from its dependency dkms
                           "/etc/kernel/postinst.d/dkms": ("exec", FAKE_DKMS_HOOK),
                           "/etc/kernel/header_postinst.d/dkms": ("exec", FAKE_DKMS_HOOK)},
                    # like dkms at install: a module for every kernel whose headers are there
                    postinst_script=('for k in /boot/vmlinuz-*; do [ -e "$k" ] || continue; '
                                     '/etc/kernel/postinst.d/dkms "${k#/boot/vmlinuz-}"; done\n'),
                    provides=[f"nvidia-kernel-{driver_version}"], section="non-free/kernel"),
        FakePackage("nvidia-smi", v, "NVIDIA System Management Interface (TEST FAKE)",
                    depends=["python3"], build=build,
                    files={"/usr/bin/nvidia-smi": ("fake", "nvidia-smi")}, section="non-free/utils"),
        FakePackage("nvidia-persistenced", v, "daemon to maintain persistent GPU state (TEST FAKE)",
                    depends=["python3"], build=build,
                    files={"/usr/bin/nvidia-persistenced": ("fake", "nvidia-persistenced"),
                           "/usr/lib/systemd/system/nvidia-persistenced.service":
                               ("file", "units/nvidia-persistenced.service")},
                    units=["nvidia-persistenced.service"], section="non-free/utils"),
        FakePackage("nvidia-driver", v, "NVIDIA metapackage (TEST FAKE)",
                    depends=[f"nvidia-smi (= {v})",
                             f"nvidia-kernel-open-dkms (= {v}) | nvidia-kernel-{driver_version}"],
                    recommends=[f"nvidia-persistenced (= {v})"],
                    files={"/usr/share/doc/nvidia-driver/TEST-FAKE": _doc("nvidia-driver")},
                    section="non-free/x11"),
        FakePackage(f"cuda-drivers-{branch}", v, f"CUDA drivers branch {branch} (TEST FAKE)",
                    depends=[f"nvidia-driver (>= {v})", f"nvidia-driver (<< {int(branch) + 1})",
                             f"nvidia-persistenced (>= {v})"],
                    files={f"/usr/share/doc/cuda-drivers-{branch}/TEST-FAKE": _doc(f"cuda-drivers-{branch}")}),
        FakePackage("cuda-drivers", v, "CUDA drivers meta-package (TEST FAKE)",
                    depends=[f"cuda-drivers-{branch} (>= {v})"],
                    files={"/usr/share/doc/cuda-drivers/TEST-FAKE": _doc("cuda-drivers")}),
        FakePackage(f"nvidia-fabricmanager-{branch}", v,
                    "NVIDIA Fabric Manager (TEST FAKE; shipped disabled, like upstream)",
                    depends=["python3"], provides=["nvidia-fabricmanager"],
                    conflicts=["nvidia-fabricmanager"], build=build,
                    files={"/usr/bin/nv-fabricmanager": ("fake", "nv-fabricmanager"),
                           "/usr/lib/systemd/system/nvidia-fabricmanager.service":
                               ("file", "units/nvidia-fabricmanager.service"),
                           "/usr/share/nvidia/nvswitch/fabricmanager.cfg":
                               ("file", "units/fabricmanager.cfg")},
                    disabled_units=["nvidia-fabricmanager.service"], section="non-free/utils"),
    ]


def toolkit_packages(toolkit_version: str, gpu_count: int) -> list[FakePackage]:
    """Packages of the NVIDIA container toolkit repo for one version."""
    v = f"{toolkit_version}-1"
    build = {"toolkit_version": toolkit_version, "gpu_count": gpu_count}
    exact_tools = tuple(int(part) for part in toolkit_version.split(".")[:2]) >= (1, 18)
    return [
        FakePackage("libnvidia-container1", v, "NVIDIA container runtime library (TEST FAKE)",
                    files={"/usr/share/doc/libnvidia-container1/TEST-FAKE": _doc("libnvidia-container1")},
                    section="libs"),
        FakePackage("libnvidia-container-tools", v, "NVIDIA container runtime library (command-line tools) (TEST FAKE)",
                    depends=[f"libnvidia-container1 (>= {v})", "python3"], build=build,
                    files={"/usr/bin/nvidia-container-cli": ("fake", "nvidia-container-cli")},
                    section="utils"),
        FakePackage("nvidia-container-toolkit-base", v, "NVIDIA Container Toolkit Base (TEST FAKE)",
                    depends=["python3"], build=build,
                    files={"/usr/bin/nvidia-ctk": ("fake", "nvidia-ctk"),
                           "/usr/bin/nvidia-container-runtime": ("fake", "nvidia-container-runtime"),
                           "/etc/nvidia-container-runtime/config.toml": ("text", (
                               "# TEST FAKE config from corral's hostlab fake toolkit\n"
                               "#accept-nvidia-visible-devices-as-volume-mounts = false\n"
                               "disable-require = false\nsupported-driver-capabilities = "
                               "\"compat32,compute,display,graphics,ngx,utility,video\"\n\n"
                               "[nvidia-container-cli]\nenvironment = []\nldconfig = \"@/sbin/ldconfig\"\n"
                               "load-kmods = true\n\n[nvidia-container-runtime]\nlog-level = \"info\"\n"
                               "mode = \"auto\"\nruntimes = [\"runc\", \"crun\"]\n"))},
                    conffiles=["/etc/nvidia-container-runtime/config.toml"], section="utils"),
        # From 1.18 the toolkit wants libnvidia-container-tools of its exact version (packaging/debian/control).
        FakePackage("nvidia-container-toolkit", v, "NVIDIA Container toolkit (TEST FAKE)",
                    depends=[f"nvidia-container-toolkit-base (= {v})",
                             f"libnvidia-container-tools ({'=' if exact_tools else '>='} {v})",
                             "libnvidia-container-tools (<< 2.0.0)"],
                    build=build,
                    files={"/usr/bin/nvidia-container-runtime-hook": ("fake", "nvidia-container-runtime-hook")},
                    section="utils"),
    ]


def k8s_packages(k8s_version: str, cri_tools_version: str | None = None,
                 cni_version: str | None = None) -> list[FakePackage]:
    """Packages of a pkgs.k8s.io ``core:/stable:/v1.MINOR`` repo for one version."""
    minor = k8s_version.split(".")[1]
    rev = "-1.1"
    cri = cri_tools_version or f"1.{minor}.1"
    cni = cni_version or ("1.5.1" if int(minor) >= 31 else "1.4.0")
    build = {"k8s_version": k8s_version, "cri_tools_version": cri}
    plugins = ("bandwidth", "bridge", "firewall", "host-local", "loopback", "portmap", "tuning")
    return [
        FakePackage("kubectl", k8s_version + rev, "Command-line utility for interacting with a Kubernetes cluster (TEST FAKE)",
                    depends=["python3"], build=build, files={"/usr/bin/kubectl": ("fake", "kubectl")}),
        FakePackage("kubelet", k8s_version + rev, "Node agent for Kubernetes clusters (TEST FAKE)",
                    depends=["python3", "iproute2", "mount", "kubernetes-cni (>= 1.4.0)"], build=build,
                    files={"/usr/bin/kubelet": ("fake", "kubelet"),
                           "/usr/lib/systemd/system/kubelet.service": ("file", "units/kubelet.service")},
                    units=["kubelet.service"]),
        FakePackage("kubeadm", k8s_version + rev, "Command-line utility for administering a Kubernetes cluster (TEST FAKE)",
                    depends=[f"cri-tools (>= 1.{minor}.0)", "python3", "python3-yaml"], build=build,
                    files={"/usr/bin/kubeadm": ("fake", "kubeadm"),
                           "/usr/lib/systemd/system/kubelet.service.d/10-kubeadm.conf":
                               ("file", "units/10-kubeadm.conf")}),
        FakePackage("cri-tools", cri + rev, "Command-line utility for interacting with a container runtime (TEST FAKE)",
                    depends=["python3"], build=build, files={"/usr/bin/crictl": ("fake", "crictl")}),
        FakePackage("kubernetes-cni", cni + rev, "Binaries required to provision kubernetes container networking (TEST FAKE)",
                    depends=["python3"], build=build,
                    files={f"/opt/cni/bin/{p}": ("fake", "cni-plugin") for p in plugins}),
    ]


# The containerd.io versions the test repository carries: the last 1.7 that corral pinned
# before containerd 2 (its config layout is version 2) and the catalog's default for every
# supported Kubernetes minor (corral/model/versions.py DEFAULT_CONTAINERD).
# The Kubernetes release the test repository carries by default: the 1.31 the hostlab tests were
# written for (a test that wants the new-cluster version asks for it: tests that install without
# a version would otherwise get the newest).
K8S_VERSIONS = ("1.31.4",)
# The NVIDIA driver: the R550 release the hostlab tests were written for (R550 is past its end of
# life for a real cluster: corral validate; the on-prem guide's test asks for its R580 one).
DRIVER_VERSIONS = ("550.127.05",)
# The NVIDIA container toolkit: the release before jit-cdi and the catalog's.
TOOLKIT_VERSIONS = ("1.17.8", NVIDIA_CONTAINER_TOOLKIT.value)
CONTAINERD_LEGACY = package_version("1.7.27")                   # 1.7.27-1
CONTAINERD_CURRENT = package_version(DEFAULT_CONTAINERD)        # 2.3.6-1~debian.12~bookworm


def containerd_packages(runtime_bin: Path | None = None) -> list[FakePackage]:
    """Docker's containerd.io (TEST FAKE package; the 2.x one carries the real containerd).

    1.7.27-1 carries the name and version and brings Debian's containerd (1.6.20, config
    version 2) as a dependency, so the role's repository, pin, hold and configuration run
    for real. 2.3.6 (named as Docker's build names it) carries the real containerd, containerd-shim-runc-v2 and ctr v2.3.6
    built from their Go module (scripts/build-runtime; `runtime_bin` is its bin folder) and
    containerd's own systemd unit, and replaces Debian's containerd as the real package
    does; it is left out on a machine that cannot build it (no Go). Neither carries runc
    (the real one does; it needs cgo): Debian's runc comes as a dependency."""
    packages = [FakePackage("containerd.io", CONTAINERD_LEGACY,
                            "An open and reliable container runtime (TEST FAKE: Debian's containerd inside)",
                            depends=["containerd (>= 1.6.20~)"],
                            files={"/usr/share/doc/containerd.io/TEST-FAKE": _doc("containerd.io")})]
    if runtime_bin is not None:
        unit = (runtime_bin.parent / "containerd.service").read_text()
        packages.append(FakePackage(
            "containerd.io", CONTAINERD_CURRENT,
            "An open and reliable container runtime (TEST FAKE package: the real containerd v2.3.6 inside)",
            depends=["runc"], conflicts=["containerd"], replaces=["containerd"],
            files={**{f"/usr/bin/{name}": ("program", str(runtime_bin / name))
                      for name in ("containerd", "containerd-shim-runc-v2", "ctr")},
                   # As containerd.io installs it: the binary in /usr/bin.
                   "/lib/systemd/system/containerd.service":
                       ("text", unit.replace("/usr/local/bin/containerd", "/usr/bin/containerd")),
                   "/usr/share/doc/containerd.io/TEST-FAKE": _doc("containerd.io")},
            units=["containerd.service"]))
    return packages


def _runtime_bin() -> Path | None:
    """scripts/build-runtime's bin folder, or None on a machine without Go."""
    try:
        return gobuild.runtime_bin_dir()
    except gobuild.GoBuildUnavailable:
        return None


def _run_kernel_hooks(hook_dir: str, release: str) -> str:
    """What Debian's kernel and header packages' postinst do: run-parts over /etc/kernel/<hook_dir>."""
    return (f"mkdir -p /lib/modules/{release}\n"
            f"if [ -d /etc/kernel/{hook_dir} ]; then\n"
            f"  run-parts --report --exit-on-error --arg={release} --arg=/boot/vmlinuz-{release} /etc/kernel/{hook_dir}\n"
            "fi\n")


# TEST FAKE of the dkms package's kernel hooks (/etc/kernel/postinst.d/dkms and
# header_postinst.d/dkms, which run `dkms autoinstall` for the kernel given):
# a module is built for a kernel only when its headers are there, otherwise
# dkms warns and the kernel installs without one.
FAKE_DKMS_HOOK = """#!/bin/sh
# TEST FAKE of dkms's kernel hook (corral hostlab, tests/hostlab/aptrepo.py).
release="$1"
if [ -e "/lib/modules/$release/build/Makefile" ] && [ -e "/boot/vmlinuz-$release" ]; then
  mkdir -p "/lib/modules/$release/updates/dkms"
  echo "TEST FAKE nvidia module for $release" > "/lib/modules/$release/updates/dkms/nvidia.ko"
else
  echo "dkms: WARNING: Linux headers are missing, which may explain the above failures." >&2
  echo "      please install the linux-headers-$release package to fix this." >&2
fi
exit 0
"""


def kernel_packages(abi: str, version: str, flavour: str = "amd64", *, meta: bool = True) -> list[FakePackage]:
    """A Debian kernel of one ABI (TEST FAKE: no kernel inside), shaped like
    Debian's: linux-image-<abi>-<flavour> runs the kernel hooks in
    /etc/kernel/postinst.d from its postinst (run-parts --exit-on-error, the
    kernel-img hook convention), linux-headers-<abi>-<flavour> makes
    /lib/modules/<release>/build and runs /etc/kernel/header_postinst.d; the
    flavour's metapackages (meta=True) depend on this ABI."""
    release = f"{abi}-{flavour}"
    image = FakePackage(f"linux-image-{release}", version, f"Linux {release} (TEST FAKE: no kernel)",
                        files={f"/boot/vmlinuz-{release}": ("text", f"TEST FAKE kernel {release}\n"),
                               f"/lib/modules/{release}/modules.order": ("text", "")},
                        postinst_script=_run_kernel_hooks("postinst.d", release), section="kernel")
    headers = FakePackage(f"linux-headers-{release}", version, f"Header files for Linux {release} (TEST FAKE)",
                          files={f"/usr/src/linux-headers-{release}/Makefile": ("text", "# TEST FAKE headers\n"),
                                 f"/lib/modules/{release}/build": ("link", f"/usr/src/linux-headers-{release}")},
                          postinst_script=_run_kernel_hooks("header_postinst.d", release), section="kernel")
    packages = [image, headers]
    if meta:
        packages += [
            FakePackage(f"linux-image-{flavour}", version, f"Linux for {flavour} (meta-package, TEST FAKE)",
                        depends=[f"linux-image-{release} (= {version})"],
                        files={f"/usr/share/doc/linux-image-{flavour}/TEST-FAKE": _doc(f"linux-image-{flavour}")}),
            FakePackage(f"linux-headers-{flavour}", version, f"Header files for Linux {flavour} (meta-package, TEST FAKE)",
                        depends=[f"linux-headers-{release} (= {version})"],
                        files={f"/usr/share/doc/linux-headers-{flavour}/TEST-FAKE": _doc(f"linux-headers-{flavour}")}),
        ]
    return packages


def default_repos(driver_versions: Sequence[str] = DRIVER_VERSIONS,
                  toolkit_versions: Sequence[str] = TOOLKIT_VERSIONS,
                  k8s_versions: Sequence[str] = K8S_VERSIONS,
                  gpu_model: str = "NVIDIA H100 80GB HBM3", gpu_count: int = 8) -> list[RepoSpec]:
    """The three upstream repositories, one k8s repo per minor version."""
    repos = [
        RepoSpec("cuda", "compute/cuda/repos/debian12/x86_64", "NVIDIA", "NVIDIA CUDA",
                 [p for v in driver_versions for p in cuda_packages(v, gpu_model, gpu_count)]),
        RepoSpec("nvidia-container-toolkit", "libnvidia-container/stable/deb/amd64",
                 "https://nvidia.github.io/libnvidia-container", "libnvidia-container",
                 [p for v in toolkit_versions for p in toolkit_packages(v, gpu_count)]),
    ]
    repos += [
        RepoSpec("docker", "linux/debian", "Docker", "Docker CE", containerd_packages(_runtime_bin())),
        # A Debian kernel flavour's packages before and after a kernel update
        # (tests/ansible/test_kernel_update.py adds the second to a host later).
        RepoSpec("debian-kernel", "debian-kernel", "Debian", "Debian kernel (TEST FAKE)",
                 kernel_packages(KERNEL_ABIS[0], "6.1.500-1")),
        RepoSpec("debian-kernel-update", "debian-kernel-update", "Debian", "Debian kernel update (TEST FAKE)",
                 kernel_packages(KERNEL_ABIS[1], "6.1.501-1")
                 + kernel_packages(KERNEL_ABIS[2], "6.1.502-1", meta=False)),
    ]
    minors: dict[str, list[str]] = {}
    for v in k8s_versions:
        minors.setdefault(".".join(v.split(".")[:2]), []).append(v)
    for minor, versions in minors.items():
        seen: set[tuple[str, str]] = set()
        pkgs = []
        for v in versions:
            for p in k8s_packages(v):
                if (p.name, p.version) not in seen:  # cri-tools/cni shared by patch releases
                    seen.add((p.name, p.version))
                    pkgs.append(p)
        repos.append(RepoSpec(f"kubernetes-v{minor}", f"core:/stable:/v{minor}/deb",
                              f"obs://build.opensuse.org/isv:kubernetes:core:stable:v{minor}/deb",
                              f"isv:kubernetes:core:stable:v{minor}", pkgs))
    return repos


# --------------------------------------------------------------------------
# maintainer scripts (what debhelper generates for units)
# --------------------------------------------------------------------------

def _postinst(pkg: FakePackage) -> str:
    lines = ["#!/bin/sh", "# TEST FAKE maintainer script (debhelper-style unit handling)", "set -e",
             "mkdir -p /var/log/corral-fakes"]
    if pkg.postinst_script:
        lines += ['if [ "$1" = "configure" ]; then', pkg.postinst_script.rstrip("\n"), "fi"]
    managed = pkg.units + pkg.disabled_units
    if not managed:
        return "\n".join(lines) + "\nexit 0\n"
    lines.append('if [ "$1" = "configure" ] || [ "$1" = "abort-upgrade" ] || '
                 '[ "$1" = "abort-deconfigure" ] || [ "$1" = "abort-remove" ]; then')
    for u in pkg.units:
        lines += [f"\tdeb-systemd-helper unmask '{u}' >/dev/null || true",
                  f"\tif deb-systemd-helper --quiet was-enabled '{u}'; then",
                  f"\t\tdeb-systemd-helper enable '{u}' >/dev/null || true",
                  "\telse",
                  f"\t\tdeb-systemd-helper update-state '{u}' >/dev/null || true",
                  "\tfi"]
    for u in pkg.disabled_units:
        lines += [f"\tdeb-systemd-helper update-state '{u}' >/dev/null || true"]
    lines += ["\tif [ -d /run/systemd/system ]; then",
              "\t\tsystemctl --system daemon-reload >/dev/null || true"]
    if pkg.units and not pkg.no_start:
        lines += ['\t\tif [ -n "$2" ]; then _dh_action=restart; else _dh_action=start; fi']
        lines += [f"\t\tdeb-systemd-invoke $_dh_action '{u}' >/dev/null || true" for u in pkg.units]
    lines += ["\tfi", "fi", "exit 0"]
    return "\n".join(lines) + "\n"


def _prerm(pkg: FakePackage) -> str | None:
    managed = pkg.units + pkg.disabled_units
    if not managed:
        return None
    body = "\n".join(f"\tdeb-systemd-invoke stop '{u}' >/dev/null || true" for u in managed)
    return ("#!/bin/sh\nset -e\n"
            f'if [ -d /run/systemd/system ] && [ "$1" = remove ]; then\n{body}\nfi\nexit 0\n')


def _postrm(pkg: FakePackage) -> str | None:
    managed = pkg.units + pkg.disabled_units
    if not managed:
        return None
    purge = "\n".join(f"\t\tdeb-systemd-helper purge '{u}' >/dev/null || true\n"
                      f"\t\tdeb-systemd-helper unmask '{u}' >/dev/null || true" for u in managed)
    return ("#!/bin/sh\nset -e\n"
            'if [ -d /run/systemd/system ] && [ "$1" = remove ]; then\n'
            "\tsystemctl --system daemon-reload >/dev/null || true\nfi\n"
            'if [ "$1" = "purge" ]; then\n\tif [ -x "/usr/bin/deb-systemd-helper" ]; then\n'
            f"{purge}\n\tfi\nfi\nexit 0\n")


@functools.lru_cache(maxsize=None)
def _fake_source(name: str) -> str:
    return (FAKEPKGS / "bin" / name).read_text()


def render_fake(program: str, build: dict) -> str:
    """A fake program's final text: shared plumbing inlined, constants baked in."""
    common = (FAKEPKGS / "_common.py").read_text()
    common = re.sub(r"^BUILD = \{\}  # @@BUILD@@.*$", lambda _: "BUILD = " + repr(dict(sorted(build.items()))),
                    common, count=1, flags=re.M)
    return _fake_source(program).replace("# @@COMMON@@", common.rstrip("\n"), 1)


# --------------------------------------------------------------------------
# the repository
# --------------------------------------------------------------------------

class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    server_version = "corral-hostlab-apt/1"

    def log_message(self, fmt, *args):  # keep test output clean; record instead
        self.server.requests.append(f"{self.command} {self.path} {args[1] if len(args) > 1 else ''}")


class AptRepo:
    """Build, sign and serve the fake repositories.

    ``AptRepo(lab, driver_versions=(...), toolkit_versions=(...),
    k8s_versions=(...)).build().serve()``; then :meth:`url`,
    :meth:`sources_line`, :attr:`keyring_path` / :attr:`key_armored` give a
    role test what it needs, and :meth:`configure_host` does it by hand.
    """

    def __init__(self, lab: Lab | None = None, *,
                 driver_versions: Sequence[str] = DRIVER_VERSIONS,
                 toolkit_versions: Sequence[str] = TOOLKIT_VERSIONS,
                 k8s_versions: Sequence[str] = K8S_VERSIONS,
                 gpu_model: str = "NVIDIA H100 80GB HBM3", gpu_count: int = 8,
                 repos: Sequence[RepoSpec] | None = None,
                 cache_dir: str | os.PathLike | None = None, port: int = 0):
        self.lab = lab
        cfg = lab.config if lab else LabConfig()
        self.cache_dir = Path(cache_dir) if cache_dir else cfg.cache_dir
        self.repos = list(repos) if repos is not None else default_repos(
            driver_versions, toolkit_versions, k8s_versions, gpu_model, gpu_count)
        self.port = port
        self.root: Path | None = None
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.timings: dict[str, float] = {}

    # -- key ---------------------------------------------------------------
    @property
    def gnupghome(self) -> Path:
        return self.cache_dir / "gpg"

    @property
    def keyring_path(self) -> Path:
        """Binary keyring for ``signed-by=`` (copy it to the host)."""
        return self.gnupghome / KEYRING_NAME

    @property
    def key_armored(self) -> str:
        """ASCII-armored public key, e.g. for a role's key variable."""
        return (self.gnupghome / "corral-hostlab-archive-key.asc").read_text()

    @property
    def key_armored_path(self) -> Path:
        return self.gnupghome / "corral-hostlab-archive-key.asc"

    def _gpg(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return _run(["gpg", "--homedir", str(self.gnupghome), "--batch", "--yes",
                     "--pinentry-mode", "loopback", "--passphrase", "", *args],
                    timeout=timeout, what="gpg")

    def _stop_agent(self) -> None:
        """gpg starts an agent per homedir; stop it so no process is left behind."""
        _run(["gpgconf", "--homedir", str(self.gnupghome), "--kill", "all"], check=False, timeout=20)

    def ensure_key(self) -> str:
        """Generate the repository signing key once; return its fingerprint."""
        home = self.gnupghome
        fpr_file = home / "fingerprint"
        if fpr_file.exists() and self.keyring_path.exists():
            return fpr_file.read_text().strip()
        # Workers racing on an empty cache would each make a key in one homedir.
        with _flock(self.cache_dir / ".gpg.lock"):
            if fpr_file.exists() and self.keyring_path.exists():
                return fpr_file.read_text().strip()
            return self._generate_key(home, fpr_file)

    def _generate_key(self, home: Path, fpr_file: Path) -> str:
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(home, 0o700)
        try:
            self._gpg("--quick-generate-key", "corral hostlab TEST repository <hostlab@corral.invalid>",
                      "ed25519", "sign", "never")
            res = self._gpg("--with-colons", "--list-secret-keys")
            fpr = next(line.split(":")[9] for line in res.stdout.splitlines() if line.startswith("fpr:"))
            self._gpg("--output", str(self.keyring_path), "--export", fpr)
            self._gpg("--armor", "--output", str(self.key_armored_path), "--export", fpr)
        finally:
            self._stop_agent()
        tmp = fpr_file.with_suffix(".tmp")
        tmp.write_text(fpr + "\n")
        tmp.rename(fpr_file)
        return fpr

    # -- build -------------------------------------------------------------
    def _recipe_hash(self, fpr: str) -> str:
        h = hashlib.sha256()
        h.update(f"{REPO_RECIPE_VERSION}:{fpr}".encode())
        for repo in self.repos:
            h.update(json.dumps(dataclasses.asdict(repo), sort_keys=True).encode())
        for f in sorted(FAKEPKGS.rglob("*")):
            if f.is_file():
                h.update(f.relative_to(FAKEPKGS).as_posix().encode())
                h.update(f.read_bytes())
        return h.hexdigest()[:16]

    def build(self) -> "AptRepo":
        """Build every package, index and sign each repo.  Cached by recipe hash."""
        t0 = time.monotonic()
        fpr = self.ensure_key()
        out = self.cache_dir / f"aptrepo-{self._recipe_hash(fpr)}"
        with _flock(self.cache_dir / ".aptrepo.lock"):
            if not (out / ".complete").exists():
                tmp = Path(tempfile.mkdtemp(prefix="aptrepo-", dir=self.cache_dir))
                try:
                    for repo in self.repos:
                        self._build_repo(repo, tmp / repo.path, fpr)
                    (tmp / ".complete").write_text("")
                    if out.exists():
                        shutil.rmtree(out)
                    tmp.rename(out)
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
                    self._stop_agent()
            os.utime(out)  # mark as recently used for _prune_old_repos
            self._prune_old_repos(keep=out)
        self.root = out
        self.timings["build"] = time.monotonic() - t0
        return self

    def _prune_old_repos(self, keep: Path, max_age_days: float = 2) -> None:
        """Delete builds of other recipes unused for a while (each edit of a
        fake makes a new one); recent ones may belong to a concurrent session."""
        cutoff = time.time() - max_age_days * 86400
        for d in self.cache_dir.glob("aptrepo-*"):
            if d != keep and d.is_dir() and d.stat().st_mtime < cutoff:
                shutil.rmtree(d, ignore_errors=True)

    def _build_repo(self, repo: RepoSpec, dest: Path, fpr: str) -> None:
        dest.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="fakepkg-") as stage_root:
            for pkg in repo.packages:
                self._build_deb(pkg, Path(stage_root) / f"{pkg.name}_{pkg.version}", dest)
        # run in the repo dir so Filename: fields are relative (flat repo)
        pkgs = subprocess.run(["apt-ftparchive", "packages", "."], cwd=dest,
                              capture_output=True, text=True, timeout=120)
        if pkgs.returncode != 0:
            raise LabError(f"apt-ftparchive packages failed in {dest}: {pkgs.stderr}")
        (dest / "Packages").write_text(pkgs.stdout)
        _run(["gzip", "-9kf", str(dest / "Packages")])
        rel = subprocess.run(
            ["apt-ftparchive",
             "-o", f"APT::FTPArchive::Release::Origin={repo.origin}",
             "-o", f"APT::FTPArchive::Release::Label={repo.label}",
             "-o", "APT::FTPArchive::Release::Architectures=amd64 all",
             "-o", "APT::FTPArchive::Release::Description=corral hostlab TEST FAKE repository",
             "release", "."], cwd=dest, capture_output=True, text=True, timeout=60)
        if rel.returncode != 0:
            raise LabError(f"apt-ftparchive release failed in {dest}: {rel.stderr}")
        (dest / "Release").write_text(rel.stdout)
        self._gpg("--local-user", fpr, "--clearsign", "--output", str(dest / "InRelease"),
                  str(dest / "Release"))
        self._gpg("--local-user", fpr, "--armor", "--detach-sign", "--output",
                  str(dest / "Release.gpg"), str(dest / "Release"))

    def _build_deb(self, pkg: FakePackage, stage: Path, dest: Path) -> None:
        debian = stage / "DEBIAN"
        debian.mkdir(parents=True)
        for path, (kind, src) in pkg.files.items():
            target = stage / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            if kind == "link":
                target.symlink_to(src)
            elif kind == "fake":
                target.write_text(render_fake(src, pkg.build))
                target.chmod(0o755)
            elif kind == "file":
                shutil.copyfile(FAKEPKGS / src, target)
                target.chmod(0o644)
            elif kind == "program":
                shutil.copyfile(src, target)
                target.chmod(0o755)
            else:
                target.write_text(src)
                target.chmod(0o755 if kind == "exec" else 0o644)
        fields = [("Package", pkg.name), ("Version", pkg.version), ("Architecture", "amd64"),
                  ("Maintainer", "corral hostlab <hostlab@corral.invalid>"),
                  ("Section", pkg.section), ("Priority", "optional"),
                  ("Depends", ", ".join(pkg.depends)), ("Recommends", ", ".join(pkg.recommends)),
                  ("Provides", ", ".join(pkg.provides)), ("Conflicts", ", ".join(pkg.conflicts)),
                  ("Replaces", ", ".join(pkg.replaces)),
                  ("Homepage", "https://example.invalid/corral-hostlab-test-fake"),
                  ("Description", f"{pkg.description}\n TEST FAKE built by corral's hostlab for "
                                  "role tests; it is not the real software.")]
        (debian / "control").write_text("".join(f"{k}: {v}\n" for k, v in fields if v))
        for script, text in (("postinst", _postinst(pkg)), ("prerm", _prerm(pkg)),
                             ("postrm", _postrm(pkg))):
            if text:
                (debian / script).write_text(text)
                (debian / script).chmod(0o755)
        if pkg.conffiles:
            (debian / "conffiles").write_text("".join(c + "\n" for c in pkg.conffiles))
        _run(["dpkg-deb", "--root-owner-group", "-Zgzip", "-z1", "--build", str(stage),
              str(dest / f"{pkg.name}_{pkg.version}_amd64.deb")], timeout=60, what="dpkg-deb")

    # -- serve -------------------------------------------------------------
    def serve(self, bind: str | None = None, port: int | None = None) -> "AptRepo":
        """Serve the built repos over HTTP (a thread) on the lab bridge address."""
        if self.root is None:
            self.build()
        if self._server is not None:
            return self
        if bind is None:
            if self.lab is None:
                raise LabError("AptRepo.serve needs a lab (to bind on its bridge) or bind=")
            self.lab.start()
            bind = self.lab.gateway
        handler = functools.partial(_QuietHandler, directory=str(self.root))
        server = http.server.ThreadingHTTPServer((bind, self.port if port is None else port), handler)
        server.daemon_threads = True
        server.requests = []  # type: ignore[attr-defined]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="hostlab-aptrepo",
                                        kwargs={"poll_interval": 0.2}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving (idempotent)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> "AptRepo":
        return self.build().serve()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def requests(self) -> list[str]:
        """Request lines served so far ("GET /path 200"), for assertions."""
        return list(self._server.requests) if self._server else []  # type: ignore[attr-defined]

    @property
    def base_url(self) -> str:
        if self._server is None:
            raise LabError("the apt repo is not being served; call serve() first")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def repo(self, name: str) -> RepoSpec:
        for r in self.repos:
            if r.name == name or (name == "kubernetes" and r.name.startswith("kubernetes-")):
                return r
        raise LabError(f"no repo {name!r}; have {[r.name for r in self.repos]}")

    def url(self, name: str = "cuda") -> str:
        """URL of one repo (``cuda``, ``nvidia-container-toolkit``, ``kubernetes-v1.31``)."""
        return f"{self.base_url}/{self.repo(name).path}/"

    def sources_line(self, name: str, keyring: str = f"/usr/share/keyrings/{KEYRING_NAME}") -> str:
        """A one-line ``deb [signed-by=...] URL /`` entry for a flat repo."""
        return f"deb [signed-by={keyring}] {self.url(name)} /"

    def configure_host(self, host: Host, repos: Iterable[str] | None = None, *,
                       keyring: str = f"/usr/share/keyrings/{KEYRING_NAME}",
                       update: bool = True) -> None:
        """Install the keyring and a sources list on a host (what a role would do)."""
        names = list(repos) if repos is not None else [r.name for r in self.repos]
        host.path(keyring).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self.keyring_path, host.path(keyring))
        os.chmod(host.path(keyring), 0o644)
        sources = "".join(self.sources_line(n, keyring) + "\n" for n in names)
        host.path("/etc/apt/sources.list.d/corral-hostlab.list").write_text(
            "# written by the corral hostlab (TEST FAKE repositories)\n" + sources)
        if update:
            host.run("apt-get update -q -o Dir::Etc::sourcelist=sources.list.d/corral-hostlab.list "
                     "-o Dir::Etc::sourceparts=- -o APT::Get::List-Cleanup=0", timeout=120)

    def packages(self) -> list[tuple[str, str, str]]:
        """(repo, package, version) of everything built."""
        return [(r.name, p.name, p.version) for r in self.repos for p in r.packages]
