"""`corral diff`: the change to the cluster files since a git revision, and what it does in the cloud."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from .common import DEFAULT_CLUSTERS, ClustersOption, chosen_format, examples, fail, out

FORMATS = ("text", "markdown", "json")


def diff(
    base: Annotated[Optional[str], typer.Option(
        "--base", help="Git revision to compare with (default: merge base of HEAD and main).")] = None,
    output: Annotated[str, typer.Option("--output", "-o", help="text, markdown (a PR comment) or json.")] = "text",
    plan: Annotated[bool, typer.Option("--plan/--no-plan", help="Run the offline Pulumi plan of both sides.")] = True,
    cache: Annotated[bool, typer.Option("--cache/--no-cache",
        help="Reuse plans cached by content (env CORRAL_PLAN_CACHE: folder or 'off').")] = True,
    fail_on_danger: Annotated[bool, typer.Option(
        "--fail-on-danger", help="Exit 2 when a change replaces/deletes stateful resources or restarts etcd quorum.")] = False,
    out_file: Annotated[Optional[Path], typer.Option(
        "--out", help="Write the report to this file too.", dir_okay=False)] = None,
    clusters: ClustersOption = DEFAULT_CLUSTERS,
    legacy_format: Annotated[Optional[str], typer.Option(
        "--format", hidden=True, help="Old spelling of --output (the shipped workflows use it).")] = None,
) -> None:
    """Cluster files changed since --base: semantic change and plan change, dangers first."""
    from corral.diff import report as render
    from corral.diff.engine import compute
    from corral.diff.git import GitError

    format = chosen_format(output, legacy_format)
    if format not in FORMATS:
        raise typer.BadParameter(f"must be one of {', '.join(FORMATS)}", param_hint="-o/--output")
    if not clusters.is_dir():
        fail(f"no clusters folder {clusters}")
    try:
        result = compute(clusters, base=base, plan=plan, cache=cache)
    except GitError as error:
        fail(str(error))
    text = {"text": render.text, "markdown": render.markdown, "json": render.as_json}[format](result)
    out.print(text, markup=False, end="", highlight=False)
    if out_file:
        from corral.util import write_atomic

        write_atomic(out_file, text)
    if fail_on_danger and result.dangerous:
        raise typer.Exit(2)


def register(app: typer.Typer) -> None:
    app.command(epilog=examples(
        "corral diff",
        "corral diff --base main -o markdown --out diff.md --fail-on-danger",
    ))(diff)
