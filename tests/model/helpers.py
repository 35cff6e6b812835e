"""Writing variants of the example clusters and collecting their problems."""

from __future__ import annotations

from pathlib import Path

from corral.model import ValidationFailed, load_fleet

EXAMPLES = Path(__file__).resolve().parents[2] / "clusters"


def example(name: str) -> str:
    return (EXAMPLES / f"{name}.yaml").read_text()


def problems(tmp_path: Path, files: dict[str, str]) -> list[str]:
    """Validate `files` (file name -> text) as one fleet; the problem lines, or []."""
    folder = tmp_path / "fleet"
    folder.mkdir(exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    try:
        load_fleet([folder])
    except ValidationFailed as failed:
        return [str(p).removeprefix(str(folder) + "/") for p in failed.problems]
    return []


def variant(tmp_path: Path, name: str, old: str, new: str) -> list[str]:
    """Problems of example `name` with `old` replaced by `new` (which must occur)."""
    text = example(name)
    assert old in text, f"{old!r} not in {name}.yaml"
    return problems(tmp_path, {f"{name}.yaml": text.replace(old, new, 1)})


def line_of(name: str, needle: str) -> int:
    """1-based line of the first line containing `needle` in example `name`."""
    for number, line in enumerate(example(name).splitlines(), start=1):
        if needle in line:
            return number
    raise AssertionError(f"{needle!r} not in {name}.yaml")
