"""The one way doctor calls another program: read-only, with a timeout, never a traceback.

A missing program, a timeout or an answer that is not what the program's
documentation says it prints becomes `Unanswered`, whose message is the
finding and whose `fix` is what to do (for a missing program: how to
install it). Nothing a CLI prints is shown unless a check chooses a line of
it, escaped to one line.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.model.document import one_line

DEFAULT_TIMEOUT = 30.0

# Where each program comes from (the vendors' install pages).
INSTALL_HINTS = {
    "pulumi": "install the Pulumi CLI: curl -fsSL https://get.pulumi.com | sh (https://www.pulumi.com/docs/install/)",
    "aws": "install the AWS CLI v2 (https://docs.aws.amazon.com/cli/latest/userguide/getting-started-install.html)",
    "gcloud": "install the Google Cloud CLI (https://cloud.google.com/sdk/docs/install)",
    "az": "install the Azure CLI (https://learn.microsoft.com/cli/azure/install-azure-cli)",
    "ssh": "apt-get install openssh-client",
    "ping": "apt-get install iputils-ping",
}

# Keep the CLIs from prompting, paging or phoning home: doctor runs unattended.
# PULUMI_SKIP_UPDATE_CHECK: what Pulumi's own Python automation API sets
# (pulumi/automation/_cmd.py); AWS_PAGER="": the AWS CLI v2 pages output
# through `less` unless it is empty (AWS CLI user guide, "Using AWS CLI
# pagination options", client-side pager); CLOUDSDK_CORE_DISABLE_PROMPTS=1:
# gcloud's core/disable_prompts property (gcloud topic configurations).
QUIET_ENV = {"PULUMI_SKIP_UPDATE_CHECK": "true", "AWS_PAGER": "", "CLOUDSDK_CORE_DISABLE_PROMPTS": "1"}


class Unanswered(Exception):
    """A program could not give an answer; the message is the finding, `fix` the remedy."""

    def __init__(self, finding: str, fix: str = "") -> None:
        super().__init__(finding)
        self.fix = fix


@dataclass(frozen=True)
class Answer:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def shown(self) -> str:
        """The command as a person would type it (first words only: arguments can be long)."""
        return shlex.join(self.argv[:4]) + (" ..." if len(self.argv) > 4 else "")

    def error_line(self, limit: int = 240) -> str:
        """The last non-empty line of stderr (or stdout), one line, shortened."""
        lines = [line.strip() for line in (self.stderr or self.stdout).splitlines() if line.strip()]
        text = one_line(lines[-1]) if lines else f"exit {self.returncode}, no message"
        return text if len(text) <= limit else text[: limit - 3] + "..."

    def json(self) -> Any:
        try:
            return json.loads(self.stdout)
        except json.JSONDecodeError:
            raise Unanswered(f"`{self.shown}` did not print JSON ({self.error_line()})",
                             f"run `{self.shown}` by hand to see why") from None


class Cli:
    """Runs programs for the checks: found on PATH, no stdin, a timeout, the quiet environment."""

    def __init__(self, timeout: float = DEFAULT_TIMEOUT, env: dict[str, str] | None = None) -> None:
        self.timeout = timeout
        self.env = {**(env if env is not None else os.environ), **QUIET_ENV}

    def available(self, program: str) -> bool:
        return shutil.which(program, path=self.env.get("PATH")) is not None

    def run(self, argv: list[str], cwd: Path | None = None, timeout: float | None = None) -> Answer:
        program = shutil.which(argv[0], path=self.env.get("PATH"))
        if program is None:
            raise Unanswered(f"{argv[0]} is not installed (not on PATH)", INSTALL_HINTS.get(argv[0], ""))
        limit = timeout or self.timeout
        try:
            done = subprocess.run([program, *argv[1:]], capture_output=True, text=True, errors="replace",
                                  stdin=subprocess.DEVNULL, timeout=limit, cwd=cwd, env=self.env, check=False)
        except subprocess.TimeoutExpired:
            raise Unanswered(f"`{shlex.join(argv[:4])}` did not answer within {limit:g} s",
                             "check the network (proxy, VPN) or pass a longer --timeout") from None
        except OSError as error:
            raise Unanswered(f"cannot run {argv[0]}: {error.strerror}", INSTALL_HINTS.get(argv[0], "")) from None
        return Answer(tuple(argv), done.returncode, done.stdout, done.stderr)
