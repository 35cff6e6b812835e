"""The little of git `corral diff` needs: a base revision and files as they were there."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


class GitError(Exception):
    """git failed or is not there; the message says what to do."""


def git(args: list[str], cwd: Path, check: bool = True, input: bytes | None = None) -> bytes:
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, input=input, check=False)
    except FileNotFoundError:
        raise GitError("git is not installed") from None
    if check and done.returncode != 0:
        raise GitError(f"git {' '.join(args)}: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout if done.returncode == 0 else b""


def repo_root(path: Path) -> Path:
    out = git(["rev-parse", "--show-toplevel"], path if path.is_dir() else path.parent, check=False)
    if not out:
        raise GitError(f"{path} is not inside a git repository: `corral diff` compares against a git revision")
    return Path(out.decode().strip())


def resolve(root: Path, rev: str) -> str | None:
    out = git(["rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], root, check=False)
    return out.decode().strip() or None


def default_base(root: Path) -> tuple[str | None, str]:
    """(commit, how it was chosen): the merge base of HEAD with the main branch.

    Tries, in order: the pull request's base in GitHub Actions
    (GITHUB_BASE_REF), main, origin/main, master, origin/master. With none
    of them, HEAD (the diff then shows uncommitted changes); in a repository
    without commits, nothing (every cluster file is new).
    """
    head = resolve(root, "HEAD")
    if head is None:
        return None, "no commits yet: every cluster file is new"
    candidates = []
    if os.environ.get("GITHUB_BASE_REF"):
        candidates += [f"origin/{os.environ['GITHUB_BASE_REF']}", os.environ["GITHUB_BASE_REF"]]
    candidates += ["main", "origin/main", "master", "origin/master"]
    for ref in candidates:
        if resolve(root, ref) is None:
            continue
        base = git(["merge-base", "HEAD", ref], root, check=False).decode().strip()
        if base:
            return base, f"merge base of HEAD and {ref}"
    return head, "HEAD (no main branch found)"


def files_at(root: Path, rev: str | None, folder: str, suffix: str = ".yaml") -> dict[str, bytes]:
    """Files directly in `folder` (relative to the repository root) at `rev`, by file name."""
    if rev is None:
        return {}
    prefix = folder.rstrip("/") + "/" if folder not in ("", ".") else ""
    listing = git(["ls-tree", "-z", rev, "--", prefix or "."], root)
    entries = []
    for record in listing.split(b"\0"):
        if not record:
            continue
        meta, _, path = record.partition(b"\t")
        _mode, kind, sha = meta.split()
        name = path.decode()[len(prefix):]
        if kind == b"blob" and "/" not in name and name.endswith(suffix):
            entries.append((name, sha.decode()))
    if not entries:
        return {}
    # One `cat-file --batch` for every blob: one process, not one per file.
    out = git(["cat-file", "--batch"], root, input="".join(f"{sha}\n" for _, sha in entries).encode())
    files: dict[str, bytes] = {}
    pos = 0
    for name, _ in entries:
        header_end = out.index(b"\n", pos)
        size = int(out[pos:header_end].split()[2])
        files[name] = out[header_end + 1:header_end + 1 + size]
        pos = header_end + 1 + size + 1
    return files


def short(root: Path, rev: str | None) -> str:
    if rev is None:
        return "(empty)"
    return git(["rev-parse", "--short", rev], root, check=False).decode().strip() or rev[:10]
