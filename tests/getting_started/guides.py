"""Read a getting-started guide into steps, and run them as a user would, in order.

The convention (docs/getting-started/README.md says it to authors):

- ```console blocks: a line starting with `$ ` is a command (a line ending
  in `\\` continues it on the next one); every other line is output the
  command prints, and each such line must appear in what it really prints
  (spaces collapsed; a `...` line stands for lines left out, `...` within a
  line for any text there, such as a count that grows with the add-ons).
- A command the test does not run ends with `# not run: REASON`; the reason
  is visible in the guide, and the test keeps its own list of them
  (NOT_RUN in test_guides.py): a marker the list lacks, or a list entry the
  guide lacks, fails.
- ```diff blocks: an edit of a file, applied where it stands (`git apply -p1`).
- ```yaml (or ```json) blocks whose first line is `# file: PATH`: a file the
  reader saves at PATH.
- Every other block (```yaml without the file line, ```text) is shown only.

`run_guide` writes every step into ONE bash script (so `export`, `.` and
`cd` carry over, as in the reader's shell) that records each step's output
and exit code, and stops at the first step that fails.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

FENCE = re.compile(r"^```(\w*)\s*$")
NOT_RUN = re.compile(r"\s+# not run: (?P<reason>.+)$")
FILE_LINE = re.compile(r"^# file: (?P<path>\S+)\s*$")


@dataclass
class Step:
    kind: str                  # "command" | "patch" | "file"
    text: str                  # the command, the diff, or the file's content
    line: int                  # where it starts in the guide (1-based)
    expected: list[str] = field(default_factory=list)   # output lines shown under a command
    path: str = ""             # a file step's path
    not_run: str = ""          # the visible reason a command is not run
    guide: Path = Path()       # the guide it is in

    @property
    def label(self) -> str:
        return f"{self.guide.name}:{self.line}: {self.text if self.kind == 'command' else self.kind + ' ' + self.path}"


class GuideError(ValueError):
    """A guide that breaks the convention: file and line named."""


def read_steps(guide: Path) -> list[Step]:
    steps = _read_steps(guide)
    for step in steps:
        step.guide = guide
    return steps


def _read_steps(guide: Path) -> list[Step]:
    lines = guide.read_text().splitlines()
    steps: list[Step] = []
    at = 0
    while at < len(lines):
        match = FENCE.match(lines[at])
        if not match or not match.group(1):
            at += 1
            continue
        language, start = match.group(1), at + 1
        end = start
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        if end == len(lines):
            raise GuideError(f"{guide}:{at + 1}: ```{language} block is never closed")
        body = lines[start:end]
        if language == "console":
            steps.extend(_console_steps(guide, body, start + 1))
        elif language == "diff":
            steps.append(Step("patch", "\n".join(body) + "\n", start + 1, path=_patched_path(guide, body, start)))
        elif language in ("yaml", "json") and body and FILE_LINE.match(body[0]):
            steps.append(Step("file", "\n".join(body[1:]) + "\n", start + 1, path=FILE_LINE.match(body[0])["path"]))
        elif language in ("sh", "bash", "shell"):
            raise GuideError(f"{guide}:{at + 1}: commands go in ```console blocks with `$ ` prompts, not ```{language}")
        at = end + 1
    return steps


def _console_steps(guide: Path, body: list[str], first_line: int) -> list[Step]:
    steps: list[Step] = []
    at = 0
    while at < len(body):
        line = body[at]
        if line.startswith("$ "):
            start = at
            command = line[2:]
            while command.endswith("\\") and at + 1 < len(body):
                at += 1
                command = command[:-1].rstrip() + " " + body[at].strip()
            reason = NOT_RUN.search(command)
            step = Step("command", NOT_RUN.sub("", command).strip(), first_line + start,
                        not_run=reason["reason"].strip() if reason else "")
            steps.append(step)
        elif line.strip():
            if not steps:
                raise GuideError(f"{guide}:{first_line + at}: output before any `$ ` command")
            steps[-1].expected.append(line)
        at += 1
    return steps


def _patched_path(guide: Path, body: list[str], start: int) -> str:
    for line in body:
        if line.startswith("+++ "):
            return line[4:].split("\t")[0].removeprefix("b/")
    raise GuideError(f"{guide}:{start + 1}: a ```diff block needs a `+++ b/PATH` line")


@dataclass
class Outcome:
    step: Step
    returncode: int | None     # None: not reached (an earlier step failed) or not run
    output: str


def run_guide(steps: list[Step], workdir: Path, env: dict[str, str], scratch: Path,
              timeout: float = 300) -> list[Outcome]:
    """Run the steps that are to run in one bash, in `workdir` (one reader's shell, so one
    guide can continue another); each step's exit code and output."""
    scratch.mkdir(parents=True, exist_ok=True)
    script = ["set -u", f"cd {shlex.quote(str(workdir))}"]
    for number, step in enumerate(steps):
        if step.not_run:
            continue
        out, rc = scratch / f"{number}.out", scratch / f"{number}.rc"
        if step.kind == "command":
            body = f"{{ {step.text}\n}} </dev/null"
        else:
            content = scratch / f"{number}.content"
            content.write_text(step.text)
            target = shlex.quote(step.path)
            # git apply, not patch(1): git is installed wherever the tests run (scripts/install --test)
            body = (f"git apply -p1 {shlex.quote(str(content))}"
                    if step.kind == "patch" else
                    f"mkdir -p \"$(dirname {target})\" && cp {shlex.quote(str(content))} {target}")
        script.append(f"{body} >{shlex.quote(str(out))} 2>&1; echo $? >{shlex.quote(str(rc))}")
        script.append(f"[ \"$(cat {shlex.quote(str(rc))})\" = 0 ] || exit 0")
    (scratch / "guide.sh").write_text("\n".join(script) + "\n")
    subprocess.run(["bash", str(scratch / "guide.sh")], env=env, timeout=timeout, check=False,
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    outcomes = []
    for number, step in enumerate(steps):
        rc_file = scratch / f"{number}.rc"
        reached = rc_file.exists()
        outcomes.append(Outcome(step, int(rc_file.read_text()) if reached else None,
                                (scratch / f"{number}.out").read_text(errors="replace") if reached else ""))
    return outcomes


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def squeeze(text: str) -> str:
    return " ".join(ANSI.sub("", text).split())


def shows(printed: str, line: str) -> bool:
    """Whether `line` of a guide (spaces collapsed; `...` inside it stands for any text) is in `printed`."""
    parts = [re.escape(squeeze(part)) for part in line.split("...")]
    return re.search(r".*?".join(parts), squeeze(printed)) is not None


def missing_output(outcome: Outcome) -> list[str]:
    """The lines the guide shows under a command that it did not print."""
    return [line for line in outcome.step.expected if line.strip() != "..." and not shows(outcome.output, line)]
