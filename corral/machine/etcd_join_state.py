#!/usr/bin/env python3
"""Before etcd starts on an EMPTY data dir: join a running cluster, or bootstrap a new one.

Shipped to every member as /usr/local/sbin/corral-etcd-join-state (stdlib
only) and run by etcd.service's drop-in before etcd. A member's rendered
configuration says `initial-cluster-state: new` (its first boot, with the
whole cluster). A machine that replaces a member, or a member added to a
grown cluster, boots with that same configuration; `new` would make it
bootstrap a cluster of its own. So, when the data dir holds no `member/`:

- ask the other members in `initial-cluster` (`etcdctl member list`, with
  the member's own peer certificate, which is also a client certificate);
- none answers: a new cluster's first boot, leave the file as it is;
- a running cluster lists this member's peer URL as added but not started
  (after `corral etcd replace` / `member add`): rewrite the file to
  `initial-cluster-state: existing` with the cluster's current
  `initial-cluster`;
- a running cluster lists it by name but not started: a member of the
  first bootstrap booting later than the others; leave the file as it is;
- a running cluster does not list it, or lists it as started (client URLs
  published: its data was lost): refuse (exit 1). systemd retries (Restart=always) until an operator
  runs `corral etcd replace`; etcd never starts a second cluster.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys


def _field(text: str, key: str) -> str:
    match = re.search(rf'^\s*{re.escape(key)}:\s*"?([^"\n]*)"?\s*$', text, re.M)
    if not match:
        raise SystemExit(f"corral etcd join: no {key} in the configuration")
    return match.group(1)


def member_list(etcdctl: str, endpoint: str, pki: str) -> list[dict] | None:
    try:
        proc = subprocess.run(
            [etcdctl, f"--endpoints={endpoint}", f"--cacert={pki}/ca.crt", f"--cert={pki}/peer.crt",
             f"--key={pki}/peer.key", "--command-timeout=5s", "-w", "json", "member", "list"],
            capture_output=True, text=True, timeout=15, env={**os.environ, "ETCDCTL_API": "3"},
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    try:
        return json.loads(proc.stdout).get("members", [])
    except json.JSONDecodeError:
        return None


def main(argv: list[str]) -> int:
    config_path, data_dir = argv[1], argv[2]
    if os.path.isdir(os.path.join(data_dir, "member")):
        return 0  # a member with data: etcd ignores initial-cluster settings anyway
    text = open(config_path).read()
    name = _field(text, "name")
    my_peer = _field(text, "initial-advertise-peer-urls")
    pki = os.path.dirname(_field(text, "cert-file"))
    etcdctl = shutil.which("etcdctl", path=os.environ.get("PATH", "") + ":/usr/local/bin:/usr/bin") or "etcdctl"
    peers = [pair.split("=", 1)[1] for pair in _field(text, "initial-cluster").split(",") if "=" in pair]
    members = None
    for peer in peers:
        if peer != my_peer:
            members = member_list(etcdctl, peer.replace(":2380", ":2379"), pki)
            if members is not None:
                break
    if members is None:
        print(f"corral etcd join: no running cluster answers; {name} starts as configured")
        return 0
    me = [m for m in members if my_peer in m.get("peerURLs", [])]
    if not me:
        print(f"corral etcd join: the running cluster does not list {name} ({my_peer}); add it first "
              f"(corral etcd replace / member add)", file=sys.stderr)
        return 1
    # A member that has run publishes its client URLs. A member of the
    # cluster's static bootstrap (initial-cluster) that has not started yet is
    # listed with its name and no client URLs: a staggered first boot, which
    # joins as configured. One added by `member add` has neither.
    if me[0].get("clientURLs"):
        print(f"corral etcd join: {name} is a started member but its data dir is empty (data lost?); "
              f"replace it: corral etcd replace CLUSTER {name}", file=sys.stderr)
        return 1
    if me[0].get("name"):
        print(f"corral etcd join: {name} is a member of the cluster's first bootstrap, not started yet; "
              "it starts as configured")
        return 0
    initial = ",".join(f"{m.get('name') or name}={url}" for m in members for url in m.get("peerURLs", []))
    text = re.sub(r"^initial-cluster-state:.*$", "initial-cluster-state: existing", text, flags=re.M)
    text = re.sub(r"^initial-cluster:.*$", lambda _: f"initial-cluster: {json.dumps(initial)}", text, flags=re.M)
    with open(config_path + ".tmp", "w") as out:
        out.write(text)
    before = os.stat(config_path)
    os.chmod(config_path + ".tmp", before.st_mode & 0o777)
    os.chown(config_path + ".tmp", before.st_uid, before.st_gid)
    os.replace(config_path + ".tmp", config_path)
    print(f"corral etcd join: {name} joins the running cluster (initial-cluster-state: existing, {initial})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
