#!/usr/bin/env python3
"""etcd disk preflight: fdatasync latency of the data disk, against etcd's < 10 ms p99 guidance.

Shipped to every member as /usr/local/sbin/corral-etcd-disk-preflight (this
file, stdlib only: python3 is on every image) and run by the etcd unit's
drop-in before etcd starts. It replays etcd's WAL pattern, which is also
etcd's own fio recipe (etcd.io/docs "hardware": `fio --rw=write
--ioengine=sync --fdatasync=1 --bs=2300`): sequential 2300-byte appends,
each followed by fdatasync, in a file on the data disk. Bounded by a count
and a time limit so a slow disk delays the start by seconds, not minutes.

Why not fio: it is not on the node images, and installing it at boot makes
the start depend on a package mirror. Why not `etcdctl check perf`: it
measures the whole cluster through the network and needs the member
running; this must run before the member starts.

Prints one line (and, with --json, the figures); writes the figures to
--metrics for node_exporter's textfile collector. Exit status: 0 when within
the limit, or when over it without --enforce (a slow disk is reported loudly,
but a member that cannot start hurts the quorum more); 1 with --enforce.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

WAL_ENTRY_BYTES = 2300
GUIDANCE_P99_MS = 10.0


def probe(directory: str, max_writes: int = 1000, max_seconds: float = 10.0) -> dict:
    """fdatasync latencies (ms) of sequential WAL-sized appends in `directory`."""
    path = os.path.join(directory, f".corral-disk-probe.{os.getpid()}")
    block = os.urandom(WAL_ENTRY_BYTES)
    latencies: list[float] = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        deadline = time.monotonic() + max_seconds
        while len(latencies) < max_writes and time.monotonic() < deadline:
            os.write(fd, block)
            start = time.perf_counter()
            os.fdatasync(fd)
            latencies.append((time.perf_counter() - start) * 1000)
    finally:
        os.close(fd)
        os.unlink(path)
    latencies.sort()

    def pct(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(len(latencies) * p))]

    return {"directory": directory, "writes": len(latencies), "p50_ms": round(pct(0.50), 3),
            "p99_ms": round(pct(0.99), 3), "max_ms": round(latencies[-1], 3), "limit_ms": GUIDANCE_P99_MS}


def metrics(result: dict) -> str:
    lines = []
    for name, key, text in (("corral_etcd_disk_fsync_p99_seconds", "p99_ms", "fdatasync p99 at the last preflight"),
                            ("corral_etcd_disk_fsync_p50_seconds", "p50_ms", "fdatasync p50 at the last preflight")):
        lines += [f"# HELP {name} {text}", f"# TYPE {name} gauge", f"{name} {result[key] / 1000:.6f}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("directory", help="a directory on the data disk (etcd's data dir)")
    parser.add_argument("--max-writes", type=int, default=1000)
    parser.add_argument("--max-seconds", type=float, default=10.0)
    parser.add_argument("--limit-ms", type=float, default=GUIDANCE_P99_MS)
    parser.add_argument("--enforce", action="store_true", help="exit 1 when p99 is over the limit")
    parser.add_argument("--metrics", help="write Prometheus textfile metrics here")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        result = probe(args.directory, args.max_writes, args.max_seconds)
    except OSError as err:
        print(f"corral etcd disk preflight: cannot probe {args.directory}: {err}", file=sys.stderr)
        return 1 if args.enforce else 0
    result["limit_ms"] = args.limit_ms
    result["ok"] = result["p99_ms"] < args.limit_ms
    verdict = "ok" if result["ok"] else "TOO SLOW"
    print(f"corral etcd disk preflight: {verdict}: fdatasync p99 {result['p99_ms']:.2f} ms "
          f"(p50 {result['p50_ms']:.2f} ms, max {result['max_ms']:.2f} ms, {result['writes']} writes of "
          f"{WAL_ENTRY_BYTES} bytes) in {args.directory}; etcd needs p99 < {args.limit_ms:g} ms",
          file=sys.stdout if result["ok"] else sys.stderr)
    if args.json:
        print(json.dumps(result))
    if args.metrics:
        os.makedirs(os.path.dirname(args.metrics), exist_ok=True)
        with open(args.metrics + ".tmp", "w") as out:
            out.write(metrics(result))
        os.replace(args.metrics + ".tmp", args.metrics)
    return 1 if args.enforce and not result["ok"] else 0


if __name__ == "__main__":
    sys.exit(main())
