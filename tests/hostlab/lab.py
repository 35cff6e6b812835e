"""Boot throwaway Debian bookworm hosts with systemd-nspawn for role tests.

Why this design (see /work/shared/TESTHOSTS.md for the measurements):

* The test machine has no kernel modules, PID 1 is not systemd and cgroups are
  v1 "hybrid".  Docker has no engine and KVM does not run guests, so
  ``systemd-nspawn`` containers booting a real systemd are the cheapest way to
  get hosts that behave like Debian servers (systemd units, apt, sshd).
* A debootstrapped base root is built once and cached as a tarball keyed by a
  hash of the recipe; every host is an overlayfs on top of it, so a host costs
  ~20 MiB and boots in ~2 s.
* Each host lives in its own network namespace on a lab bridge with a static
  address; the machine NATs the subnet so apt inside the hosts reaches the
  Debian mirror.  Every change to the machine (bridge, ip_forward, iptables
  rules, mounts, cgroups, processes) is recorded under the run directory so
  that teardown -- or the next lab, after a crash -- can undo it.
* Each ``systemd-nspawn`` launcher is put into its own cgroup in the
  name=systemd, unified and memory hierarchies; without that all containers
  share one ``payload`` cgroup and stop each other.

Public API: :func:`available`, :class:`LabConfig`, :class:`Lab`,
:class:`Host`, :func:`cleanup_all`.  Command line:
``python -m tests.hostlab {build-base,status,cleanup,bench,demo}``.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import fcntl
import hashlib
import ipaddress
import json
import logging
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import sys
import threading
import time
import urllib.error
import urllib.request
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

log = logging.getLogger("corral.hostlab")

#: Bump when the base customisation below changes in a way the package list
#: does not capture; it is part of the cache key.
BASE_RECIPE_VERSION = 4

#: Packages in the base root.  The first block is TESTHOSTS.md's recipe; the
#: rest is what Ansible modules need on the target (python3-apt for ``apt``,
#: python3-debian for ``deb822_repository``) and what the fakes need
#: (python3-yaml for the kubeadm fake). cloud-init and curl: the bootstrap lab
#: (tests/bootstrap_lab) runs corral's user data under real cloud-init, as a
#: cloud image would; it is disabled in the base (/etc/cloud/cloud-init.disabled)
#: and only that lab turns it on. python3-cffi-backend: cloud-init's python3-cryptography
#: needs it through a virtual package debootstrap does not resolve.
BASE_PACKAGES: tuple[str, ...] = (
    "systemd", "systemd-sysv", "dbus", "openssh-server", "python3", "iproute2",
    "procps", "sudo", "ca-certificates", "kmod", "gnupg", "apt-transport-https",
    "python3-apt", "python3-debian", "python3-yaml", "iputils-ping",
    "cloud-init", "python3-cffi-backend", "curl",
)

DEFAULT_CACHE = "/var/cache/corral-hostlab"
DEFAULT_RUN = "/run/corral-hostlab"
DEFAULT_BRIDGE = "corralbr0"
DEFAULT_SUBNET = "10.77.0.0/24"

_RULE_COMMENT_PREFIX = "corral-hostlab:"
_COMPLETE_MARKER = ".corral-hostlab-complete"


class LabError(RuntimeError):
    """A lab operation failed; the message says what and where to look."""


def machine_debian_mirror(apt_etc: str | os.PathLike = "/etc/apt") -> str:
    """The Debian archive this machine's own apt uses, for debootstrap.

    Test roots fetch their packages the way the machine does, so the
    repository never names a mirror: read the first ``deb`` source of the
    main archive (not ``-security``/``-updates`` suites) from the deb822
    ``*.sources`` files or the one-line ``sources.list`` format.
    """
    etc = Path(apt_etc)
    files = [etc / "sources.list", *sorted((etc / "sources.list.d").glob("*.list")),
             *sorted((etc / "sources.list.d").glob("*.sources"))]
    for path in files:
        try:
            text = path.read_text()
        except OSError:
            continue
        if path.suffix == ".sources":
            for stanza in re.split(r"\n\s*\n", text):
                fields: dict[str, str] = {}
                for line in stanza.splitlines():
                    if line.startswith("#") or ":" not in line or line[:1].isspace():
                        continue
                    key, _, value = line.partition(":")
                    fields[key.strip().lower()] = value.strip()
                if ("deb" in fields.get("types", "").split()
                        and fields.get("enabled", "yes").lower() != "no"
                        and any("-" not in suite for suite in fields.get("suites", "").split())
                        and fields.get("uris")):
                    return fields["uris"].split()[0].rstrip("/")
        else:
            for line in text.splitlines():
                words = re.sub(r"\[[^]]*\]", " ", line.split("#", 1)[0]).split()
                if len(words) >= 3 and words[0] == "deb" and "-" not in words[2]:
                    return words[1].rstrip("/")
    raise LabError(f"no Debian archive found in {etc}/sources.list(.d); "
                   "set CORRAL_HOSTLAB_MIRROR to the Debian mirror test roots should use")


# --------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------

def _run(cmd: Sequence[str], *, timeout: float = 60, check: bool = True,
         input: str | None = None, what: str | None = None,
         env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run a command with a timeout; on failure raise LabError naming it.

    Every external call in the lab goes through here so that a hung tool can
    never hang the test session and a failure says which command and why.
    """
    try:
        res = subprocess.run(list(cmd), capture_output=True, text=True,
                             timeout=timeout, input=input,
                             env=dict(env) if env is not None else None)
    except subprocess.TimeoutExpired as exc:
        raise LabError(f"{what or cmd[0]} timed out after {timeout:.0f}s: "
                       f"{shlex.join(cmd)}") from exc
    except FileNotFoundError as exc:
        raise LabError(f"{cmd[0]} not found (run .ci/install-hostlab-deps.sh)") from exc
    if check and res.returncode != 0:
        raise LabError(f"{what or cmd[0]} failed (exit {res.returncode}): "
                       f"{shlex.join(cmd)}\n{(res.stderr or res.stdout).strip()[-2000:]}")
    return res


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.chmod(path, mode)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _mounted_under(prefix: Path) -> list[str]:
    """Mount points at or below ``prefix``, deepest first (for unmounting)."""
    prefix_s = str(prefix).rstrip("/")
    found = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            mnt = line.split()[4].replace("\\040", " ")
            if mnt == prefix_s or mnt.startswith(prefix_s + "/"):
                found.append(mnt)
    return sorted(set(found), key=len, reverse=True)


def _umount(mnt: str) -> None:
    """Unmount, falling back to a lazy unmount if something still holds it."""
    res = _run(["umount", mnt], check=False, timeout=30)
    if res.returncode != 0:
        log.warning("umount %s failed (%s); lazy unmount", mnt, res.stderr.strip())
        _run(["umount", "-l", mnt], check=False, timeout=30)


def _sanitize_label(name: str) -> str:
    label = re.sub(r"[^a-z0-9-]", "-", name.split(".")[0].lower()).strip("-")
    return label or "host"


# --------------------------------------------------------------------------
# configuration and availability
# --------------------------------------------------------------------------

