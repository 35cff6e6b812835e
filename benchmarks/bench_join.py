"""Wall time of `corral join` on 1, 4 and 8 throwaway hosts, and of a no-change re-run.

Needs root and the test-host lab (tests/hostlab: systemd-nspawn, debootstrap).
Each case boots fresh GPU hosts, joins them through the real CLI against the
lab's signed apt repository of test fakes, and times the CLI end to end
(interpreter start, ansible-runner, every role). Target (issue 4): 8 hosts
well under twice 1 host.

    python benchmarks/bench_join.py [--sizes 1,4,8]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.hostlab.aptrepo import AptRepo  # noqa: E402
from tests.hostlab.lab import Lab, LabConfig, available  # noqa: E402
from tests.nodes import joinlab  # noqa: E402


def timed_join(setup) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    result = subprocess.run(joinlab.corral_join_argv(setup), env=joinlab.env_with(setup),
                            capture_output=True, text=True, timeout=3600)
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,4,8")
    sizes = [int(n) for n in parser.parse_args().sizes.split(",")]
    ok, reason = available()
    if not ok:
        sys.exit(f"the test-host lab is not available here: {reason}")
    rows = []
    with Lab(LabConfig(bridge="corralbench0", subnet="10.79.0.0/24", machine_prefix="bench-")) as lab:
        repo = AptRepo(lab).build().serve()
        try:
            for size in sizes:
                gpu, _ = joinlab.host_names(gpu=size, cpu=0, prefix=f"b{size}")
                hosts = lab.boot(gpu)
                try:
                    with tempfile.TemporaryDirectory() as tmp:
                        setup = joinlab.prepare(lab, repo, hosts, Path(tmp), gpu, [])
                        first, result = timed_join(setup)
                        if result.returncode != 0:
                            sys.exit(f"join of {size} hosts failed:\n{result.stdout}{result.stderr}")
                        again, result = timed_join(setup)
                        if result.returncode != 0:
                            sys.exit(f"re-run on {size} hosts failed:\n{result.stdout}{result.stderr}")
                        rows.append((size, first, again))
                finally:
                    for host in hosts:
                        lab.remove_host(host)
        finally:
            repo.stop()
    print(f"{'hosts':>5} {'join s':>8} {'no-change re-run s':>19}")
    for size, first, again in rows:
        print(f"{size:>5} {first:>8.1f} {again:>19.1f}")
    if len(rows) > 1:
        print(f"largest/smallest join: {rows[-1][1] / rows[0][1]:.2f}x (target < 2x)")


if __name__ == "__main__":
    main()
