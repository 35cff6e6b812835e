"""How long `corral diff` takes for a one-pool change on the example fleet, interpreter start included.

Target (issue 6): under 6 s wall. Each case copies the example fleet (and
stacks/) into a throwaway git repository, commits it on `main`, changes one
pool of one cluster in the working tree and times `corral diff` (semantic
diff plus the offline Pulumi plan of both sides, run in parallel). The
`--no-plan` row is the semantic diff alone.

    python benchmarks/bench_diff.py [--runs N]
"""

from __future__ import annotations

import argparse
import os
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
    ("ibis (gcp): gpu-l4 max 64 -> 96", "ibis", "maxSize: 64", "maxSize: 96"),
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


def timed(args: list[str], cwd: Path, runs: int) -> tuple[float, float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        result = subprocess.run(args, cwd=cwd, capture_output=True, text=True)
        times.append(time.perf_counter() - start)
        if result.returncode != 0:
            sys.exit(f"{' '.join(args)} failed:\n{result.stdout}{result.stderr}")
    return statistics.median(times), min(times)


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
            path.write_text(path.read_text().replace(old, new, 1))
            rows.append((label, *timed([*corral, "diff", "--clusters", str(clusters)], Path(tmp), runs)))
            if cluster == "heron":
                rows.append((label + ", --no-plan",
                             *timed([*corral, "diff", "--no-plan", "--clusters", str(clusters)], Path(tmp), runs)))
    load = os.getloadavg()[0]
    print(f"{'case':<52} {'median s':>9} {'best s':>7} {'target s':>9}   (load average {load:.1f}, {os.cpu_count()} CPUs)")
    for label, median, best in rows:
        print(f"{label:<52} {median:>9.2f} {best:>7.2f} {TARGET:>9.1f} {'ok' if median < TARGET else 'SLOW'}")


if __name__ == "__main__":
    main()
