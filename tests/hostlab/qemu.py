"""Slow tier: a real Debian bookworm kernel under qemu (TCG) for kernel-level role tests.

The systemd-nspawn hosts of :mod:`tests.hostlab.lab` share this machine's
kernel, so ``modprobe``, ``net.ipv4.neigh.default.gc_thresh*``, ``vm.*`` and
RDMA links cannot be exercised there.  This module boots ONE (or a few)
throwaway VMs with their own kernel instead, under software emulation (KVM
does not run guests on the test machine; /work/shared/TESTHOSTS.md, "qemu
under TCG"):

* **Image** (:class:`QemuImage`).  The lab's cached debootstrap base
  (``base-<hash>.tar.zst``, :meth:`Lab.ensure_base`) is unpacked into a build
  dir, :data:`VM_PACKAGES` (kernel, initramfs-tools, rdma-core, ...) are
  installed in a chroot from the Debian mirror, the image is made bootable as
  a VM (DHCP on the NIC, fixed resolver, fstab, ssh host keys, hostname), the
  kernel and initrd are copied out of ``/boot`` and the tree is written into
  a sparse ext4 disk with ``mkfs.ext4 -d`` (no loop devices, no mounts of
  the image).  Cached as ``$CACHE/qemu-<hash>/`` (``disk.raw``, ``vmlinuz``,
  ``initrd.img``, ``recipe.json``); the hash covers the lab base's key, the
  package list, the mirror and :data:`QEMU_RECIPE_VERSION`.  Images of other
  recipes are pruned when a new one is built.
* **VM** (:class:`VM`).  A qcow2 overlay on the cached raw disk (the cache
  stays pristine; every VM starts from the same disk), then
  ``qemu-system-x86_64 -accel tcg,thread=multi,tb-size=128 -cpu max -m 1024
  -smp 2 -kernel vmlinuz -initrd initrd.img -append "root=/dev/vda rw
  console=ttyS0"``, a virtio disk, a virtio-net NIC on ``-netdev user`` with
  ``hostfwd=tcp:127.0.0.1:PORT-:22``, serial console to ``console.log``,
  started in its own session (``setsid``) with ``-pidfile``.  Ready when
  ``ssh root@127.0.0.1 -p PORT systemctl is-system-running --wait`` answers
  ``running`` (or ``degraded``, with the failed units listed).  The NIC keeps
  its predictable name (``ens3`` for virtio-net on slot 3 of the i440fx
  machine); :attr:`VM.nic` is read from the guest's default route.
* **Stop.**  ``systemctl poweroff`` over ssh and wait for qemu to exit; then
  ACPI ``system_powerdown`` on the monitor socket; then SIGTERM; then
  SIGKILL.  The per-VM run dir (``$CORRAL_HOSTLAB_QEMU_RUN/<name>``, default
  ``/run/corral-hostlab-qemu``) records ``owner.pid`` and ``qemu.pid``: a VM
  whose test process died is killed and removed by the next :class:`VM`
  start or :func:`cleanup_all` (``python -m tests.hostlab.qemu cleanup``).

Packages needed on the test machine (besides the lab's): ``qemu-system-x86``
(pulls ``seabios``, ``ipxe-qemu``), ``qemu-utils`` (``qemu-img``) and
``e2fsprogs`` (``mkfs.ext4 -d``, always present on Debian).

Command line: ``python -m tests.hostlab.qemu {build,boot,cleanup}``.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import logging
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from .lab import (
    Lab,
    LabConfig,
    LabError,
    _flock,
    _install_sigterm_handler,
    _mounted_under,
    _pid_alive,
    _run,
    _umount,
    _write,
)

log = logging.getLogger("corral.hostlab.qemu")

#: Bump when the image customisation below changes in a way the package list
#: does not capture; it is part of the cache key.
QEMU_RECIPE_VERSION = 1

#: Installed on top of the lab base.  The first line is what the VM needs to
#: boot and be reached (kernel, initramfs, udev comes with initramfs-tools);
#: the second what the kernel-level roles use (RDMA userspace, ``rdma``/``dcb``
#: from iproute2); the third what the roles would otherwise install over the
#: network at every test run (roce: perftest; node_base: chrony), so a run
#: needs no mirror access from inside the VM.
VM_PACKAGES: tuple[str, ...] = (
    "linux-image-amd64",
    "initramfs-tools",
    "kmod",
    "openssh-server",
    "python3",
    "iproute2",
    "rdma-core",
    "ibverbs-utils",
    "ibverbs-providers",
    "perftest",
    "chrony",
)

#: Size of the (sparse) ext4 disk; the root uses ~700 MB.
DISK_SIZE = "3G"

DEFAULT_RUN = "/run/corral-hostlab-qemu"
QEMU = "qemu-system-x86_64"

#: Default guest shape; TESTHOSTS.md measured ~17 s to SSH with these.
DEFAULT_MEMORY_MB = 1024
DEFAULT_SMP = 2
DEFAULT_APPEND = "root=/dev/vda rw console=ttyS0"


def available() -> tuple[bool, str]:
    """Can this machine build and boot the qemu tier?  ``(ok, reason)``."""
    if sys.platform != "linux":
        return False, f"the qemu tier needs Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return (
            False,
            "the qemu tier needs root (debootstrap, chroot, mounts for the image build)",
        )
    tools = {
        QEMU: "qemu-system-x86",
        "qemu-img": "qemu-utils",
        "mkfs.ext4": "e2fsprogs",
        "debootstrap": "debootstrap",
        "chroot": "coreutils",
        "ssh": "openssh-client",
        "ssh-keygen": "openssh-client",
        "tar": "tar",
        "zstd": "zstd",
    }
    missing = sorted({pkg for tool, pkg in tools.items() if shutil.which(tool) is None})
    if missing:
        return False, (
            "qemu tier tools missing (Debian packages: "
            + " ".join(missing)
            + "); apt-get install --no-install-recommends "
            + " ".join(missing)
        )
    return True, "ok"


def _sha(obj: object) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


# --------------------------------------------------------------------------
# image
# --------------------------------------------------------------------------


class QemuImage:
    """The cached bootable disk + kernel + initrd, built from the lab base."""

    def __init__(
        self, config: LabConfig | None = None, packages: Sequence[str] = VM_PACKAGES
    ):
        self.config = config or LabConfig()
        self.lab = Lab(self.config)  # only for its base image and ssh key
        self.packages = tuple(sorted(set(packages)))
        self.timings: dict[str, float] = {}
        self._dir: Path | None = None

    @property
    def key_path(self) -> Path:
        return self.lab.key_path

    def recipe(self) -> dict:
        return {
            "version": QEMU_RECIPE_VERSION,
            "base": self.lab.base_key(),
            "packages": list(self.packages),
            "mirror": self.config.mirror,
            "suite": self.config.suite,
            "disk_size": DISK_SIZE,
        }

    def key(self) -> str:
        return _sha(self.recipe())

    @property
    def dir(self) -> Path:
        if self._dir is None:
            raise LabError("call QemuImage.ensure() first")
        return self._dir

    @property
    def disk(self) -> Path:
        return self.dir / "disk.raw"

    @property
    def kernel(self) -> Path:
        return self.dir / "vmlinuz"

    @property
    def initrd(self) -> Path:
        return self.dir / "initrd.img"

    def ensure(self) -> QemuImage:
        """Build the image unless a complete one of this recipe is cached."""
        cache = self.config.cache_dir
        cache.mkdir(parents=True, exist_ok=True)
        key = self.key()
        out = cache / f"qemu-{key}"
        with _flock(cache / ".qemu.lock"):
            if not (out / "recipe.json").exists():
                t0 = time.monotonic()
                self._build(out)
                self.timings["image_build"] = time.monotonic() - t0
                self._prune(keep=out.name)
        self._dir = out
        return self

    def _prune(self, keep: str) -> None:
        for p in self.config.cache_dir.glob("qemu-*"):
            if p.name != keep and p.is_dir():
                log.info("qemu: removing old image %s", p)
                shutil.rmtree(p, ignore_errors=True)

    def _build(self, out: Path) -> None:
        cache = self.config.cache_dir
        build = cache / f"{out.name}.build"
        root = build / "root"
        if build.exists():
            for mnt in _mounted_under(build):
                _umount(mnt)
            shutil.rmtree(build)
        root.mkdir(parents=True)
        # 1. the lab base (debootstrap of bookworm + systemd, sshd, python3, ...)
        t0 = time.monotonic()
        base_root = self.lab.ensure_base()  # builds it (~60 s) if no cached base
        tarball = base_root.with_name(base_root.name + ".tar.zst")
        if tarball.exists():
            _run(
                [
                    "tar",
                    "--numeric-owner",
                    "--xattrs",
                    "--xattrs-include=*",
                    "-I",
                    "zstd -T0",
                    "-xpf",
                    str(tarball),
                    "-C",
                    str(root),
                ],
                timeout=300,
                what="unpack lab base",
            )
        else:
            _run(
                ["cp", "-a", f"{base_root}/.", str(root)],
                timeout=300,
                what="copy lab base",
            )
        (root / ".corral-hostlab-complete").unlink(missing_ok=True)
        self.timings["image_base"] = time.monotonic() - t0
        # 2. packages, in a chroot with /proc, /sys, /dev
        t0 = time.monotonic()
        logfile = build.with_suffix(".log")
        try:
            self._chroot_install(root, logfile)
        finally:
            for mnt in _mounted_under(root):
                _umount(mnt)
        self.timings["image_packages"] = time.monotonic() - t0
        # 3. make it a VM
        self._customise(root)
        staging = cache / f"{out.name}.staging"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        kernels = sorted((root / "boot").glob("vmlinuz-*"))
        initrds = sorted((root / "boot").glob("initrd.img-*"))
        if not kernels or not initrds:
            raise LabError(
                f"no kernel/initrd in {root}/boot after installing linux-image-amd64; "
                f"log: {logfile}"
            )
        shutil.copy2(kernels[-1], staging / "vmlinuz")
        shutil.copy2(initrds[-1], staging / "initrd.img")
        # 4. ext4 disk straight from the directory (no loop device, no mount)
        t0 = time.monotonic()
        _run(
            [
                "mkfs.ext4",
                "-q",
                "-F",
                "-L",
                "corral-root",
                "-E",
                "root_owner=0:0",
                "-d",
                str(root),
                str(staging / "disk.raw"),
                DISK_SIZE,
            ],
            timeout=600,
            what="mkfs.ext4 -d",
        )
        self.timings["image_mkfs"] = time.monotonic() - t0
        recipe = dict(
            self.recipe(),
            kernel=kernels[-1].name,
            built=time.strftime("%F %T"),
            timings={k: round(v, 1) for k, v in self.timings.items()},
        )
        (staging / "recipe.json").write_text(json.dumps(recipe, indent=1) + "\n")
        shutil.rmtree(out, ignore_errors=True)
        staging.rename(out)
        if _mounted_under(build):
            raise LabError(f"{build} still has mounts; not deleting it")
        shutil.rmtree(build)
        log.info("qemu image built: %s (%s)", out, kernels[-1].name)

    def _chroot_install(self, root: Path, logfile: Path) -> None:
        for src, dst, fstype in (("proc", "proc", "proc"), ("sysfs", "sys", "sysfs")):
            _run(["mount", "-t", fstype, src, str(root / dst)], what=f"mount {dst}")
        _run(["mount", "--bind", "/dev", str(root / "dev")], what="bind /dev")
        _run(
            ["mount", "--bind", "/dev/pts", str(root / "dev/pts")], what="bind /dev/pts"
        )
        resolv = root / "etc/resolv.conf"
        if resolv.is_symlink() or resolv.exists():
            resolv.unlink()
        shutil.copy2("/etc/resolv.conf", resolv)
        # no daemons started inside the chroot
        _write(root / "usr/sbin/policy-rc.d", "#!/bin/sh\nexit 101\n", 0o755)
        env = {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "DEBIAN_FRONTEND": "noninteractive",
            "LC_ALL": "C.UTF-8",
            "HOME": "/root",
        }
        _write(
            root / "etc/apt/sources.list",
            f"deb {self.config.mirror} {self.config.suite} main\n",
        )
        with open(logfile, "w") as fh:
            for cmd in (
                ["apt-get", "update"],
                ["apt-get", "install", "-y", "--no-install-recommends", *self.packages],
            ):
                fh.write(f"$ {shlex.join(cmd)}\n")
                fh.flush()
                try:
                    res = subprocess.run(
                        ["chroot", str(root), *cmd],
                        check=False,
                        stdout=fh,
                        stderr=subprocess.STDOUT,
                        env=env,
                        timeout=1800,
                    )
                except subprocess.TimeoutExpired as exc:
                    raise LabError(
                        f"{shlex.join(cmd)} in the image chroot timed out; "
                        f"log: {logfile}"
                    ) from exc
                if res.returncode != 0:
                    tail = "\n".join(logfile.read_text().splitlines()[-20:])
                    raise LabError(
                        f"{shlex.join(cmd)} in the image chroot failed "
                        f"(exit {res.returncode}, mirror {self.config.mirror}); "
                        f"log: {logfile}\n{tail}"
                    )
        (root / "usr/sbin/policy-rc.d").unlink()
        for deb in (root / "var/cache/apt/archives").glob("*.deb"):
            deb.unlink()

    def _customise(self, root: Path) -> None:
        """Turn the container template into a bootable VM disk."""
        pub = Path(str(self.key_path) + ".pub").read_text()
        _write(root / "root/.ssh/authorized_keys", pub, 0o600)
        os.chmod(root / "root/.ssh", 0o700)
        _write(
            root / "etc/fstab",
            "# corral qemu tier: root is /dev/vda (whole disk, ext4)\n"
            "/dev/vda / ext4 rw,errors=remount-ro 0 1\n",
        )
        _write(root / "etc/hostname", "corral-qemu\n")
        _write(
            root / "etc/hosts",
            "127.0.0.1\tlocalhost\n127.0.1.1\tcorral-qemu\n"
            "::1\tlocalhost ip6-localhost ip6-loopback\n",
        )
        # qemu's user network: DHCP 10.0.2.15/24, gateway 10.0.2.2, DNS 10.0.2.3
        resolv = root / "etc/resolv.conf"
        if resolv.is_symlink() or resolv.exists():
            resolv.unlink()
        _write(
            resolv, "# corral qemu tier: qemu user-network DNS\nnameserver 10.0.2.3\n"
        )
        _write(
            root / "etc/systemd/network/20-corral-qemu.network",
            "# corral qemu tier: DHCP from qemu's user network on the virtio NIC\n"
            "[Match]\nName=en* eth*\n\n[Network]\nDHCP=ipv4\nLinkLocalAddressing=no\n"
            "IPv6AcceptRA=no\n",
        )
        # one fixed identity per image (a VM is a throwaway copy; avoids the
        # first-boot path of an empty machine-id on every boot)
        (root / "etc/machine-id").write_text(uuid.uuid4().hex + "\n")
        for kind in ("ed25519", "ecdsa"):
            key = root / f"etc/ssh/ssh_host_{kind}_key"
            if not key.exists():
                _run(
                    [
                        "ssh-keygen",
                        "-q",
                        "-t",
                        kind,
                        "-N",
                        "",
                        "-C",
                        "root@corral-qemu",
                        "-f",
                        str(key),
                    ],
                    what="ssh-keygen",
                )
        _write(
            root / "etc/ssh/sshd_config.d/05-corral-qemu-hostkeys.conf",
            "# corral qemu tier: only these host keys exist\n"
            "HostKey /etc/ssh/ssh_host_ed25519_key\nHostKey /etc/ssh/ssh_host_ecdsa_key\n",
        )
        # nobody waits for a "network online" that the tests do not need
        _run(
            [
                "systemctl",
                f"--root={root}",
                "mask",
                "systemd-networkd-wait-online.service",
            ],
            check=False,
            what="mask wait-online",
        )


# --------------------------------------------------------------------------
# VM
# --------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _is_our_qemu(pid: int, vm_dir: Path) -> bool:
    """True if ``pid`` is a qemu started for ``vm_dir`` (never kill a reused pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return (
        bool(cmdline)
        and Path(cmdline[0].decode(errors="replace")).name == QEMU
        and any(str(vm_dir).encode() in a for a in cmdline)
    )


class VM:
    """One throwaway VM booted from a :class:`QemuImage`.

    Attributes tests use: ``port`` (ssh on 127.0.0.1), ``nic`` (the guest's
    default-route interface, e.g. ``ens3``), ``dir`` (run dir with
    ``console.log``), ``timings``.
    """

    def __init__(
        self,
        image: QemuImage,
        name: str = "vm1",
        *,
        memory_mb: int = DEFAULT_MEMORY_MB,
        smp: int = DEFAULT_SMP,
        append: str = DEFAULT_APPEND,
        boot_timeout: float = 300.0,
        run_dir: str | os.PathLike | None = None,
    ):
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,30}", name):
            raise LabError(f"bad VM name {name!r}")
        self.image = image
        self.name = name
        self.memory_mb = memory_mb
        self.smp = smp
        self.append = append
        self.boot_timeout = boot_timeout
        self.run_root = Path(
            run_dir or os.environ.get("CORRAL_HOSTLAB_QEMU_RUN", DEFAULT_RUN)
        )
        self.dir = self.run_root / name
        self.port: int | None = None
        self.proc: subprocess.Popen | None = None
        self.nic: str | None = None
        self.timings: dict[str, float] = {}
        self.failed_units: list[str] = []
        self._atexit = False
        self.stopped_by: str | None = None

    def __repr__(self) -> str:
        return f"<VM {self.name} 127.0.0.1:{self.port} {'running' if self.running else 'stopped'}>"

    def __enter__(self) -> VM:  # noqa: PYI034
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # -- ssh ----------------------------------------------------------------
    @property
    def control_path(self) -> str:
        # unix socket paths must fit in 108 bytes: keep it short
        return f"/tmp/.corral-qemu-cm-{self.name}-%C"

    def ssh_options(self) -> list[str]:
        return [
            "-i",
            str(self.image.key_path),
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "LogLevel=ERROR",
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=10",
            "-o",
            "ServerAliveInterval=10",
            "-o",
            "ServerAliveCountMax=6",
            "-o",
            "ControlMaster=auto",
            "-o",
            f"ControlPath={self.control_path}",
            "-o",
            "ControlPersist=120s",
        ]

    @property
    def ssh_args(self) -> list[str]:
        return ["ssh", *self.ssh_options(), "-p", str(self.port), "root@127.0.0.1"]

    def run(
        self, command: str | Sequence[str], *, check: bool = True, timeout: float = 300
    ) -> subprocess.CompletedProcess:
        """Run a shell command in the VM over ssh as root."""
        cmd = command if isinstance(command, str) else shlex.join(command)
        return _run(
            self.ssh_args + [cmd], timeout=timeout, check=check, what=f"ssh {self.name}"
        )

    def inventory_vars(self) -> dict:
        """Ansible connection variables for this VM."""
        opts = [
            o for o in self.ssh_options() if o not in ("-i", str(self.image.key_path))
        ]
        return {
            "ansible_host": "127.0.0.1",
            "ansible_port": self.port,
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(self.image.key_path),
            "ansible_ssh_common_args": shlex.join(opts),
            "ansible_python_interpreter": "/usr/bin/python3",
            "ansible_ssh_pipelining": True,
        }

    # -- lifecycle ----------------------------------------------------------
    def qemu_argv(self) -> list[str]:
        img = self.image
        return [
            QEMU,
            "-name",
            f"corral-{self.name}",
            "-accel",
            "tcg,thread=multi,tb-size=128",
            "-cpu",
            "max",
            "-m",
            str(self.memory_mb),
            "-smp",
            str(self.smp),
            "-kernel",
            str(img.kernel),
            "-initrd",
            str(img.initrd),
            "-append",
            self.append,
            "-drive",
            f"file={self.dir / 'disk.qcow2'},if=virtio,format=qcow2,cache=unsafe",
            "-netdev",
            f"user,id=n0,hostfwd=tcp:127.0.0.1:{self.port}-:22",
            "-device",
            "virtio-net-pci,netdev=n0",
            "-display",
            "none",
            "-vga",
            "none",
            "-no-reboot",
            "-serial",
            f"file:{self.dir / 'console.log'}",
            "-monitor",
            f"unix:{self.dir / 'monitor.sock'},server,nowait",
            "-pidfile",
            str(self.dir / "qemu.pid"),
        ]

    def start(self) -> VM:
        """Create the overlay disk, start qemu, wait until the guest is ready."""
        if self.running:
            return self
        cleanup_all(self.run_root)
        if self.dir.exists():
            raise LabError(
                f"{self.dir} exists and belongs to a live process; pick another VM name"
            )
        if self.image._dir is None:
            self.image.ensure()
        self.dir.mkdir(parents=True)
        (self.dir / "owner.pid").write_text(f"{os.getpid()}\n")
        if not self._atexit:
            atexit.register(self.stop)
            _install_sigterm_handler()
            self._atexit = True
        self._create_disk()
        self._boot()
        return self

    def _create_disk(self) -> None:
        _run(
            [
                "qemu-img",
                "create",
                "-q",
                "-f",
                "qcow2",
                "-F",
                "raw",
                "-b",
                str(self.image.disk),
                str(self.dir / "disk.qcow2"),
            ],
            what="qemu-img create",
        )

    def reboot(self) -> VM:
        """Power the guest off cleanly and boot the same disk again (a reboot).

        qemu runs with ``-no-reboot``, so this is poweroff + a new qemu
        process on the same overlay; the ssh port may change.
        """
        t0 = time.monotonic()
        self._poweroff()
        self._boot("reboot_boot")
        self.timings["reboot"] = time.monotonic() - t0
        return self

    def _boot(self, label: str = "boot") -> None:
        t0 = time.monotonic()
        for attempt in range(3):
            self.port = _free_port()
            argv = self.qemu_argv()
            (self.dir / "qemu.argv").write_text(shlex.join(argv) + "\n")
            with open(self.dir / "qemu.log", "ab") as logf:
                # own session (setsid): a terminal's Ctrl-C / a shell's `wait`
                # does not reach it; teardown stops it explicitly
                self.proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=logf,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            time.sleep(0.5)
            if self.proc.poll() is None:
                break
            err = (self.dir / "qemu.log").read_text(errors="replace")
            if "hostfwd" not in err and "Could not set up host forwarding" not in err:
                raise LabError(
                    f"qemu exited at once ({self.proc.returncode}): {err[-2000:]}"
                )
            log.warning("qemu: port %s taken, retrying", self.port)
        else:
            raise LabError("qemu: could not find a free port for ssh forwarding")
        try:
            self.wait_ready(self.boot_timeout)
        except BaseException:
            self.stop()
            raise
        self.timings[label] = time.monotonic() - t0
        out = self.run("ip -o -4 route show default", timeout=60).stdout.split()
        self.nic = out[out.index("dev") + 1] if "dev" in out else None

    def console_tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(
                (self.dir / "console.log")
                .read_text(errors="replace")
                .splitlines()[-lines:]
            )
        return ""

    def wait_ready(self, timeout: float) -> str:
        """Wait for sshd in the guest (not just slirp's listener), then systemd."""
        deadline = time.monotonic() + timeout
        while True:
            if not self.running:
                raise LabError(
                    f"VM {self.name}: qemu exited ({self.proc.returncode if self.proc else '?'}); "
                    f"console:\n{self.console_tail()}"
                )
            # slirp accepts the TCP connection itself: only an ssh command
            # that runs proves the guest's sshd is up
            res = _run(
                self.ssh_args + ["true"], check=False, timeout=30, what="ssh probe"
            )
            if res.returncode == 0:
                break
            if time.monotonic() > deadline:
                raise LabError(
                    f"VM {self.name}: ssh on 127.0.0.1:{self.port} not ready after "
                    f"{timeout:.0f}s ({res.stderr.strip()}); console:\n{self.console_tail()}"
                )
            time.sleep(1)
        remaining = max(10.0, deadline - time.monotonic())
        res = self.run(
            "systemctl is-system-running --wait", check=False, timeout=remaining
        )
        state = res.stdout.strip()
        if state == "degraded":
            self.failed_units = self.run(
                "systemctl --failed --no-legend --plain | awk '{print $1}'",
                check=False,
                timeout=60,
            ).stdout.split()
            log.warning(
                "qemu: %s booted degraded; failed units: %s",
                self.name,
                ", ".join(self.failed_units) or "?",
            )
        elif state != "running":
            raise LabError(
                f"VM {self.name}: system state {state!r} "
                f"(ssh exit {res.returncode}: {res.stderr.strip()})"
            )
        return state

    def _monitor(self, command: str) -> None:
        sock_path = self.dir / "monitor.sock"
        with (
            contextlib.suppress(OSError),
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s,
        ):
            s.settimeout(5)
            s.connect(str(sock_path))
            s.sendall(command.encode() + b"\n")
            time.sleep(0.2)

    def stop(self, timeout: float = 60) -> None:
        """Clean poweroff (see :meth:`_poweroff`), then remove the run dir (and disk)."""
        self._poweroff(timeout)
        owner = self.dir / "owner.pid"
        with contextlib.suppress(OSError):
            if owner.read_text().strip() == str(os.getpid()):
                shutil.rmtree(self.dir, ignore_errors=True)
        with contextlib.suppress(OSError):
            self.run_root.rmdir()

    def _poweroff(self, timeout: float = 60) -> None:
        """``systemctl poweroff``; then ACPI powerdown, SIGTERM, SIGKILL if qemu hangs."""
        if self.proc is not None and self.proc.poll() is None:
            t0 = time.monotonic()
            steps = [
                (
                    "poweroff",
                    lambda: self.run("systemctl poweroff", check=False, timeout=20),
                ),
                ("acpi", lambda: self._monitor("system_powerdown")),
                ("sigterm", lambda: self.proc.send_signal(signal.SIGTERM)),
                ("sigkill", lambda: self.proc.kill()),
            ]
            for what, step in steps:
                with contextlib.suppress(Exception):
                    step()
                try:
                    self.proc.wait(timeout=timeout if what == "poweroff" else 15)
                    log.info(
                        "qemu: %s stopped (%s) in %.1fs",
                        self.name,
                        what,
                        time.monotonic() - t0,
                    )
                    self.timings["stop"] = time.monotonic() - t0
                    self.stopped_by = what
                    break
                except subprocess.TimeoutExpired:
                    log.warning("qemu: %s did not stop after %s", self.name, what)
        _run(
            [
                "ssh",
                "-o",
                f"ControlPath={self.control_path}",
                "-O",
                "exit",
                "-p",
                str(self.port or 22),
                "root@127.0.0.1",
            ],
            check=False,
            timeout=10,
        )


