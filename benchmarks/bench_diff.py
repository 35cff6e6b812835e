"""How long `corral diff` takes for a one-pool change on the example fleet, interpreter start included.

Target (issue 6): under 6 s wall. Each case copies the example fleet (and
stacks/) into a throwaway git repository, commits it on `main`, changes one
pool of one cluster in the working tree and times `corral diff` (semantic
diff plus the offline Pulumi plan of both sides, run in parallel):

- cold: no plan cache (CORRAL_PLAN_CACHE=off), both sides planned;
- warm: a plan cache primed by one earlier run (the CI/laptop loop where the
  base side is already cached and only edited clusters are planned again);
- --no-plan: the semantic diff alone.

The machine's load average is printed: the plans are CPU-bound, and on a
shared 2-core machine other jobs stretch the wall time.

    python benchmarks/bench_diff.py [--runs N]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET = 6.0
# (label, cluster, old text, new text): one pool resized per cloud.
CASES = [
    ("heron (aws): gpu-a10g max 80 -> 120", "heron", "maxSize: 80", "maxSize: 120"),
    ("jaguar (azure): cpu-d64 max 200 -> 300", "jaguar", "maxSize: 200", "maxSize: 300"),
    ("ibis (gcp): gpu-a100 max 32 -> 48", "ibis", "maxSize: 32", "maxSize: 48"),
]


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.email=bench@example.com", "-c", "user.name=bench", *args],
                   cwd=repo, check=True, capture_output=True)


def repo_copy(tmp: Path) -> Path:
    shutil.copytree(ROOT / "clusters", tmp / "clusters")
    if (ROOT / "stacks").is_dir():
        shutil.copytree(ROOT / "stacks", tmp / "stacks")
    git(tmp, "init", "-q", "-b", "main")
    git(tmp, "add", ".")
    git(tmp, "commit", "-q", "-m", "fleet")
    return tmp / "clusters"


def timed(args: list[str], cwd: Path, runs: int, env: dict[str, str]) -> tuple[float, float, float]:
    """(median wall s, best wall s, median CPU s of the command and its workers)."""
    times, cpu = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        result = subprocess.run(args, cwd=cwd, capture_output=True, text=True, env={**os.environ, **env})
        times.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        if result.returncode != 0 or "resized" not in result.stdout:
            sys.exit(f"{' '.join(args)} failed or saw no change:\n{result.stdout}{result.stderr}")
    return statistics.median(times), min(times), statistics.median(cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    runs = parser.parse_args().runs
    corral = [sys.executable, "-c", "from corral.cli import main; main()"]
    rows = []
    for label, cluster, old, new in CASES:
        with tempfile.TemporaryDirectory() as tmp:
            clusters = repo_copy(Path(tmp))
            path = clusters / f"{cluster}.yaml"
            text = path.read_text()
            assert old in text, f"{old!r} not in {path.name}"
            path.write_text(text.replace(old, new, 1))
            diff = [*corral, "diff", "--clusters", str(clusters)]
            rows.append((label + ", cold", *timed(diff, Path(tmp), runs, {"CORRAL_PLAN_CACHE": "off"})))
            cache = {"CORRAL_PLAN_CACHE": str(Path(tmp) / "cache")}
            timed(diff, Path(tmp), 1, cache)  # primes the cache
            rows.append((label + ", warm", *timed(diff, Path(tmp), runs, cache)))
            if cluster == "heron":
                rows.append((label + ", --no-plan", *timed([*diff, "--no-plan"], Path(tmp), runs, {})))
    load = os.getloadavg()[0]
    print(f"{'case':<50} {'median s':>9} {'best s':>7} {'CPU s':>6} {'target s':>9}"
          f"   (load average {load:.1f}, {os.cpu_count()} CPUs)")
    for label, median, best, cpu in rows:
        print(f"{label:<50} {median:>9.2f} {best:>7.2f} {cpu:>6.2f} {TARGET:>9.1f} {'ok' if median < TARGET else 'SLOW'}")


if __name__ == "__main__":
    main()