@dataclasses.dataclass
class LabConfig:
    """Where the lab keeps things and which network it uses.

    Every field has an environment override so CI and developers can move the
    lab without code changes: ``CORRAL_HOSTLAB_CACHE``, ``CORRAL_HOSTLAB_RUN``,
    ``CORRAL_HOSTLAB_MIRROR``, ``CORRAL_HOSTLAB_BRIDGE``,
    ``CORRAL_HOSTLAB_SUBNET``, ``CORRAL_HOSTLAB_HOST_CPUS``.
    """

    cache_dir: Path = dataclasses.field(
        default_factory=lambda: Path(os.environ.get("CORRAL_HOSTLAB_CACHE", DEFAULT_CACHE)))
    run_dir: Path = dataclasses.field(
        default_factory=lambda: Path(os.environ.get("CORRAL_HOSTLAB_RUN", DEFAULT_RUN)))
    mirror: str = dataclasses.field(
        default_factory=lambda: os.environ.get("CORRAL_HOSTLAB_MIRROR") or machine_debian_mirror())
    bridge: str = dataclasses.field(
        default_factory=lambda: os.environ.get("CORRAL_HOSTLAB_BRIDGE", DEFAULT_BRIDGE))
    subnet: str = dataclasses.field(
        default_factory=lambda: os.environ.get("CORRAL_HOSTLAB_SUBNET", DEFAULT_SUBNET))
    #: prepended to nspawn machine names; two labs running at once need
    #: different prefixes because host-side veth names ("vb-" + machine) are global
    machine_prefix: str = dataclasses.field(
        default_factory=lambda: os.environ.get("CORRAL_HOSTLAB_MACHINE_PREFIX", ""))
    #: CPU time each host may use, in cores (cgroup cpu quota); None = no
    #: limit. Hosts of a data centre each have their own CPUs; here they
    #: share the machine's, so one host's join does not tell how N hosts
    #: scale. A quota with N x quota below the machine's cores gives every
    #: host the same CPU whether it runs alone or with N-1 others
    #: (benchmarks/bench_join.py --host-cpus).
    host_cpus: float | None = dataclasses.field(
        default_factory=lambda: float(os.environ["CORRAL_HOSTLAB_HOST_CPUS"])
        if os.environ.get("CORRAL_HOSTLAB_HOST_CPUS") else None)
    suite: str = "bookworm"
    extra_packages: tuple[str, ...] = ()
    #: seconds to wait for a host to reach running/degraded
    boot_timeout: float = 90.0
    #: seconds to wait for a clean poweroff after SIGTERM before SIGKILL
    stop_timeout: float = 20.0

    @property
    def network(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(self.subnet, strict=False)

    @property
    def gateway(self) -> str:
        """The machine's address on the bridge (first address of the subnet)."""
        return str(next(self.network.hosts()))

    @property
    def lab_dir(self) -> Path:
        """Per-bridge runtime state; one lab per bridge at a time."""
        return self.run_dir / self.bridge


def available() -> tuple[bool, str]:
    """Can this machine run the lab?  Returns ``(ok, reason)``.

    Tests call ``pytest.skip(reason)`` when ``ok`` is False, so the reason
    names the missing piece and how to get it.
    """
    if sys.platform != "linux":
        return False, f"hostlab needs Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return False, "hostlab needs root (mounts, bridges, iptables, systemd-nspawn)"
    tools = {
        "systemd-nspawn": "systemd-container", "debootstrap": "debootstrap",
        "iptables": "iptables", "ip": "iproute2", "ssh": "openssh-client",
        "ssh-keygen": "openssh-client", "gpg": "gnupg",
        "apt-ftparchive": "apt-utils", "dpkg-deb": "dpkg", "tar": "tar",
        "zstd": "zstd", "setsid": "util-linux",
    }
    missing = sorted({pkg for tool, pkg in tools.items() if shutil.which(tool) is None})
    if missing:
        return False, ("hostlab tools missing (Debian packages: " + " ".join(missing)
                       + "); run .ci/install-hostlab-deps.sh")
    try:
        fs = Path("/proc/filesystems").read_text()
    except OSError as exc:
        return False, f"cannot read /proc/filesystems: {exc}"
    if not re.search(r"\boverlay\b", fs):
        return False, "overlayfs is not available in this kernel (and modprobe is not used)"
    if _proc_sys_read_only():
        return False, ("/proc/sys is mounted read-only (this is a container): the lab cannot "
                       "set ip_forward for its bridge")
    if not os.access("/proc/sys/net/ipv4/ip_forward", os.W_OK):
        return False, "/proc/sys/net/ipv4/ip_forward is not writable"
    res = subprocess.run(["iptables", "-t", "nat", "-S", "POSTROUTING"],
                         capture_output=True, text=True, timeout=20)
    if res.returncode != 0:
        return False, f"iptables nat table unusable: {res.stderr.strip()}"
    if not _cgroup_hierarchies():
        return False, "no writable cgroup hierarchy found under /sys/fs/cgroup"
    return True, "ok"


def _proc_sys_read_only() -> bool:
    """Is /proc/sys mounted read-only (as container managers mount it)?"""
    with contextlib.suppress(OSError):
        with open("/proc/self/mountinfo") as fh:
            for line in fh:
                fields = line.split()
                if fields[4] == "/proc/sys":
                    return "ro" in fields[5].split(",")
    return False


# --------------------------------------------------------------------------
# cgroups: one per nspawn launcher
# --------------------------------------------------------------------------

def _own_cgroups() -> dict[str, str]:
    """Controller (or "name=systemd", "" for cgroup v2) -> our cgroup path."""
    own: dict[str, str] = {}
    with open("/proc/self/cgroup") as fh:
        for line in fh:
            _, ctrls, path = line.rstrip("\n").split(":", 2)
            for c in (ctrls.split(",") if ctrls else [""]):
                own[c] = path
    return own


def _cgroup_hierarchies() -> list[tuple[str, Path]]:
    """(key, directory of our own cgroup) for name=systemd, unified, memory.

    Those are the hierarchies systemd-nspawn looks at; a launcher that shares
    them with another launcher shares its ``payload`` cgroup too.
    """
    own = _own_cgroups()
    wanted = {"name=systemd": "name=systemd", "": "unified", "memory": "memory"}
    result = []
    with open("/proc/self/mounts") as fh:
        for line in fh:
            _, mnt, fstype, opts = line.split()[:4]
            if fstype == "cgroup2":
                key = ""
            elif fstype == "cgroup":
                opts_set = set(opts.split(","))
                key = next((k for k in ("name=systemd", "memory") if k in opts_set), None)
                if key is None:
                    continue
            else:
                continue
            if key in own and wanted[key] not in [r[0] for r in result]:
                d = Path(mnt) / own[key].lstrip("/")
                if os.access(d, os.W_OK):
                    result.append((wanted[key], d))
    return result


def _cpu_hierarchy() -> tuple[str, Path] | None:
    """("v1" | "v2", our own cgroup directory) where the cpu controller is."""
    own = _own_cgroups()
    with open("/proc/self/mounts") as fh:
        mounts = [line.split()[1:4] for line in fh]
    for mnt, fstype, opts in mounts:
        if fstype == "cgroup" and "cpu" in opts.split(",") and "cpu" in own:
            d = Path(mnt) / own["cpu"].lstrip("/")
            if os.access(d, os.W_OK):
                return "v1", d
    for mnt, fstype, _ in mounts:
        if fstype == "cgroup2" and "" in own:
            d = Path(mnt) / own[""].lstrip("/")
            with contextlib.suppress(OSError):
                if "cpu" in (d / "cgroup.subtree_control").read_text().split():
                    return "v2", d
    return None


def _set_cpu_quota(group: str, cpus: float) -> Path:
    """Limit the cgroup ``group`` to ``cpus`` cores; its directory."""
    found = _cpu_hierarchy()
    if found is None:
        raise LabError("a CPU quota per host needs the cpu cgroup controller "
                       "(a cgroup v1 'cpu' hierarchy, or cgroup v2 with cpu in subtree_control)")
    version, base = found
    d = base / group
    d.mkdir(parents=True, exist_ok=True)
    if version == "v1":
        period = int((d / "cpu.cfs_period_us").read_text())
        (d / "cpu.cfs_quota_us").write_text(str(max(1000, int(cpus * period))))
    else:
        # cgroup v2: a leaf has cpu.max only if every cgroup between it and
        # ours hands the cpu controller down.
        for parent in reversed(d.relative_to(base).parents[:-1]):
            with contextlib.suppress(OSError):
                (base / parent / "cgroup.subtree_control").write_text("+cpu")
        (d / "cpu.max").write_text(f"{max(1000, int(cpus * 100_000))} 100000")
    return d


def _cgroup_dirs(group: str) -> list[Path]:
    """The lab cgroup directories called ``group`` in every hierarchy (and in
    the cpu hierarchy, where a CPU quota made one)."""
    dirs = [base / group for _, base in _cgroup_hierarchies()]
    cpu = _cpu_hierarchy()
    if cpu is not None and (cpu[1] / group).is_dir() and cpu[1] / group not in dirs:
        dirs.append(cpu[1] / group)
    return dirs


def _cgroup_pids(dirs: Iterable[Path]) -> set[int]:
    pids: set[int] = set()
    for d in dirs:
        # os.walk, not Path.rglob: the tree shrinks while its hosts power off, and rglob raised
        # FileNotFoundError on a sub-cgroup that went between listing and entering it (os.walk
        # skips what it cannot list).
        for root, _subdirs, files in os.walk(d):
            if "cgroup.procs" in files:
                with contextlib.suppress(OSError, ValueError):
                    pids.update(int(p) for p in (Path(root) / "cgroup.procs").read_text().split())
    return pids


def _cgroup_remove(dirs: Iterable[Path], timeout: float = 10) -> None:
    """Remove cgroup trees bottom-up, waiting for their processes to go."""
    deadline = time.monotonic() + timeout
    for d in dirs:
        while d.exists():
            # Deepest first; os.walk skips what vanished meanwhile (see _cgroup_pids).
            subdirs = sorted((Path(root) / name for root, names, _ in os.walk(d) for name in names),
                             key=lambda p: len(p.parts), reverse=True)
            busy = False
            for sd in subdirs + [d]:
                try:
                    sd.rmdir()
                except FileNotFoundError:
                    pass
                except OSError:
                    busy = True
            if not busy:
                break
            if time.monotonic() > deadline:
                log.warning("cgroup %s still busy; leaving it", d)
                break
            time.sleep(0.1)


def _launcher_pids(bridge: str, machine: str) -> list[int]:
    """PIDs of the systemd-nspawn launcher of a host, found via its cgroup."""
    for key, base in _cgroup_hierarchies():
        if key != "name=systemd":
            continue
        d = base / f"corral-hostlab-{bridge}" / machine
        for candidate in (d / "supervisor", d):
            with contextlib.suppress(OSError, ValueError):
                pids = [int(p) for p in (candidate / "cgroup.procs").read_text().split()]
                if pids:
                    return pids
    return []


def _kill_cgroup(dirs: list[Path], sig: int = signal.SIGKILL) -> None:
    for pid in _cgroup_pids(dirs):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


# --------------------------------------------------------------------------
# hosts
# --------------------------------------------------------------------------

class Host:
    """One booted (or stopped) test host.

    Attributes tests use: ``name`` (inventory name, may be an FQDN),
    ``hostname`` (what the host calls itself), ``ip``, ``root`` (its root
    directory as seen from this machine, for asserting on rendered files),
    ``failed_units`` (units that failed at boot, if the host came up
    degraded).
    """

    def __init__(self, lab: "Lab", name: str, ip: str, machine: str, hostname: str):
        self.lab = lab
        self.name = name
        self.ip = ip
        self.machine = machine
        self.hostname = hostname
        self.dir = lab.config.lab_dir / "hosts" / machine
        self.root = self.dir / "root"
        self.proc: subprocess.Popen | None = None
        self.failed_units: list[str] = []
        self.state = "new"

    def __repr__(self) -> str:
        return f"<Host {self.name} {self.ip} {self.state}>"

    # -- access --------------------------------------------------------
    @property
    def ssh_options(self) -> list[str]:
        """``-o`` options (and key) to reach this host with plain ssh."""
        return self.lab.ssh_options()

    @property
    def ssh_args(self) -> list[str]:
        """A complete ``ssh`` argv prefix: append a remote command."""
        return ["ssh", *self.ssh_options, f"root@{self.ip}"]

    def run(self, command: str | Sequence[str], *, check: bool = True,
            timeout: float = 120, input: str | None = None) -> subprocess.CompletedProcess:
        """Run a shell command on the host over SSH as root.

        ``command`` is a shell string (or an argv that gets quoted).  Raises
        LabError with the output when ``check`` and the command fails.
        """
        cmd = command if isinstance(command, str) else shlex.join(command)
        return _run(self.ssh_args + [cmd], timeout=timeout, check=check, input=input,
                    what=f"ssh {self.name}")

    def path(self, inside: str | os.PathLike) -> Path:
        """This machine's path of a file inside the host (``/etc/x`` → root/etc/x)."""
        return self.root / str(inside).lstrip("/")

    def reachable(self, timeout: float = 2.0) -> bool:
        """True if the host's sshd accepts TCP connections right now."""
        try:
            with socket.create_connection((self.ip, 22), timeout=timeout):
                return True
        except OSError:
            return False

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # -- lifecycle -----------------------------------------------------
    def start(self, wait: bool = True) -> "Host":
        """(Re)boot the host.  A stopped host keeps its disk (overlay upper)."""
        self.lab._start_hosts([self], wait=wait)
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Clean poweroff (SIGTERM to nspawn), then unmount the overlay.

        The upper directory is kept so :meth:`start` boots the same disk
        again, like rebooting a real machine.
        """
        self.lab._stop_host(self, timeout)

    def destroy(self) -> None:
        """Stop the host and delete its disk; it is forgotten by the lab."""
        self.lab.remove_host(self)

    def wait_ready(self, timeout: float | None = None) -> str:
        """Block until ``systemctl is-system-running`` settles; return the state."""
        return self.lab._wait_ready(self, timeout or self.lab.config.boot_timeout)

    # -- files on the host's disk ---------------------------------------
    def _prepare_disk(self, lab: "Lab", etc_hosts: str, resolv_conf: str) -> None:
        """Mount the overlay and personalise it (host keys, name, address)."""
        for sub in ("upper", "work", "root"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        if not os.path.ismount(self.root):
            _run(["mount", "-t", "overlay", "overlay", "-o",
                  f"lowerdir={lab.base_root},upperdir={self.dir / 'upper'},workdir={self.dir / 'work'}",
                  str(self.root)], what="mount overlay", timeout=30)
        # Unique host keys per host.  Not `ssh-keygen -A`: its RSA key costs
        # ~1 s of CPU per host, which made booting 10 hosts on 2 cores take
        # 8-13 s instead of ~5 s; ed25519 + ecdsa take milliseconds.
        for kind in ("ed25519", "ecdsa"):
            key = self.path(f"/etc/ssh/ssh_host_{kind}_key")
            if not key.exists():
                _run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", f"root@{self.hostname}",
                      "-f", str(key)], what="ssh-keygen", timeout=60)
        _write(self.path("/etc/ssh/sshd_config.d/05-corral-hostlab-hostkeys.conf"),
               "# hostlab: only these host keys exist (no RSA key, to boot faster)\n"
               "HostKey /etc/ssh/ssh_host_ed25519_key\nHostKey /etc/ssh/ssh_host_ecdsa_key\n")
        _write(self.path("/etc/hostname"), self.hostname + "\n")
        _write(self.path("/etc/hosts"), etc_hosts)
        resolv = self.path("/etc/resolv.conf")
        if resolv.is_symlink():
            resolv.unlink()
        _write(resolv, resolv_conf)
        net = lab.config.network
        _write(self.path("/etc/systemd/network/10-host0.network"), (
            "# written by the corral hostlab\n"
            "[Match]\nName=host0\n\n"
            f"[Network]\nAddress={self.ip}/{net.prefixlen}\nGateway={lab.config.gateway}\n"
            "LinkLocalAddressing=no\nIPv6AcceptRA=no\n"))


class Lab:
    """A set of throwaway hosts on one bridge, with everything needed to undo it.

    Use as a context manager or call :meth:`start` / :meth:`teardown`.
    Teardown is also registered with ``atexit``; a lab killed with SIGKILL is
    cleaned up by the next lab on the same bridge (or ``python -m
    tests.hostlab cleanup``).
    """

    def __init__(self, config: LabConfig | None = None):
        self.config = config or LabConfig()
        self.hosts: dict[str, Host] = {}
        self.timings: dict[str, float] = {}
        self.base_root: Path | None = None
        self._next_index = 10
        self._lock = threading.RLock()
        self._started = False
        self._atexit_registered = False
        net = self.config.network
        if net.prefixlen > 29:
            raise LabError(f"subnet {net} is too small for a lab")

    # ------------------------------------------------------------------
    # context manager / lifecycle
    # ------------------------------------------------------------------
    def __enter__(self) -> "Lab":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.teardown()

    @property
    def gateway(self) -> str:
        """This machine's address on the lab bridge (hosts reach it there)."""
        return self.config.gateway

    @property
    def key_path(self) -> Path:
        """Private SSH key that root on every host accepts."""
        return self.config.cache_dir / "ssh" / "id_ed25519"

    @property
    def control_dir(self) -> Path:
        """Directory of ssh ControlMaster sockets (ours and Ansible's)."""
        return _control_dir(self.config.lab_dir)

    def start(self) -> "Lab":
        """Prepare base image and network.  Idempotent."""
        if self._started:
            return self
        ok, reason = available()
        if not ok:
            raise LabError(reason)
        cfg = self.config
        self._claim_lab_dir()
        if not self._atexit_registered:
            atexit.register(self.teardown)
            self._atexit_registered = True
            _install_sigterm_handler()
        t0 = time.monotonic()
        self.base_root = self.ensure_base()
        self.timings["base"] = time.monotonic() - t0
        t0 = time.monotonic()
        self._setup_network()
        self.timings["network"] = time.monotonic() - t0
        self.control_dir.mkdir(parents=True, exist_ok=True)
        self._started = True
        log.info("hostlab up: bridge %s %s, base %s", cfg.bridge, cfg.subnet, self.base_root)
        return self

    def _claim_lab_dir(self) -> None:
        """Take ownership of the per-bridge run dir, cleaning up a dead lab."""
        lab_dir = self.config.lab_dir
        owner = lab_dir / "owner.pid"
        if owner.exists():
            try:
                pid = int(owner.read_text().strip() or 0)
            except ValueError:
                pid = 0
            if pid and pid != os.getpid() and _pid_alive(pid):
                raise LabError(
                    f"bridge {self.config.bridge} is in use by a lab in pid {pid}; "
                    "set CORRAL_HOSTLAB_BRIDGE and CORRAL_HOSTLAB_SUBNET to run another lab")
            if pid != os.getpid():
                log.warning("cleaning up a dead lab (pid %s) on %s", pid, self.config.bridge)
                _cleanup_lab_dir(lab_dir)
        lab_dir.mkdir(parents=True, exist_ok=True)
        owner.write_text(f"{os.getpid()}\n")

    def teardown(self) -> None:
        """Stop all hosts, unmount, remove cgroups, bridge and rules.  Idempotent."""
        with self._lock:
            hosts = list(self.hosts.values())
            if hosts:
                with ThreadPoolExecutor(max_workers=min(16, len(hosts))) as ex:
                    list(ex.map(lambda h: self._stop_host(h, quiet=True), hosts))
            self.hosts.clear()
            lab_dir = self.config.lab_dir
            owner = lab_dir / "owner.pid"
            mine = owner.exists() and owner.read_text().strip() == str(os.getpid())
            if mine or self._started:
                _cleanup_lab_dir(lab_dir)
            self._started = False

    # ------------------------------------------------------------------
    # ssh key and base image
    # ------------------------------------------------------------------
    def ensure_key(self) -> Path:
        """Generate the lab SSH key into the cache dir once.

        Safe when pytest workers race on an empty cache (a fresh machine): under a
        lock, the pair is made under a temporary name and renamed into place, the
        public half first, so a private key that exists always has its .pub.
        """
        key = self.key_path
        key.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if key.exists():
            return key
        with _flock(key.parent / ".lock"):
            if not key.exists():
                tmp = Path(tempfile.mkdtemp(prefix=".keygen-", dir=key.parent))
                try:
                    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "corral-hostlab",
                          "-f", str(tmp / key.name)], what="ssh-keygen")
                    (tmp / f"{key.name}.pub").rename(f"{key}.pub")
                    (tmp / key.name).rename(key)
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
        return key

    def base_recipe(self) -> dict:
        """Everything that determines the base image; its hash is the cache key."""
        cfg = self.config
        pub = Path(str(self.ensure_key()) + ".pub").read_text().strip()
        return {
            "version": BASE_RECIPE_VERSION, "suite": cfg.suite, "mirror": cfg.mirror,
            "variant": "minbase",
            "packages": sorted(set(BASE_PACKAGES) | set(cfg.extra_packages)),
            "authorized_key": pub,
        }

    def base_key(self) -> str:
        blob = json.dumps(self.base_recipe(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def ensure_base(self) -> Path:
        """Return an extracted base root, building or restoring it if needed.

        Order of preference: an extracted tree from an earlier session (0 s),
        the cached tarball (~1.5 s), a fresh debootstrap (~50-90 s).
        """
        cache = self.config.cache_dir
        cache.mkdir(parents=True, exist_ok=True)
        key = self.base_key()
        tarball = cache / f"base-{key}.tar.zst"
        root = cache / f"base-{key}"
        with _flock(cache / ".lock"):
            if (root / _COMPLETE_MARKER).exists():
                return root
            if not tarball.exists():
                self._build_base(tarball)
                _prune_old_bases(cache, keep=key)
            t0 = time.monotonic()
            tmp = cache / f"base-{key}.extract"
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir()
            _run(["tar", "--numeric-owner", "--xattrs", "--xattrs-include=*", "-I", "zstd -T0",
                  "-xpf", str(tarball), "-C", str(tmp)], timeout=300, what="restore base")
            (tmp / _COMPLETE_MARKER).write_text(json.dumps(self.base_recipe(), indent=1))
            if root.exists():
                shutil.rmtree(root)
            tmp.rename(root)
            self.timings["base_restore"] = time.monotonic() - t0
            return root

    def _check_mirror(self) -> None:
        url = f"{self.config.mirror.rstrip('/')}/dists/{self.config.suite}/Release"
        try:
            with urllib.request.urlopen(url, timeout=20) as resp:
                resp.read(64)
        except (urllib.error.URLError, OSError) as exc:
            raise LabError(
                f"the Debian mirror {self.config.mirror} is unreachable ({url}: {exc}); "
                "the base image cannot be built. Set CORRAL_HOSTLAB_MIRROR to a reachable "
                "mirror or provide a cached base in CORRAL_HOSTLAB_CACHE") from exc

    def _build_base(self, tarball: Path) -> None:
        """debootstrap + customise + pack.  Runs once per recipe per machine."""
        cfg = self.config
        self._check_mirror()
        t0 = time.monotonic()
        build = tarball.with_suffix("").with_suffix(".build")
        if build.exists():
            for mnt in _mounted_under(build):
                _umount(mnt)
            shutil.rmtree(build)
        build.mkdir()
        logfile = tarball.with_suffix("").with_suffix(".debootstrap.log")
        pkgs = ",".join(sorted(set(BASE_PACKAGES) | set(cfg.extra_packages)))
        cmd = ["debootstrap", "--variant=minbase", f"--include={pkgs}", cfg.suite,
               str(build), cfg.mirror]
        log.info("building hostlab base: %s", shlex.join(cmd))
        with open(logfile, "w") as fh:
            try:
                res = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, timeout=1200)
            except subprocess.TimeoutExpired as exc:
                raise LabError(f"debootstrap from {cfg.mirror} timed out; log: {logfile}") from exc
        if res.returncode != 0:
            tail = "\n".join(logfile.read_text().splitlines()[-15:])
            debootstrap_log = build / "debootstrap/debootstrap.log"
            if debootstrap_log.exists():
                tail += "\n" + "\n".join(debootstrap_log.read_text().splitlines()[-15:])
            raise LabError(f"debootstrap {cfg.suite} from mirror {cfg.mirror} failed "
                           f"(exit {res.returncode}); log: {logfile}\n{tail}")
        self._customise_base(build)
        tmp_tar = tarball.with_suffix(".tmp")
        _run(["tar", "--numeric-owner", "--xattrs", "--xattrs-include=*", "-I", "zstd -T0 -3",
              "-cf", str(tmp_tar), "-C", str(build), "."], timeout=600, what="pack base")
        tmp_tar.rename(tarball)
        shutil.rmtree(build)
        self.timings["base_build"] = time.monotonic() - t0
        log.info("hostlab base built in %.0fs: %s", self.timings["base_build"], tarball)

    def _customise_base(self, root: Path) -> None:
        """Make the debootstrapped root a good template for many hosts."""
        pub = Path(str(self.key_path) + ".pub").read_text()
        ssh_dir = root / "root/.ssh"
        ssh_dir.mkdir(mode=0o700, exist_ok=True)
        _write(ssh_dir / "authorized_keys", pub, 0o600)
        # every host gets its own identity at first boot
        (root / "etc/machine-id").write_text("")
        dbus_id = root / "var/lib/dbus/machine-id"
        if dbus_id.exists() and not dbus_id.is_symlink():
            dbus_id.unlink()
        for f in (root / "etc/ssh").glob("ssh_host_*"):
            f.unlink()
        with contextlib.suppress(FileNotFoundError):
            (root / "etc/hostname").unlink()
        _run(["systemctl", f"--root={root}", "enable", "systemd-networkd.service",
              "systemd-networkd.socket"], what="enable systemd-networkd")
        # no consoles to log in on in a container; serial/getty units only add noise
        _run(["systemctl", f"--root={root}", "mask", "getty@tty1.service",
              "serial-getty@.service", "console-getty.service"],
             what="mask gettys", check=False)
        _write(root / "etc/apt/apt.conf.d/90corral-hostlab",
               '// hostlab: smaller, faster apt update in test hosts\n'
               'Acquire::Languages "none";\n')
        _write(root / "etc/ssh/sshd_config.d/90-corral-hostlab.conf",
               "# hostlab: many parallel Ansible connections, no DNS lookups\n"
               "MaxStartups 100:30:200\nMaxSessions 50\nUseDNS no\n"
               "PermitRootLogin prohibit-password\n")
        # cloud-init stays off unless a lab seeds a datasource and removes this
        # (tests/bootstrap_lab); other labs' hosts boot as before.
        _write(root / "etc/cloud/cloud-init.disabled", "hostlab: off unless a lab turns it on\n")
        for deb in (root / "var/cache/apt/archives").glob("*.deb"):
            deb.unlink()

    # ------------------------------------------------------------------
    # network
    # ------------------------------------------------------------------
    def _iptables_rules(self) -> list[tuple[str, list[str]]]:
        """(table, rule spec) pairs this lab adds; tagged with a comment."""
        cfg = self.config
        tag = ["-m", "comment", "--comment", _RULE_COMMENT_PREFIX + cfg.bridge]
        net = str(cfg.network)
        return [
            ("nat", ["POSTROUTING", "-s", net, "!", "-o", cfg.bridge, *tag, "-j", "MASQUERADE"]),
            ("filter", ["FORWARD", "-i", cfg.bridge, *tag, "-j", "ACCEPT"]),
            ("filter", ["FORWARD", "-o", cfg.bridge, "-m", "conntrack", "--ctstate",
                        "RELATED,ESTABLISHED", *tag, "-j", "ACCEPT"]),
            ("filter", ["INPUT", "-i", cfg.bridge, *tag, "-j", "ACCEPT"]),
        ]

    def _check_subnet_free(self) -> None:
        cfg = self.config
        res = _run(["ip", "-j", "-4", "route", "show"], check=False)
        try:
            routes = json.loads(res.stdout or "[]")
        except json.JSONDecodeError:
            return
        for r in routes:
            dst = r.get("dst", "")
            if dst in ("default", "") or r.get("dev") == cfg.bridge:
                continue
            with contextlib.suppress(ValueError):
                if ipaddress.IPv4Network(dst, strict=False).overlaps(cfg.network):
                    raise LabError(f"lab subnet {cfg.network} overlaps route {dst} on "
                                   f"{r.get('dev')}; set CORRAL_HOSTLAB_SUBNET")

    def _setup_network(self) -> None:
        """Bridge + ip_forward + NAT.  Records what it changed before changing it."""
        cfg = self.config
        state_file = cfg.lab_dir / "network.json"
        state = json.loads(state_file.read_text()) if state_file.exists() else {}
        self._check_subnet_free()
        state["bridge"] = cfg.bridge
        state["rules"] = self._iptables_rules()
        if not Path(f"/sys/class/net/{cfg.bridge}").exists():
            state["bridge_created"] = True
        _write(state_file, json.dumps(state, indent=1))
        if not Path(f"/sys/class/net/{cfg.bridge}").exists():
            _run(["ip", "link", "add", cfg.bridge, "type", "bridge"], what="create bridge")
        addr = f"{cfg.gateway}/{cfg.network.prefixlen}"
        res = _run(["ip", "-j", "-4", "addr", "show", "dev", cfg.bridge])
        if addr.split("/")[0] not in res.stdout:
            _run(["ip", "addr", "add", addr, "dev", cfg.bridge], what="address bridge")
        _run(["ip", "link", "set", cfg.bridge, "up"])
        forward_acquire(cfg.lab_dir)
        for table, rule in state["rules"]:
            if _run(["iptables", "-w", "10", "-t", table, "-C", *rule], check=False).returncode != 0:
                op = "-A" if table == "nat" else "-I"
                _run(["iptables", "-w", "10", "-t", table, op, *rule], what="iptables")

    def resolv_conf(self) -> str:
        """The machine's resolver config, minus loopback servers hosts cannot reach."""
        try:
            lines = Path("/etc/resolv.conf").read_text().splitlines()
        except OSError:
            lines = []
        out, servers = [], 0
        for line in lines:
            parts = line.split()
            if parts[:1] == ["nameserver"] and len(parts) > 1:
                with contextlib.suppress(ValueError):
                    if ipaddress.ip_address(parts[1]).is_loopback:
                        continue
                servers += 1
            out.append(line)
        if not servers:
            warnings.warn("hostlab: this machine has only loopback nameservers; "
                          "hosts will have no DNS (the local apt repo still works by IP)", stacklevel=2)
        return "# copied from the lab machine by the corral hostlab\n" + "\n".join(out) + "\n"

    # ------------------------------------------------------------------
    # hosts
    # ------------------------------------------------------------------
    def ssh_options(self) -> list[str]:
        """ssh options shared by the lab, Ansible inventories and ssh configs."""
        return [
            "-i", str(self.key_path), "-o", "IdentitiesOnly=yes",
            "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
            "-o", "LogLevel=ERROR", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5",
            "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3",
            "-o", "ControlMaster=auto", "-o", f"ControlPath={self.control_dir}/%C",
            "-o", "ControlPersist=60s",
        ]

    def _allocate_ip(self) -> str:
        """Next free address; addresses are not reused soon (stale ARP entries)."""
        net = self.config.network
        used = {h.ip for h in self.hosts.values()}
        for _ in range(net.num_addresses):
            idx = self._next_index
            self._next_index += 1
            if self._next_index >= net.num_addresses - 1:
                self._next_index = 2
            ip = str(net.network_address + idx)
            if ip not in used and ip != self.gateway:
                return ip
        raise LabError(f"no free address left in {net}")

    def _machine_name(self, name: str, ip: str) -> str:
        """nspawn machine name: short (veth names are 'vb-' + 12 chars) and unique."""
        prefix = self.config.machine_prefix
        label = prefix + _sanitize_label(name)
        taken = {h.machine for h in self.hosts.values()}
        if len(label) <= 12 and label not in taken:
            return label
        fallback = f"{prefix}hl{ip.split('.')[-1]}-{_sanitize_label(name)}"[:12].rstrip("-")
        if fallback in taken:
            raise LabError(f"cannot pick a unique machine name for {name}")
        return fallback

    def etc_hosts(self) -> str:
        lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback",
                 f"{self.gateway}\thostlab-gateway"]
        for h in self.hosts.values():
            names = [h.name] if h.name == h.hostname else [h.name, h.hostname]
            lines.append(f"{h.ip}\t" + " ".join(names))
        return "\n".join(lines) + "\n"

    def add_host(self, name: str, ip: str | None = None, hostname: str | None = None) -> Host:
        """Register a host (not booted yet).  ``name`` may be an FQDN."""
        with self._lock:
            if name in self.hosts:
                raise LabError(f"host {name} already exists in the lab")
            ip = ip or self._allocate_ip()
            if ip in {h.ip for h in self.hosts.values()}:
                raise LabError(f"address {ip} is already used in the lab")
            if ipaddress.IPv4Address(ip) not in self.config.network:
                raise LabError(f"address {ip} is not in the lab subnet {self.config.network}")
            host = Host(self, name, ip, self._machine_name(name, ip),
                        hostname or name.split(".")[0])
            self.hosts[name] = host
            return host

    def boot(self, names: int | Sequence[str], *, prefix: str = "host",
             ips: Sequence[str] | None = None, wait: bool = True,
             prepare: Callable[[Host], None] | None = None) -> list[Host]:
        """Create and boot hosts concurrently; return them once all are ready.

        ``names`` is a count (hosts ``{prefix}1..N``) or a list of names, which
        may be DNS-like (``gpu-001.sf1.internal``); ``ansible_host`` is the IP.
        ``prepare(host)`` runs after the host's disk is mounted and before it
        boots (write files through ``host.path(...)``, e.g. a GPU profile for
        the fakes).  A host that comes up "degraded" is ready too: its
        ``failed_units`` says what failed and a warning is issued.
        """
        self.start()
        if isinstance(names, int):
            n0 = len(self.hosts)
            names = [f"{prefix}{n0 + i + 1}" for i in range(names)]
        hosts = [self.add_host(n, ip=(ips[i] if ips else None)) for i, n in enumerate(names)]
        try:
            self._start_hosts(hosts, wait=wait, prepare=prepare)
        except BaseException:
            for h in hosts:
                with contextlib.suppress(Exception):
                    self.remove_host(h)
            raise
        return hosts

    def boot_from(self, source: Host, name: str) -> Host:
        """Boot a new host whose disk starts as a copy of ``source``'s.

        A machine booted from an image baked on ``source`` (which must be
        stopped): the new host gets its own name, address and ssh host keys,
        everything else is the image's.
        """
        if source.running:
            raise LabError(f"{source.name} is running: stop it before booting a copy of its disk")
        self.start()
        host = self.add_host(name)
        try:
            host.dir.mkdir(parents=True, exist_ok=True)
            # The overlay's upper directory is everything the image changed
            # on the base; cp -a keeps its whiteouts and xattrs.
            _run(["cp", "-a", "--reflink=auto", str(source.dir / "upper"), str(host.dir / "upper")],
                 timeout=600, what="copy the image's disk")
            for key in (host.dir / "upper" / "etc" / "ssh").glob("ssh_host_*"):
                key.unlink()
            self._start_hosts([host])
        except BaseException:
            with contextlib.suppress(Exception):
                self.remove_host(host)
            raise
        return host

    def _start_hosts(self, hosts: Sequence[Host], wait: bool = True,
                     prepare: Callable[[Host], None] | None = None) -> None:
        t0 = time.monotonic()
        etc_hosts, resolv = self.etc_hosts(), self.resolv_conf()

        def prep(h: Host) -> None:
            h._prepare_disk(self, etc_hosts, resolv)
            if prepare is not None:
                prepare(h)

        with ThreadPoolExecutor(max_workers=min(8, len(hosts)) or 1) as ex:
            list(ex.map(prep, hosts))
        for h in hosts:
            self._launch(h)
        if wait:
            with ThreadPoolExecutor(max_workers=min(16, len(hosts)) or 1) as ex:
                list(ex.map(lambda h: self._wait_ready(h, self.config.boot_timeout), hosts))
        self.timings[f"boot_{len(hosts)}"] = time.monotonic() - t0

    def _launch(self, host: Host) -> None:
        """Start systemd-nspawn for a prepared host in its own cgroups."""
        if host.running:
            return
        cfg = self.config
        _run(["ip", "neigh", "flush", "dev", cfg.bridge, "to", host.ip], check=False)
        group = f"corral-hostlab-{cfg.bridge}/{host.machine}"
        dirs = _cgroup_dirs(group)
        _cgroup_remove(dirs, timeout=2)
        for d in dirs:
            d.mkdir(parents=True, exist_ok=True)
        if cfg.host_cpus:
            quota_dir = _set_cpu_quota(group, cfg.host_cpus)
            if quota_dir not in dirs:
                dirs.append(quota_dir)
        (host.dir / "cgroups.json").write_text(json.dumps([str(d) for d in dirs]))
        nspawn = ["systemd-nspawn", "-q", "-b", "-D", str(host.root), "-M", host.machine,
                  f"--hostname={host.hostname}", "--register=no", "--keep-unit",
                  # read-only: console output goes to nspawn.log. With "passive" nobody
                  # reads the console pty; once its buffer is full, every write to
                  # /dev/console (PID 1's status lines, cloud-init) blocks the writer.
                  f"--network-bridge={cfg.bridge}", "--console=read-only",
                  "--resolv-conf=off", "--link-journal=no", "--timezone=off"]
        # the shell moves itself into the fresh cgroups, then becomes nspawn
        moves = " ".join(f"echo $$ > {shlex.quote(str(d / 'cgroup.procs'))};" for d in dirs)
        script = f"{moves} exec {shlex.join(nspawn)}"
        logf = open(host.dir / "nspawn.log", "ab")
        try:
            host.proc = subprocess.Popen(["sh", "-c", script], stdin=subprocess.DEVNULL,
                                         stdout=logf, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        finally:
            logf.close()
        (host.dir / "nspawn.pid").write_text(f"{host.proc.pid}\n")
        host.state = "booting"
        host.failed_units = []

    def _nspawn_log_tail(self, host: Host, lines: int = 20) -> str:
        with contextlib.suppress(OSError):
            return "\n".join((host.dir / "nspawn.log").read_text(errors="replace")
                             .splitlines()[-lines:])
        return ""

    def _wait_ready(self, host: Host, timeout: float) -> str:
        """Wait for sshd, then for ``systemctl is-system-running --wait``."""
        deadline = time.monotonic() + timeout
        while not host.reachable(timeout=0.5):
            if not host.running:
                host.state = "failed"
                raise LabError(f"host {host.name}: systemd-nspawn exited "
                               f"({host.proc.returncode if host.proc else '?'}):\n"
                               + self._nspawn_log_tail(host))
            if time.monotonic() > deadline:
                host.state = "failed"
                raise LabError(f"host {host.name} ({host.ip}): sshd not reachable after "
                               f"{timeout:.0f}s; nspawn log:\n" + self._nspawn_log_tail(host))
            time.sleep(0.1)
        remaining = max(5.0, deadline - time.monotonic())
        res = host.run("systemctl is-system-running --wait", check=False, timeout=remaining)
        state = res.stdout.strip()
        if state == "degraded":
            failed = host.run("systemctl --failed --no-legend --plain | awk '{print $1}'",
                              check=False, timeout=30).stdout.split()
            host.failed_units = failed
            warnings.warn(f"hostlab: {host.name} booted degraded; failed units: "
                          f"{', '.join(failed) or '?'}", stacklevel=2)
        elif state != "running":
            host.state = "failed"
            raise LabError(f"host {host.name}: system state {state!r} "
                           f"(ssh exit {res.returncode}: {res.stderr.strip()})")
        host.state = state
        return state

    def _close_master(self, host: Host) -> None:
        _run(["ssh", *self.ssh_options(), "-O", "exit", f"root@{host.ip}"],
             check=False, timeout=10)

    def _stop_host(self, host: Host, timeout: float | None = None, quiet: bool = False) -> None:
        """SIGTERM → clean poweroff; SIGKILL the cgroup if it hangs; unmount."""
        timeout = self.config.stop_timeout if timeout is None else timeout
        self._close_master(host)
        dirs = _cgroup_dirs(f"corral-hostlab-{self.config.bridge}/{host.machine}")
        if host.proc is not None and host.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                host.proc.send_signal(signal.SIGTERM)
            try:
                host.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                if not quiet:
                    log.warning("host %s did not power off in %.0fs; killing", host.name, timeout)
                _kill_cgroup(dirs)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    host.proc.wait(timeout=10)
        # anything left in its cgroups (there should be nothing) goes too
        if _cgroup_pids(dirs):
            _kill_cgroup(dirs)
            time.sleep(0.2)
        _cgroup_remove(dirs)
        for mnt in _mounted_under(host.root):
            _umount(mnt)
        host.state = "stopped"

    def remove_host(self, host: Host) -> None:
        """Stop a host, delete its directories and forget it."""
        self._stop_host(host)
        if _mounted_under(host.dir):
            raise LabError(f"{host.dir} is still mounted; not deleting it")
        shutil.rmtree(host.dir, ignore_errors=True)
        with self._lock:
            self.hosts.pop(host.name, None)

    # ------------------------------------------------------------------
    # ansible / ssh glue
    # ------------------------------------------------------------------
    def _select(self, hosts: Iterable[Host | str] | None) -> list[Host]:
        if hosts is None:
            return list(self.hosts.values())
        return [h if isinstance(h, Host) else self.hosts[h] for h in hosts]

    def ansible_ssh_common_args(self) -> str:
        opts = [o for o in self.ssh_options() if o not in ("-i", str(self.key_path))]
        return shlex.join(opts)

    def inventory_data(self, hosts: Iterable[Host | str] | None = None,
                       groups: Mapping[str, Iterable[Host | str]] | None = None,
                       vars: Mapping[str, object] | None = None,
                       host_vars: Mapping[str, Mapping[str, object]] | None = None) -> dict:
        """The inventory as a dict (YAML inventory structure)."""
        sel = self._select(hosts)
        host_vars = host_vars or {}

        def hv(h: Host) -> dict:
            return {"ansible_host": h.ip, **host_vars.get(h.name, {})}

        all_vars = {
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(self.key_path),
            "ansible_ssh_common_args": self.ansible_ssh_common_args(),
            "ansible_python_interpreter": "/usr/bin/python3",
            "ansible_ssh_pipelining": True,
            **(vars or {}),
        }
        inv: dict = {"all": {"vars": all_vars, "hosts": {h.name: hv(h) for h in sel}}}
        if groups:
            inv["all"]["children"] = {
                g: {"hosts": {(m.name if isinstance(m, Host) else m): {} for m in members}}
                for g, members in groups.items()}
        return inv

    def write_inventory(self, path: str | os.PathLike,
                        hosts: Iterable[Host | str] | None = None,
                        groups: Mapping[str, Iterable[Host | str]] | None = None,
                        vars: Mapping[str, object] | None = None,
                        host_vars: Mapping[str, Mapping[str, object]] | None = None) -> Path:
        """Write an Ansible inventory (YAML; JSON syntax, so no PyYAML needed).

        Host names are the inventory names (may be FQDNs), ``ansible_host`` is
        the IP; the ssh options match :meth:`ssh_options` (lab key, no host key
        checking, ControlMaster in the lab's control dir so teardown closes
        Ansible's masters too).
        """
        path = Path(path)
        if path.suffix not in (".yml", ".yaml", ".json"):
            raise LabError("inventory path must end in .yml, .yaml or .json")
        _write(path, json.dumps(self.inventory_data(hosts, groups, vars, host_vars), indent=2) + "\n")
        return path

    def ansible_env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """Environment for ``ansible``/``ansible-playbook`` against lab hosts.

        The inventory already carries the connection settings; this adds what
        only the environment can set (no host key checking, enough forks, no
        retry files, quiet interpreter discovery).
        """
        env = dict(os.environ if base is None else base)
        env.update({
            "ANSIBLE_HOST_KEY_CHECKING": "False",
            "ANSIBLE_PIPELINING": "True",
            "ANSIBLE_FORKS": str(max(10, len(self.hosts))),
            "ANSIBLE_RETRY_FILES_ENABLED": "False",
            "ANSIBLE_PYTHON_INTERPRETER": "/usr/bin/python3",
            "ANSIBLE_NOCOLOR": "1",
        })
        return env

    def write_ssh_config(self, path: str | os.PathLike,
                         hosts: Iterable[Host | str] | None = None) -> Path:
        """Write an ssh_config so ``ssh -F PATH NAME`` reaches a host by name."""
        lines = []
        for h in self._select(hosts):
            aliases = " ".join(dict.fromkeys([h.name, h.hostname, h.ip]))
            lines += [f"Host {aliases}", f"  HostName {h.ip}", "  User root",
                      f"  IdentityFile {self.key_path}", "  IdentitiesOnly yes",
                      "  StrictHostKeyChecking no", "  UserKnownHostsFile /dev/null",
                      "  LogLevel ERROR", "  ControlMaster auto",
                      f"  ControlPath {self.control_dir}/%C", "  ControlPersist 60s", ""]
        path = Path(path)
        _write(path, "\n".join(lines))
        return path


# --------------------------------------------------------------------------
# cleanup (works from the on-disk state only, so it also cleans crashed labs)
# --------------------------------------------------------------------------

def _cleanup_lab_dir(lab_dir: Path) -> None:
    """Undo everything a lab recorded under ``lab_dir`` and delete it."""
    if not lab_dir.exists():
        return
    bridge = lab_dir.name
    # ssh control masters (ours and Ansible's, which use our ControlPath)
    cm = _control_dir(lab_dir)
    if cm.exists():
        for sock in cm.iterdir():
            _run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "lab"], check=False, timeout=10)
        if cm.parent != lab_dir:
            shutil.rmtree(cm, ignore_errors=True)
    # processes of the hosts, by cgroup, then cgroups
    hosts_dir = lab_dir / "hosts"
    for hdir in sorted(hosts_dir.iterdir()) if hosts_dir.exists() else []:
        dirs = _cgroup_dirs(f"corral-hostlab-{bridge}/{hdir.name}")
        if _cgroup_pids(dirs):
            # systemd-nspawn moves itself into a "supervisor" sub-cgroup of
            # the name=systemd hierarchy (the container goes to "payload").
            # SIGTERM the launcher for a clean poweroff, then kill the rest.
            for pid in _launcher_pids(bridge, hdir.name):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while _cgroup_pids(dirs) and time.monotonic() < deadline:
                time.sleep(0.2)
            _kill_cgroup(dirs)
            time.sleep(0.2)
        _cgroup_remove(dirs)
    _cgroup_remove(_cgroup_dirs(f"corral-hostlab-{bridge}"))
    for mnt in _mounted_under(lab_dir):
        _umount(mnt)
    # network
    state_file = lab_dir / "network.json"
    state = {}
    with contextlib.suppress(OSError, json.JSONDecodeError):
        state = json.loads(state_file.read_text())
    _delete_tagged_rules(bridge)
    if Path(f"/sys/class/net/{bridge}").exists() and state.get("bridge_created", True):
        _run(["ip", "link", "del", bridge], check=False)
    forward_release(lab_dir)
    if _mounted_under(lab_dir):
        log.error("hostlab: %s still has mounts; not deleting it", lab_dir)
        return
    shutil.rmtree(lab_dir, ignore_errors=True)
    with contextlib.suppress(OSError):
        lab_dir.parent.rmdir()  # the run dir, if no other lab uses it


