"""Hosts that answer ssh-keyscan, for tests without hosts: the fake ssh-keyscan
and ssh (tests/nodes/fake_ssh_keyscan, fake_ssh) first on PATH, and the
network they read (who answers where, with which keys)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path

HERE = Path(__file__).resolve().parent


def fake_key(seed: str, key_type: str = "ssh-ed25519") -> str:
    """A base64 public key of OpenSSH's wire shape (RFC 4253 6.6: the type, then 32 bytes), not a real key."""
    def string(data: bytes) -> bytes:
        return len(data).to_bytes(4, "big") + data

    return base64.b64encode(string(key_type.encode()) + string(hashlib.sha256(seed.encode()).digest())).decode()


class FakeSshNetwork:
    def __init__(self, folder: Path):
        self.path = folder / "network.json"
        self.bin = folder / "fake-ssh-bin"
        self.bin.mkdir(parents=True)
        (self.bin / "ssh-keyscan").symlink_to(HERE / "fake_ssh_keyscan")
        (self.bin / "ssh").symlink_to(HERE / "fake_ssh")
        self.hosts: dict[str, dict] = {}
        self._save()

    def _save(self) -> None:
        self.path.write_text(json.dumps({"hosts": self.hosts}))

    def add(self, address: str, port: int = 22, generation: int = 0) -> list[list[str]]:
        """A host answering at `address`; `generation` > 0: it was reinstalled (new keys)."""
        keys = [["ssh-ed25519", fake_key(f"{address}/{generation}/ed25519")],
                ["ecdsa-sha2-nistp256", fake_key(f"{address}/{generation}/ecdsa", "ecdsa-sha2-nistp256")]]
        self.hosts[address] = {"port": port, "keys": keys}
        self._save()
        return keys

    def remove(self, address: str) -> None:
        del self.hosts[address]
        self._save()

    def calls(self) -> list[dict]:
        log = Path(f"{self.path}.log")
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    def install(self, monkeypatch) -> FakeSshNetwork:
        monkeypatch.setenv("PATH", f"{self.bin}{os.pathsep}{os.environ['PATH']}")
        monkeypatch.setenv("FAKE_SSH_NETWORK", str(self.path))
        return self
