"""Run the test suite tier by tier, and print each tier's wall time and the total.

    python scripts/tiers.py            every tier
    python scripts/tiers.py unit       the named tiers only (the inner loop: unit)

Called by scripts/test (the README's test command, what CI runs). Each tier is
one pytest run; a tier that fails does not stop the others, so one run shows
every failure. What each tier proves and how long it takes: docs/testing.md.

Where the quickstart tier can run (root, systemd-nspawn), it runs the README's
test command on a fresh Debian 12 as a normal user, and that run is the unit
tier: here only the unit tests that need root run (`-m root`), so the suite
runs once, not twice. With uncommitted changes to tracked files (the
quickstart clones the committed HEAD) the unit tier runs here too. The
quickstart and hostlab tiers run side by side: both mostly wait on their
machines, and one after the other they would not fit CI's budget.

The last lines are a table of the tiers (and of scripts/test's install step,
$CORRAL_INSTALL_SECONDS, counted in the total) and one closing line,
`tests: N passed, N failed, N skipped`, summed over the tiers from their JUnit
reports (the quickstart's inner run from its record). Exit status 1 when any
tier failed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# pytest's exit status when a selection collects nothing: not a failure of the tier.
NO_TESTS_COLLECTED = 5
# Hostlab test modules run side by side, each on its own bridge (tests/hostlab/fixtures.py);
# with the quickstart beside them, two workers keep the two cores busy.
HOSTLAB_WORKERS = 2
# A line while tiers run side by side, so a long run is not silent.
HEARTBEAT_SECONDS = 120
UNIT = "not hostlab and not quickstart and not kube"


@dataclass
class Tier:
    name: str
    what: str
    args: list[str]
    # (ok, reason): whether this machine can run the tier's tests; without it they
    # still run, and skip with the reason, in one process
    available: tuple[bool, str] = (True, "")
    parallel_args: list[str] = field(default_factory=list)
    # tiers of one group run side by side
    group: str = ""


@dataclass
class Result:
    name: str
    seconds: float
    code: int
    passed: int = 0
    failed: int = 0
    skipped: int = 0


def tracked_changes() -> bool:
    """Uncommitted changes to tracked files (the quickstart would not see them)."""
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return True
    return out.returncode != 0 or bool(out.stdout.strip())


TIER_NAMES = ("unit", "hostlab", "quickstart", "kube")


def tiers(wanted: list[str]) -> list[Tier]:
    """The `wanted` tiers, in order; the unit tier runs in the quickstart's only when both are wanted."""
    from tests.hostlab.lab import available as hostlab_available
    from tests.kube.lab import available as kube_available
    from tests.quickstart.freshroot import available as quickstart_available

    quickstart = quickstart_available()
    unit_in_quickstart = {"unit", "quickstart"} <= set(wanted) and quickstart[0] and not tracked_changes()
    unit = (Tier("unit", "the unit tests that need root; the rest run in the quickstart tier, as a normal user",
                 ["-m", f"root and {UNIT}"])
            if unit_in_quickstart else
            Tier("unit", "everything but throwaway hosts, in parallel", ["-m", UNIT], parallel_args=["-n", "auto"]))
    every = [
        unit,
        Tier("hostlab", "roles, joins, etcd and health on systemd-nspawn hosts", ["-m", "hostlab"],
             hostlab_available(), ["-n", str(HOSTLAB_WORKERS), "--dist", "loadfile"], group="machines"),
        Tier("quickstart", "the README's two commands on a fresh Debian 12 root"
             + (" (and, as a normal user, the unit tier)" if unit_in_quickstart else ""),
             ["-m", "quickstart"], quickstart, group="machines"),
        Tier("kube", "corral's configuration and manifests on the real control plane, built from Go modules",
             ["-m", "kube"], kube_available(), group="machines"),
    ]
    return [t for t in every if t.name in wanted]


def counts(report: Path) -> tuple[int, int, int]:
    """(passed, failed, skipped) of a JUnit report; errors count as failed."""
    if not report.exists():
        return 0, 0, 0
    root = ET.parse(report).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    total = failed = skipped = 0
    for suite in suites:
        total += int(suite.get("tests", 0))
        failed += int(suite.get("failures", 0)) + int(suite.get("errors", 0))
        skipped += int(suite.get("skipped", 0))
    return total - failed - skipped, failed, skipped


def start(tier: Tier, reports: Path, output) -> subprocess.Popen:
    ok, reason = tier.available
    args = [*tier.args, *(tier.parallel_args if ok else [])]
    print(f"\n=== tier {tier.name}: {tier.what}" + ("" if ok else f" (its tests skip here: {reason})"),
          file=output, flush=True)
    return subprocess.Popen([sys.executable, "-m", "pytest", *args, f"--junitxml={reports / tier.name}.xml",
                             "--durations=15"], cwd=ROOT, stdout=output, stderr=subprocess.STDOUT)