def _prune_old_bases(cache: Path, keep: str) -> None:
    """Delete base images of other recipes (300 MB each) unless a mount uses them."""
    with open("/proc/self/mountinfo") as fh:
        mounts = fh.read()
    for p in cache.glob("base-*"):
        if p.name.startswith(f"base-{keep}"):
            continue
        stem = p.name.split(".")[0]
        if str(cache / stem) in mounts:
            continue
        log.info("hostlab: removing old base %s", p)
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


def _control_dir(lab_dir: Path) -> Path:
    """ssh ControlPath directory: in the lab dir unless that path is too long.

    A unix socket path must fit in 108 bytes; ``%C`` adds 41 characters.
    """
    cm = lab_dir / "cm"
    if len(str(cm)) + 42 < 100:
        return cm
    return Path("/tmp") / f".corral-hostlab-cm-{lab_dir.name}"


def _delete_tagged_rules(bridge: str) -> None:
    """Delete every iptables rule carrying this lab's comment tag."""
    tag = _RULE_COMMENT_PREFIX + bridge
    for table in ("nat", "filter"):
        res = _run(["iptables", "-w", "10", "-t", table, "-S"], check=False)
        for line in res.stdout.splitlines():
            if line.startswith("-A ") and tag in line:
                spec = shlex.split(line)[1:]
                _run(["iptables", "-w", "10", "-t", table, "-D", *spec], check=False)


