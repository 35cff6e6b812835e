"""The closed GPU fault loop, case by case (issue 27, item 5): how long from a fault to the taint, the
drain, the repair, the burn-in and the readmission, and whether the node came back.

Runs every case of the fault-injection suite (tests/health/faultlab/cases.py) in the lab
(tests/health/faultlab/lab.py): a pool of simulated GPU nodes, each with the real health agent, and
the real repair controller (two replicas, leader-elected) against the recording fake API server, in
simulated time. The hardware's own durations are the lab's (host.py: a reboot 180 s, `nvidia-smi -r`
5 s, `dcgmi diag -r 3` 15 minutes as NVIDIA's dcgmi-diag reference gives it, one all_reduce_perf 60 s);
everything between them is the loop's: the agent's detection and writes, the controller's cordon,
drain, decision and readmission.

    python benchmarks/bench_fault_loop.py [--dcgm-level 3] [--case NAME ...] [--json FILE]

Prints one row per faulted node, then p50/p95 of each phase over every node that went through it:
detect (fault written -> taint), wait (taint -> cordon: the controller's settle time and budgets),
drain (cordon -> repair requested), repair (-> the agent's "done"), burn_in (-> its result),
readmit (passed burn-in -> uncordoned), total (fault -> back in service).
Exit status 1 when a case ends in another state than expected, a node was readmitted while broken,
or p95 detection-to-taint is over 10 s.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.health.faultlab import cases as C
from tests.health.faultlab.controller import missing_pieces
from tests.health.faultlab.runner import median, percentile, problems, run_case

TARGET_P95_DETECTION_SECONDS = 10.0
PHASES = ("detect", "wait", "drain", "repair", "burn_in", "readmit", "total")


def seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if value >= 10 else f"{value:.1f}"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dcgm-level", type=int, default=3, help="health.burnIn.dcgmLevel (default 3)")
    parser.add_argument("--case", action="append", choices=sorted(C.BY_NAME), help="only these cases")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    missing = missing_pieces()
    if missing:
        print("missing, the loop cannot close: " + "; ".join(missing), file=sys.stderr)
    chosen = [C.BY_NAME[n] for n in args.case] if args.case else list(C.CASES)
    results, started = [], time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="bench-fault-loop-"))
    for case in chosen:
        results.append(run_case(case, workdir / case.name, burn_in={"dcgm_level": args.dcgm_level}))
    wall = time.monotonic() - started

    header = (f"{'case':<22} {'expected':<16} {'node':<8} {'actions':<16} {'burn-ins':<14} "
              + " ".join(f"{p:>8}" for p in PHASES) + f" {'readmit?':>8} {'false':>5}  verdict")
    print(f"fault loop, simulated seconds (DCGM level {args.dcgm_level}); {len(chosen)} cases in {wall:.0f} s")
    print(header)
    print("-" * len(header))
    failed_cases, rows = [], []
    for result in results:
        found = problems(result)
        if found:
            failed_cases.append((result.case.name, found))
        for r in result.rows:
            rows.append(r)
            print(f"{result.case.name:<22} {result.case.expect:<16} {r.node:<8} {','.join(r.actions) or '-':<16} "
                  f"{','.join(r.burn_ins) or '-':<14} " + " ".join(f"{seconds(getattr(r, p)):>8}" for p in PHASES)
                  + f" {'yes' if r.readmitted else 'no':>8} {r.false_readmissions:>5}  {'ok' if not found else 'FAIL'}")
    print("-" * len(header))
    for label, stat in (("p50", lambda v: median(v)), ("p95", lambda v: percentile(v, 95))):
        print(f"{label:<22} {'':<16} {'':<8} {'':<16} {'':<14} "
              + " ".join(f"{seconds(stat([getattr(r, p) for r in rows])):>8}" for p in PHASES))
    false_total = sum(r.false_readmissions for r in rows)
    p95_detect = percentile([r.detect for r in rows], 95)
    print(f"\nfalse readmissions: {false_total}; p95 detection-to-taint: {seconds(p95_detect)} s "
          f"(target {TARGET_P95_DETECTION_SECONDS:g} s); cases not in their expected state: {len(failed_cases)}")
    for name, found in failed_cases:
        print(f"  {name}: " + "; ".join(found))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    ok = not failed_cases and false_total == 0 and p95_detect is not None \
        and p95_detect <= TARGET_P95_DETECTION_SECONDS
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
