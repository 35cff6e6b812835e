"""etcd lifecycle figures on real etcd (Debian's 3.4, three TLS members on loopback).

- snapshot: time of `snapshot save` (the scheduled job's step) + `snapshot status`
  of a database of --keys keys (default 100,000, values of --value-bytes) and the file's size;
- restore: `snapshot restore` of that file into a new data dir, and the
  restored member's start until healthy;
- replacement: `corral.etcd.replace_member` of the leader (gate, move leader,
  remove, add, start, wait until caught up), while a writer keeps writing;
  writes lost = acknowledged puts missing afterwards (must be 0).

Keys are loaded through etcd's gRPC gateway (/v3/kv/txn, 128 puts per
transaction: etcd's --max-txn-ops default) to keep the load short.

    python benchmarks/bench_etcd.py [--keys N] [--value-bytes B]
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import shutil
import ssl
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from corral.etcd import EtcdError, cluster_status, replace_member  # noqa: E402
from tests.etcd.local import LocalCluster  # noqa: E402

TXN_OPS = 128


def load(cluster: LocalCluster, keys: int, value_bytes: int) -> None:
    member = next(iter(cluster.members.values()))
    context = ssl.create_default_context(cafile=cluster.client_tls.cacert)
    context.load_cert_chain(cluster.client_tls.cert, cluster.client_tls.key)
    conn = http.client.HTTPSConnection("127.0.0.1", member.client_port, context=context)
    value = base64.b64encode(b"v" * value_bytes).decode()
    for start in range(0, keys, TXN_OPS):
        ops = [{"requestPut": {"key": base64.b64encode(f"/registry/bench/{i:07d}".encode()).decode(), "value": value}}
               for i in range(start, min(keys, start + TXN_OPS))]
        conn.request("POST", "/v3/kv/txn", json.dumps({"success": ops}), {"Content-Type": "application/json"})
        response = conn.getresponse()
        body = response.read()
        if response.status != 200:
            raise SystemExit(f"load failed: {response.status} {body[:200]!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--value-bytes", type=int, default=256)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-etcd-"))
    cluster = LocalCluster(root).boot(["m0", "m1", "m2"])
    try:
        t = time.monotonic()
        load(cluster, args.keys, args.value_bytes)
        print(f"loaded {args.keys} keys of {args.value_bytes} bytes in {time.monotonic() - t:.1f} s")
        ctl = cluster.ctl()
        snap = root / "snap.db"
        t = time.monotonic()
        ctl.snapshot_save(str(snap))
        status = ctl.snapshot_status(str(snap))
        print(f"snapshot: {time.monotonic() - t:.2f} s (save + verify), {snap.stat().st_size / 1024**2:.1f} MiB, "
              f"{status.total_keys} keys, revision {status.revision}")

        restored = LocalCluster(root / "restored", ca=cluster.ca)
        member = restored.member("r0")
        t = time.monotonic()
        ctl.snapshot_restore(str(snap), name="r0", initial_cluster=f"r0={member.peer_url}", cluster_token="r",
                             peer_url=member.peer_url, data_dir=str(member.data_dir))
        restore_s = time.monotonic() - t
        member.start(f"r0={member.peer_url}", "new", "r")
        restored.wait_healthy(120)
        print(f"restore: {restore_s:.2f} s (snapshot restore), {time.monotonic() - t:.2f} s until the member is healthy")
        restored.stop()

        leader = cluster_status(ctl).leader
        old = cluster.members.pop(leader.name)
        new = cluster.member(leader.name)
        cluster.members[leader.name] = old
        acked: list[str] = []
        stop = threading.Event()

        def writer() -> None:
            w = cluster.ctl()
            i = 0
            while not stop.is_set():
                try:
                    w._exec(w.command("put", f"/w/{i:06d}", "x", json_output=False), 20)
                    acked.append(f"/w/{i:06d}")
                    i += 1
                except EtcdError:
                    time.sleep(0.1)

        def start_new(name: str, initial: str) -> None:
            old.kill()
            shutil.rmtree(old.data_dir, ignore_errors=True)
            cluster.members[name] = new
            new.start(initial, "existing", cluster.token)

        thread = threading.Thread(target=writer)
        thread.start()
        time.sleep(1)
        change = replace_member(ctl, leader.name, new.peer_url, start_new, timeout=300)
        time.sleep(1)
        stop.set()
        thread.join()
        data = cluster.ctl()._call("get", "/w/", "--prefix", "--keys-only", timeout=120)
        present = {base64.b64decode(kv["key"]).decode() for kv in data.get("kvs", [])}
        lost = len(set(acked) - present)
        steps = ", ".join(f"{s} {d:.2f} s" for s, d in change.steps)
        print(f"replacement of the leader ({args.keys} keys to catch up): {change.seconds:.1f} s ({steps}); "
              f"{len(acked)} writes acknowledged during it, {lost} lost")
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