def cleanup_all(run_dir: str | os.PathLike | None = None) -> None:
    """Clean up every lab under the run dir whose owner is not alive."""
    run = Path(run_dir or os.environ.get("CORRAL_HOSTLAB_RUN", DEFAULT_RUN))
    if not run.exists():
        return
    for lab_dir in run.iterdir():
        owner = lab_dir / "owner.pid"
        with contextlib.suppress(ValueError, OSError):
            pid = int(owner.read_text())
            if pid != os.getpid() and _pid_alive(pid):
                log.warning("lab %s belongs to live pid %s; skipping", lab_dir, pid)
                continue
        _cleanup_lab_dir(lab_dir)


# ip_forward is one setting of the whole machine, and labs run side by side
# (pytest-xdist workers, modules with their own bridge): the first lab saves
# the machine's value, every lab registers while it runs, and the last one to
# go puts the value back. Not under a lab's run dir: labs of different run dirs
# share the machine too.
FORWARD_DIR = Path("/run/corral-hostlab-forward")
IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")


def _forward_entry(lab_dir: Path) -> Path:
    return FORWARD_DIR / (hashlib.sha256(str(lab_dir).encode()).hexdigest()[:16] + ".lab")


def forward_users() -> list[Path]:
    """The labs that need ip_forward now: registered, and their lab still set up."""
    users = []
    for entry in sorted(FORWARD_DIR.glob("*.lab")) if FORWARD_DIR.exists() else []:
        with contextlib.suppress(OSError):
            lab_dir = Path(entry.read_text().strip())
            if (lab_dir / "network.json").exists():
                users.append(lab_dir)
                continue
        entry.unlink(missing_ok=True)  # a lab that is gone without its teardown
    return users