def finish(tier: Tier, proc: subprocess.Popen, started: float, reports: Path) -> Result:
    code = proc.wait()
    result = Result(tier.name, time.monotonic() - started, code, *counts(reports / f"{tier.name}.xml"))
    if code == NO_TESTS_COLLECTED:
        result.code = 0
    return result


def run_group(group: list[Tier], reports: Path) -> list[Result]:
    """One tier in the foreground, or several side by side with their output printed, in
    order, as each finishes."""
    if len(group) == 1:
        started = time.monotonic()
        return [finish(group[0], start(group[0], reports, sys.stdout), started, reports)]
    print(f"\n=== tiers {', '.join(t.name for t in group)}: side by side; each one's output follows when it ends",
          flush=True)
    running = []
    for tier in group:
        log = open(reports / f"{tier.name}.log", "w+")  # noqa: SIM115 (closed below)
        running.append((tier, start(tier, reports, log), log, time.monotonic()))
    results: dict[str, Result] = {}
    last_beat = time.monotonic()
    while len(results) < len(running):
        for tier, proc, log, started in running:
            if tier.name not in results and proc.poll() is not None:
                results[tier.name] = finish(tier, proc, started, reports)
                log.seek(0)
                sys.stdout.write(log.read())
                log.close()
                print(f"=== tier {tier.name} ended after {minutes(results[tier.name].seconds)}", flush=True)
        if time.monotonic() - last_beat > HEARTBEAT_SECONDS:
            last_beat = time.monotonic()
            still = [t.name for t, *_ in running if t.name not in results]
            print(f"... still running: {', '.join(still)}", flush=True)
        time.sleep(1)
    return [results[t.name] for t in group]


def quickstart_inner_run() -> Result | None:
    """The unit tier the quickstart ran as a normal user, from its record."""
    from tests.quickstart.freshroot import WORK

    record = WORK / "timings.json"
    if not record.exists():
        return None
    user = json.loads(record.read_text()).get("user", {})
    if "passed" not in user:
        return None
    return Result("unit (in quickstart, as a normal user)", user.get("test_first_s", 0.0),
                  0 if user.get("failed", 1) == 0 else 1, user["passed"], user.get("failed", 0), user.get("skipped", 0))


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}m{seconds % 60:04.1f}s"


def table(results: list[Result], total_seconds: float, install_seconds: float | None, overlapped: bool) -> str:
    width = max(10, *(len(r.name) for r in results))
    lines = ["", f"{'tier':<{width}}  wall        passed  failed  skipped  status",
             f"{'-' * width}  ----------  ------  ------  -------  ------"]
    if install_seconds is not None:
        lines.append(f"{'(install)':<{width}}  {minutes(install_seconds):>10}")
    for r in results:
        status = "ok" if r.code == 0 else f"FAILED (exit {r.code})"
        lines.append(f"{r.name:<{width}}  {minutes(r.seconds):>10}  {r.passed:>6}  {r.failed:>6}  {r.skipped:>7}  {status}")
    lines.append(f"{'total':<{width}}  {minutes(total_seconds):>10}  {sum(r.passed for r in results):>6}  "
                 f"{sum(r.failed for r in results):>6}  {sum(r.skipped for r in results):>7}")
    if overlapped:
        lines.append("(tiers side by side overlap, and the quickstart's inner run is inside its own wall:"
                     " the rows add up to more than the total)")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    wanted = argv or list(TIER_NAMES)
    unknown = [name for name in wanted if name not in TIER_NAMES]
    if unknown:
        print(f"tiers: no tier {', '.join(unknown)} (tiers: {', '.join(TIER_NAMES)})", file=sys.stderr)
        return 2
    selected = tiers(wanted)
    groups: list[list[Tier]] = []
    for tier in selected:
        if tier.group and groups and groups[-1][0].group == tier.group:
            groups[-1].append(tier)
        else:
            groups.append([tier])
    if any(t.name == "quickstart" for t in selected):
        from tests.quickstart.freshroot import WORK

        (WORK / "timings.json").unlink(missing_ok=True)  # the inner run's record is this run's only
    started = time.monotonic()
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="corral-tiers-") as tmp:
        for group in groups:
            results += run_group(group, Path(tmp))
    if any(t.name == "quickstart" for t in selected) and (inner := quickstart_inner_run()):
        results.append(inner)
    install = os.environ.get("CORRAL_INSTALL_SECONDS", "")
    install_seconds = float(install) if install.isdigit() else None
    overlapped = any(len(g) > 1 for g in groups) or len(results) > len(selected)
    print(table(results, time.monotonic() - started + (install_seconds or 0), install_seconds, overlapped))
    passed, failed, skipped = (sum(getattr(r, k) for r in results) for k in ("passed", "failed", "skipped"))
    failed_tiers = [r.name for r in results if r.code != 0]
    if failed_tiers and not failed:
        failed = len(failed_tiers)  # a tier that broke before its tests ran still fails the run
    print(f"tests: {passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed_tiers else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
