"""A genuinely fresh Debian 12 to try the README's Quick start in.

A minimal bookworm root (debootstrap minbase + git + python3: Debian's own
Python 3.11 with its PEP 668 marker, no pip, no venv, no curl) is built once
and cached as a tarball; every test gets its own copy and runs commands in it
with ``systemd-nspawn`` (no boot: a plain command in the container).

The container shares the machine's network namespace and gets the machine's
pip configuration, CA certificates and apt sources: it reaches the package
registries exactly the way the machine does. That is environment, not a
shortcut: nothing corral needs is pre-installed.
"""

from __future__ import annotations

import configparser
import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.hostlab.lab import LabError, _flock, _proc_sys_read_only, _run, machine_debian_mirror

SUITE = "bookworm"
#: What a fresh Debian 12 server has that matters here: git to clone the
#: repository, python3 (Debian's, externally managed). Nothing else.
PACKAGES = ("git", "python3")
RECIPE_VERSION = 1
CACHE = Path(os.environ.get("CORRAL_QUICKSTART_CACHE", "/var/cache/corral-quickstart"))
WORK = Path(os.environ.get("CORRAL_QUICKSTART_WORK", "/var/tmp/corral-quickstart"))

#: The machine's environment the container gets, copied file by file.
PIP_CONFIGS = ("/etc/pip.conf", "/etc/xdg/pip/pip.conf")
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
LOCAL_CAS = "/usr/local/share/ca-certificates"


def available() -> tuple[bool, str]:
    """Can this machine run the fresh-Debian test?  ``(ok, reason)``."""
    if os.geteuid() != 0:
        return False, "needs root (debootstrap, systemd-nspawn)"
    for tool, package in (("debootstrap", "debootstrap"), ("systemd-nspawn", "systemd-container"),
                          ("zstd", "zstd")):
        if shutil.which(tool) is None:
            return False, f"{tool} missing (Debian package {package})"
    if _proc_sys_read_only():
        return False, ("/proc/sys is mounted read-only (this is a container): "
                       "a nested systemd-nspawn container cannot be started here")
    return True, "ok"


@dataclass
class Result:
    returncode: int
    output: str
    seconds: float