def forward_acquire(lab_dir: Path) -> None:
    with _flock(FORWARD_DIR / ".lock"):
        saved = FORWARD_DIR / "original"
        if not [u for u in forward_users() if u != lab_dir] and not saved.exists():
            _write(saved, IP_FORWARD.read_text().strip() + "\n")
        _write(_forward_entry(lab_dir), f"{lab_dir}\n")
        IP_FORWARD.write_text("1\n")


def forward_release(lab_dir: Path) -> None:
    """Unregister `lab_dir`; the last lab puts the machine's value back."""
    with _flock(FORWARD_DIR / ".lock"):
        _forward_entry(lab_dir).unlink(missing_ok=True)
        saved = FORWARD_DIR / "original"
        if [u for u in forward_users() if u != lab_dir] or not saved.exists():
            return
        old = saved.read_text().strip()
        if old in ("0", "1"):
            with contextlib.suppress(OSError):
                IP_FORWARD.write_text(old + "\n")
        saved.unlink()


@contextlib.contextmanager
def _flock(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _install_sigterm_handler() -> None:
    """Turn SIGTERM into KeyboardInterrupt so finalizers and atexit tear the lab down.

    KeyboardInterrupt rather than SystemExit because pytest treats SystemExit
    in a test as that test's failure and carries on, but stops the session on
    KeyboardInterrupt and runs every fixture finalizer.  Only installed when
    nobody else handles SIGTERM and we are in the main thread; a CI timeout
    then still leaves no mounts, bridges or rules behind.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        def _on_term(signum, frame):
            raise KeyboardInterrupt(f"signal {signum}")
        signal.signal(signal.SIGTERM, _on_term)


# --------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------

def _bench(counts: Sequence[int]) -> None:
    """Print the timings README.md quotes: restore, boot of N hosts, stop, memory."""
    lab = Lab()
    root = lab.ensure_base()
    tarball = root.with_name(root.name + ".tar.zst")
    if tarball.exists():
        tmp = root.with_name(root.name + ".bench")
        tmp.mkdir(exist_ok=True)
        t0 = time.monotonic()
        _run(["tar", "--numeric-owner", "--xattrs", "--xattrs-include=*", "-I", "zstd -T0",
              "-xpf", str(tarball), "-C", str(tmp)], timeout=300)
        print(f"restore base from {tarball.name}: {time.monotonic() - t0:.2f}s")
        shutil.rmtree(tmp)
    with lab:
        print(f"lab start (base ready, network): {sum(lab.timings.values()):.2f}s")
        for n in counts:
            t0 = time.monotonic()
            hosts = lab.boot(n, prefix=f"b{n}x")
            boot = time.monotonic() - t0
            mem = []
            for h in hosts:
                for key, d in _cgroup_hierarchies():
                    f = d / f"corral-hostlab-{lab.config.bridge}/{h.machine}/memory.usage_in_bytes"
                    if key == "memory" and f.exists():
                        mem.append(int(f.read_text()) / 2**20)
            t0 = time.monotonic()
            with ThreadPoolExecutor(max_workers=16) as ex:
                list(ex.map(lab.remove_host, hosts))
            stop = time.monotonic() - t0
            avg = f"{sum(mem) / len(mem):.0f} MiB/host" if mem else "n/a"
            print(f"boot {n:2d} hosts to running: {boot:5.2f}s   stop+remove: {stop:5.2f}s   memory: {avg}")


def main(argv: Sequence[str] | None = None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -m tests.hostlab", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("build-base", help="build (or restore) the cached base image")
    sub.add_parser("status", help="show labs, mounts, cgroups and rules")
    sub.add_parser("cleanup", help="tear down labs left behind by dead processes")
    bench = sub.add_parser("bench", help="measure restore and boot times (for README.md)")
    bench.add_argument("counts", type=int, nargs="*", default=[1, 4, 8, 10])
    demo = sub.add_parser("demo", help="boot N hosts, print how to reach them, wait for Ctrl-C")
    demo.add_argument("n", type=int, nargs="?", default=2)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    ok, reason = available()
    if not ok:
        print(f"hostlab unavailable: {reason}", file=sys.stderr)
        return 2
    if args.cmd == "build-base":
        lab = Lab()
        t0 = time.monotonic()
        print(lab.ensure_base(), f"{time.monotonic() - t0:.1f}s", lab.timings)
    elif args.cmd == "cleanup":
        cleanup_all()
    elif args.cmd == "status":
        run = Path(os.environ.get("CORRAL_HOSTLAB_RUN", DEFAULT_RUN))
        print("labs:", [d.name for d in run.iterdir()] if run.exists() else [])
        print("mounts:", _mounted_under(run))
        print(_run(["iptables", "-t", "nat", "-S"], check=False).stdout)
    elif args.cmd == "bench":
        _bench(args.counts)
    elif args.cmd == "demo":
        with Lab() as lab:
            hosts = lab.boot(args.n)
            cfg = lab.write_ssh_config(lab.config.lab_dir / "ssh_config")
            for h in hosts:
                print(f"ssh -F {cfg} {h.name}   # {h.ip} {h.state}")
            print("timings:", lab.timings, "\nCtrl-C to tear down")
            with contextlib.suppress(KeyboardInterrupt):
                while True:
                    time.sleep(3600)
    return 0


if __name__ == "__main__":
    sys.exit(main())