def cleanup_all(run_dir: str | os.PathLike | None = None) -> None:
    """Kill and remove VMs whose owning process is dead (a killed test session)."""
    run = Path(run_dir or os.environ.get("CORRAL_HOSTLAB_QEMU_RUN", DEFAULT_RUN))
    if not run.is_dir():
        return
    for d in run.iterdir():
        if not d.is_dir():
            continue
        with contextlib.suppress(ValueError, OSError):
            owner = int((d / "owner.pid").read_text())
            if owner != os.getpid() and _pid_alive(owner):
                continue
        with contextlib.suppress(ValueError, OSError):
            pid = int((d / "qemu.pid").read_text())
            if _is_our_qemu(pid, d):
                log.warning(
                    "qemu: killing VM %s (pid %s) left by a dead process", d.name, pid
                )
                os.kill(pid, signal.SIGKILL)
                for _ in range(50):
                    if not _pid_alive(pid):
                        break
                    time.sleep(0.1)
        shutil.rmtree(d, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(
        prog="python -m tests.hostlab.qemu",
        description="qemu (TCG) slow tier of the hostlab",
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("build", help="build (or find) the cached VM image")
    boot = sub.add_parser(
        "boot", help="boot a VM, print how to reach it, Ctrl-C stops it"
    )
    boot.add_argument("name", nargs="?", default="demo")
    sub.add_parser("cleanup", help="kill VMs left behind by dead processes")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.cmd == "cleanup":
        cleanup_all()
        return 0
    ok, reason = available()
    if not ok:
        print(f"qemu tier unavailable: {reason}", file=sys.stderr)
        return 2
    img = QemuImage()
    t0 = time.monotonic()
    img.ensure()
    print(f"image {img.dir} ready in {time.monotonic() - t0:.1f}s {img.timings}")
    if args.cmd == "boot":
        with VM(img, args.name) as vm:
            print(
                f"{shlex.join(vm.ssh_args)}   # nic {vm.nic}, {vm.timings}\nCtrl-C to stop"
            )
            with contextlib.suppress(KeyboardInterrupt):
                while vm.running:
                    time.sleep(1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
