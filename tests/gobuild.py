"""The programs corral's tests build from Go modules: scripts/build-kube (Kubernetes, etcd),
scripts/build-runtime (containerd, corral's etcd) and scripts/build-kueue (Kueue's manager, helm and
the release's chart). Each prints its cache entry's bin folder as the last stdout line and
exits 3 on a machine without Go; the tiers that need them skip then and say why
(docs/kube-build.md)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The exit status of the build scripts on a machine without Go.
NO_GO = 3
NO_GO_REASON = ("no Go toolchain on PATH: the real programs are built from their Go modules "
                "({script}); install Go 1.26 or set {env}")


class GoBuildUnavailable(RuntimeError):
    """The machine cannot build the real programs (no Go); the reason says what to install."""


class GoBuildFailed(RuntimeError):
    """A build script failed on a machine that has Go."""


def available(script: str, env: str) -> tuple[bool, str]:
    """Can this machine have the programs `script` builds? (ok, reason)."""
    if os.environ.get(env):
        return True, ""
    if shutil.which("go") is None:
        return False, NO_GO_REASON.format(script=f"scripts/{script}", env=env)
    return True, ""


def built_bin_dir(script: str, env: str) -> Path:
    """The bin folder of scripts/`script` (built once per version and cached); `env`, when set,
    names a folder of such programs to use instead."""
    if os.environ.get(env):
        return Path(os.environ[env])
    run = subprocess.run(["bash", str(ROOT / "scripts" / script)], capture_output=True, text=True, timeout=3600)
    if run.returncode == NO_GO:
        raise GoBuildUnavailable(run.stderr.strip() or NO_GO_REASON.format(script=f"scripts/{script}", env=env))
    if run.returncode != 0:
        raise GoBuildFailed(f"scripts/{script} failed (exit {run.returncode}):\n{run.stderr[-3000:]}")
    return Path(run.stdout.strip().splitlines()[-1])


def runtime_bin_dir() -> Path:
    """containerd, containerd-shim-runc-v2 and ctr at the catalog's default containerd."""
    return built_bin_dir("build-runtime", "CORRAL_RUNTIME_BIN")


def kueue_dir() -> Path:
    """scripts/build-kueue's cache entry: bin/kueue-manager, bin/helm and charts/kueue at the
    catalog's Kueue. CORRAL_KUEUE_BIN, when set, names such an entry's bin folder."""
    return built_bin_dir("build-kueue", "CORRAL_KUEUE_BIN").parent
