"""The hostlab's first run on a fresh machine, proved on every run (issue 34).

Every developer's machine and CI right after a session already hold the lab's
cache (/var/cache/corral-hostlab: the ssh key, the base image, the signed apt
repository), which hid a first-run race that failed 34 hostlab tests on a new
machine. This test runs two hostlab tests in a pytest of its own, with two
workers racing on an EMPTY cache folder and a lab network of their own, so a
first-run race or a missing install step fails here, not for a new user.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hostlab import available

ROOT = Path(__file__).resolve().parent.parent
# A network no other lab uses (tests/hostlab/lab.py DEFAULT_SUBNET is 10.77.0.0/24; modules'
# own labs are in 10.78.x and 10.60/10.202); the two workers take the next two /24s.
FRESH_BRIDGE, FRESH_SUBNET, FRESH_PREFIX = "corralfresh", "10.79.0.0/24", "fr-"


@pytest.mark.hostlab
def test_two_workers_on_an_empty_cache_boot_hosts_and_build_the_repo(tmp_path):
    ok, reason = available()
    if not ok:
        pytest.skip(f"hostlab unavailable: {reason}")
    cache = tmp_path / "cache"
    env = {**os.environ, "CORRAL_HOSTLAB_CACHE": str(cache), "CORRAL_HOSTLAB_RUN": str(tmp_path / "run"),
           "CORRAL_HOSTLAB_BRIDGE": FRESH_BRIDGE, "CORRAL_HOSTLAB_SUBNET": FRESH_SUBNET,
           "CORRAL_HOSTLAB_MACHINE_PREFIX": FRESH_PREFIX}
    env.pop("PYTEST_XDIST_WORKER", None)
    # --dist load: one test on each worker, both starting their lab on the empty cache at once.
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "hostlab", "-n", "2",
         "--dist", "load", "tests/test_hostlab.py", "-k",
         "test_three_hosts_ssh_apt_fakes_stop_and_restart or test_degraded_host_reports_failed_units"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    tail = (run.stdout + run.stderr)[-4000:]
    assert run.returncode == 0, f"the hostlab on an empty cache failed:\n{tail}"
    assert "2 passed" in run.stdout, tail
    # Each first-run artefact exists once, complete.
    assert (cache / "ssh" / "id_ed25519").exists() and (cache / "ssh" / "id_ed25519.pub").exists()
    assert len(list(cache.glob("base-*.tar.zst"))) == 1
    assert len([p for p in cache.glob("aptrepo-*") if (p / ".complete").exists()]) == 1
    assert not list(cache.glob("*.build")) and not list(cache.glob("*.extract"))
