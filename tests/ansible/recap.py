"""Reading ansible-playbook's PLAY RECAP, shared by the role tests."""

from __future__ import annotations

import re

RECAP = re.compile(
    r"^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)",
    re.MULTILINE,
)


def parse_recap(stdout: str) -> dict[str, dict[str, int]]:
    """host -> {ok, changed, unreachable, failed} from the recap lines."""
    return {
        m[0]: {"ok": int(m[1]), "changed": int(m[2]), "unreachable": int(m[3]), "failed": int(m[4])}
        for m in RECAP.findall(stdout)
    }
