"""The Go build scripts' cache (scripts/lib/go-build-cache.sh, shared by scripts/build-kube,
scripts/build-runtime and scripts/build-kueue): builders racing on an empty cache publish one
entry, a published entry is a lookup, and a machine without Go is told so with exit 3 (every
script). The race runs scripts/build-runtime, the quickest (its first build on this machine:
about a minute; with Go's build cache warm, seconds)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests import gobuild

SCRIPT = gobuild.ROOT / "scripts" / "build-runtime"


@pytest.fixture(scope="module")
def go():
    if shutil.which("go") is None:
        pytest.skip(gobuild.NO_GO_REASON.format(script="scripts/build-runtime", env="CORRAL_RUNTIME_BIN"))


def build(cache: Path, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(["bash", str(SCRIPT)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "CORRAL_RUNTIME_CACHE": str(cache), **(env or {})})


def test_racing_builders_publish_one_entry_and_a_second_run_is_a_lookup(go, tmp_path):
    cache = tmp_path / "cache"
    racers = [build(cache) for _ in range(2)]
    results = [(p.wait(timeout=1800), p.stdout.read(), p.stderr.read()) for p in racers]
    for code, _, err in results:
        assert code == 0, err
    (bin_dir,) = {out.strip().splitlines()[-1] for _, out, _ in results}
    entries = [p for p in cache.iterdir() if not p.name.startswith(".")]
    assert [e / "bin" for e in entries] == [Path(bin_dir)]
    assert not list(cache.glob(".*.tmp.*")), "a temporary build folder was left behind"
    assert sorted(p.name for p in Path(bin_dir).iterdir()) == [
        "containerd", "containerd-shim-runc-v2", "ctr", "etcd", "etcdctl"]
    # One built; the other either waited on the lock or found the entry published.
    built = [err for _, _, err in results if "building " in err]
    assert len(built) == 1
    started = time.monotonic()
    again = build(cache)
    out, err = again.communicate(timeout=60)
    assert again.returncode == 0 and out.strip() == bin_dir and "building" not in err
    assert time.monotonic() - started < 10


@pytest.mark.parametrize(("script", "cache_env"), [
    ("build-runtime", "CORRAL_RUNTIME_CACHE"), ("build-kueue", "CORRAL_KUEUE_CACHE"), ("build-kube", "CORRAL_KUBE_CACHE")])
def test_a_machine_without_go_is_told_so(go, tmp_path, script, cache_env):
    bare = tmp_path / "bin"
    bare.mkdir()
    for tool in ("bash", "flock", "sha256sum", "dirname", "cut", "tr", "mkdir"):
        (bare / tool).symlink_to(shutil.which(tool))
    run = subprocess.run(["bash", str(gobuild.ROOT / "scripts" / script)], capture_output=True, text=True, timeout=60,
                         env={"PATH": str(bare), "HOME": str(tmp_path), cache_env: str(tmp_path / "c")})
    assert run.returncode == gobuild.NO_GO
    assert f"{script}: go is not on PATH" in run.stderr
