"""The primitives every machine part is made of: a File, the template renderer, secret bundles.

Templates live in corral/templates/ (jinja2, StrictUndefined: a missing input
is an error, never an empty string). The on-prem Ansible roles read the same
templates where they share them with the clouds (the JoinConfiguration).
"""

from __future__ import annotations

import base64
import gzip
import io
import shlex
import tarfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2

TEMPLATES = Path(__file__).resolve().parents[1] / "templates"


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    # Shell-quoted value, for values a script assigns.
    env.filters["shquote"] = lambda value: shlex.quote(str(value))
    return env


def render(template: str, **context: Any) -> str:
    return environment().get_template(template).render(**context)


@dataclass(frozen=True)
class File:
    path: str
    content: str
    mode: str = "0644"
    owner: str = "root"  # user and group by name (secret bundles; user data files are root's)


def bundle(files: list[File]) -> str:
    """The files as one secret value: base64 of a tar.gz (modes and owners' names kept).

    Deterministic (no times, no user names), so an unchanged bundle is an
    unchanged secret. Paths are stored relative to /.
    """
    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as zipped, tarfile.open(fileobj=zipped, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for f in files:
            data = f.content.encode()
            info = tarfile.TarInfo(f.path.lstrip("/"))
            info.size, info.mode, info.mtime = len(data), int(f.mode, 8), 0
            # By name: uids differ between machines. 0 where the name is unknown.
            info.uid = info.gid = 0
            info.uname = info.gname = f.owner
            tar.addfile(info, io.BytesIO(data))
    return base64.b64encode(raw.getvalue()).decode()


def unbundle(value: str) -> dict[str, File]:
    """The files of a bundle, by absolute path (tests and checks)."""
    files = {}
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(base64.b64decode(value))), mode="r") as tar:
        for member in tar.getmembers():
            content = tar.extractfile(member).read().decode()  # type: ignore[union-attr]
            files["/" + member.name] = File("/" + member.name, content, f"{member.mode:04o}", member.uname)
    return files