class FreshRoot:
    """One throwaway copy of the fresh Debian 12 root."""

    def __init__(self, path: Path):
        self.path = path

    # -- the cached pristine root --------------------------------------------
    @classmethod
    def create(cls, name: str) -> "FreshRoot":
        tarball = _ensure_tarball()
        WORK.mkdir(parents=True, exist_ok=True)
        path = WORK / name
        if path.exists():
            shutil.rmtree(path)
        path.mkdir()
        _run(["tar", "--numeric-owner", "-I", "zstd -T0", "-xpf", str(tarball), "-C", str(path)],
             timeout=300, what="restore the fresh Debian root")
        root = cls(path)
        root._copy_machine_environment()
        return root

    def _copy_machine_environment(self) -> None:
        for conf in PIP_CONFIGS:
            if Path(conf).is_file():
                self._copy_in(Path(conf))
                # and the files it names (a constraints file, a CA bundle): pip stops without them
                for named in _files_named_in(Path(conf)):
                    self._copy_in(named)
        if Path(LOCAL_CAS).is_dir():
            for cert in Path(LOCAL_CAS).rglob("*.crt"):
                self._copy_in(cert)
        if Path(CA_BUNDLE).is_file():
            self._copy_in(Path(CA_BUNDLE))
        # apt: the machine's own sources (and any proxy setting it has)
        apt = self.path / "etc/apt"
        (apt / "sources.list").unlink(missing_ok=True)
        for src in [Path("/etc/apt/sources.list"), *Path("/etc/apt/sources.list.d").glob("*.list"),
                    *Path("/etc/apt/sources.list.d").glob("*.sources")]:
            if src.is_file():
                self._copy_in(src)
        for conf in Path("/etc/apt/apt.conf.d").glob("*"):
            if conf.is_file() and "proxy" in conf.read_text(errors="replace").lower():
                self._copy_in(conf)

    def _copy_in(self, src: Path) -> None:
        dst = self.path / str(src).lstrip("/")
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, dst)

    # -- using it ------------------------------------------------------------
    def clone(self, repo: Path, dest: str, owner: str | None = None) -> None:
        """``git clone`` the repository (its committed HEAD) to ``dest`` inside."""
        target = self.path / dest.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        _run(["git", "clone", "--quiet", "--no-hardlinks", str(repo), str(target)],
             timeout=300, what="git clone")
        if owner:
            self.run(["chown", "-R", f"{owner}:{owner}", dest], timeout=60)

    def add_user(self, name: str) -> None:
        res = self.run(["useradd", "--create-home", "--shell", "/bin/bash", name], timeout=60)
        if res.returncode != 0:
            raise LabError(f"useradd {name} failed: {res.output[-1000:]}")

    def grant_passwordless_sudo(self, user: str) -> None:
        """Debian's sudo, and `user` may run anything through it without a password (the
        README's "normal user with password-less sudo")."""
        res = self.run(["bash", "-c", "apt-get update -qq && DEBIAN_FRONTEND=noninteractive "
                        "apt-get install -y -qq --no-install-recommends sudo >/dev/null"], timeout=900)
        if res.returncode != 0:
            raise LabError(f"installing sudo failed: {res.output[-1000:]}")
        rule = self.path / "etc/sudoers.d" / f"corral-test-{user}"
        rule.write_text(f"{user} ALL=(ALL:ALL) NOPASSWD: ALL\n")
        rule.chmod(0o440)

    def run(self, argv: list[str], *, user: str = "root", cwd: str = "/", timeout: float = 1800,
            log: Path | None = None) -> Result:
        """Run a command in the container as ``user``; output goes to ``log`` too."""
        home = "/root" if user == "root" else f"/home/{user}"
        cmd = ["systemd-nspawn", "--quiet", "--register=no", "--keep-unit",
               f"--directory={self.path}", f"--user={user}", f"--chdir={cwd}",
               f"--setenv=HOME={home}", "--setenv=LANG=C.UTF-8", "--resolv-conf=copy-host",
               # nspawn mounts a small tmpfs on /tmp: tests' temporary files
               # (Prometheus blocks, etcd data dirs) go to the root's disk.
               "--setenv=TMPDIR=/var/tmp",
               "--", *argv]
        t0 = time.monotonic()
        sink = open(log, "w") if log else subprocess.DEVNULL  # noqa: SIM115
        buf: list[str] = []
        try:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, text=True, start_new_session=True)
            deadline = t0 + timeout
            assert proc.stdout is not None
            for line in proc.stdout:
                buf.append(line)
                if log:
                    sink.write(line)
                    sink.flush()
                if time.monotonic() > deadline:
                    break
            try:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
                buf.append(f"\n[killed after {timeout:.0f} s]\n")
        finally:
            if log:
                sink.close()
        return Result(proc.returncode, "".join(buf), time.monotonic() - t0)

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def _files_named_in(pip_config: Path) -> list[Path]:
    """The existing files a pip configuration's settings point at (`constraint = /etc/...`)."""
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(pip_config)
    except configparser.Error:
        return []
    named = []
    for section in parser.sections():
        for value in parser[section].values():
            for word in value.split():
                if word.startswith("/") and Path(word).is_file():
                    named.append(Path(word))
    return named


def _recipe() -> dict:
    return {"version": RECIPE_VERSION, "suite": SUITE, "variant": "minbase",
            "packages": sorted(PACKAGES), "mirror": _mirror()}


def _mirror() -> str:
    return os.environ.get("CORRAL_HOSTLAB_MIRROR") or machine_debian_mirror()


def _ensure_tarball() -> Path:
    """The pristine root as a tarball, built by debootstrap once per recipe."""
    recipe = _recipe()
    key = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]
    CACHE.mkdir(parents=True, exist_ok=True)
    tarball = CACHE / f"bookworm-fresh-{key}.tar.zst"
    with _flock(CACHE / ".lock"):
        if tarball.exists():
            return tarball
        build = CACHE / f"build-{key}"
        shutil.rmtree(build, ignore_errors=True)
        _run(["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE,
              str(build), recipe["mirror"]], timeout=1200, what="debootstrap the fresh root")
        for deb in (build / "var/cache/apt/archives").glob("*.deb"):
            deb.unlink()
        tmp = tarball.with_suffix(".tmp")
        _run(["tar", "--numeric-owner", "-I", "zstd -T0 -3", "-cf", str(tmp), "-C", str(build), "."],
             timeout=600, what="pack the fresh root")
        tmp.rename(tarball)
        shutil.rmtree(build)
        for old in CACHE.glob("bookworm-fresh-*.tar.zst"):
            if old != tarball:
                old.unlink()
    return tarball
