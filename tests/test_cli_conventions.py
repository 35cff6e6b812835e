"""The command-line conventions (docs/cli.md), checked on every command typer builds.

The walk covers the whole click command tree, so a command added later is
held to the same rules without this file naming it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import typer
import typer.core
from typer.testing import CliRunner

from corral.cli import app, installed_version

runner = CliRunner()


def _walk(command, path):
    yield path, command
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        yield from _walk(sub, [*path, name])


def _commands():
    root = typer.main.get_command(app)
    return list(_walk(root, ["corral"]))


def _help(path: list[str]) -> str:
    result = runner.invoke(app, [*path[1:], "--help"], env={"COLUMNS": "200", "TERMINAL_WIDTH": "200"})
    assert result.exit_code == 0, result.output
    return result.output


COMMAND_PATHS = [path for path, _ in _commands()]


@pytest.mark.parametrize("path", COMMAND_PATHS, ids=" ".join)
def test_usage_names_arguments_in_capitals_and_flags_have_no_metavar(path):
    text = _help(path)
    usage = next(line for line in text.splitlines() if "Usage:" in line)
    assert "{" not in usage and "}" not in usage, usage
    for word in usage.split("Usage:")[1].split():
        if word.startswith("[") or word in ("COMMAND", "[ARGS]..."):
            continue
        assert word == "corral" or word in path or word.strip(".").isupper(), f"{' '.join(path)}: {usage}"
    assert "<bool>" not in text, f"{' '.join(path)} shows <bool> on a flag"


def _options(command):
    return [p for p in command.params if isinstance(p, typer.core.TyperOption) and not p.hidden]


@pytest.mark.parametrize("path", COMMAND_PATHS, ids=" ".join)
def test_one_output_convention(path):
    """A format is -o/--output; a visible --format or --json is the old convention."""
    command = dict((" ".join(p), c) for p, c in _commands())[" ".join(path)]
    for option in _options(command):
        names = set(option.opts) | set(option.secondary_opts)
        assert not names & {"--format", "--json", "-f"}, f"{' '.join(path)}: {option.opts}"
        if "--output" in names or "-o" in names:
            assert names == {"--output", "-o"}, f"{' '.join(path)}: {option.opts}"
            # -o picks a format from a list: a file goes to --out.
            assert "json" in (option.help or ""), f"{' '.join(path)}: {option.help}"


def test_version_is_the_installed_package_version():
    from importlib.metadata import version

    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"corral {version('corral')}"
    assert installed_version() == version("corral")


def test_shell_completion_is_offered():
    text = _help(["corral"])
    assert "--install-completion" in text and "--show-completion" in text
    assert "--version" in text


def test_plan_diff_and_usage_still_take_the_old_format_spelling():
    """The shipped workflows (.github/workflows/pr.yml, deploy.yml) and docs spell `corral diff --format`:
    the old spelling is hidden but still works."""
    command = dict((" ".join(p), c) for p, c in _commands())
    for name in ("corral plan", "corral diff", "corral usage"):
        hidden = [p for p in command[name].params if isinstance(p, typer.core.TyperOption) and p.hidden]
        assert any("--format" in p.opts for p in hidden), name
        assert "--format" not in _help(name.split())


def test_diff_writes_its_file_with_out_not_output():
    command = dict((" ".join(p), c) for p, c in _commands())["corral diff"]
    by_name = {name: p for p in command.params for name in p.opts}
    assert by_name["--out"].name == "out_file"
    assert "json" in by_name["--output"].help


# What makes a start slow: the Pulumi and cloud SDKs (seconds of imports with PYTHONDONTWRITEBYTECODE).
# Their import, not a stopwatch, is the check: a timed test fails on a busy machine and passes a slow
# import on a fast one (`corral --help` measured 0.29-0.36 s here, with completion on).
HEAVY_MODULES = ("pulumi", "pulumi_aws", "pulumi_gcp", "pulumi_azure_native", "pulumi_kubernetes", "pulumi_random",
                 "pulumi_tls", "boto3", "botocore", "google", "azure", "grpc")


def test_completion_does_not_slow_the_start():
    """`corral --help`, completion on, loads no Pulumi or cloud SDK."""
    code = ("import json, sys\nsys.argv = ['corral', '--help']\nfrom corral.cli import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\nprint(json.dumps(sorted(sys.modules)), file=sys.stderr)")
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    ran = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, env=env)
    loaded = json.loads(ran.stderr.strip().splitlines()[-1])
    assert "Usage" in ran.stdout
    assert not [m for m in loaded if m.split(".")[0] in HEAVY_MODULES]


# --- Examples: every command's help has them, and they work -----------------------------------

# These run for real against a copy of the example clusters (offline: the
# Pulumi program under mocks, round-trip edits with --dry-run). The others
# need a cloud, a cluster's API, etcd or ssh: their examples are parsed by the
# command (arguments, options, callbacks such as the cluster-name check) but
# not run.
RUNNABLE = {
    "corral validate", "corral list", "corral show", "corral schema", "corral inventory", "corral plan",
    "corral manifests", "corral nodepool add", "corral nodepool list", "corral nodepool scale",
    "corral nodepool remove", "corral cluster new", "corral site add",
}


def _leaves():
    return [(path, command) for path, command in _commands() if not hasattr(command, "commands")]


@pytest.mark.parametrize("path", [path for path, _ in _leaves()], ids=" ".join)
def test_every_command_has_examples_in_its_help(path):
    from corral.cli.common import example_lines

    command = dict((" ".join(p), c) for p, c in _leaves())[" ".join(path)]
    lines = example_lines(command.epilog)
    assert lines, f"{' '.join(path)} has no Examples section"
    assert all(line.startswith(" ".join(path) + " ") or line == " ".join(path) for line in lines), lines
    assert "Examples:" in _help(path)


def _example_cases():
    from corral.cli.common import example_lines

    for path, command in _leaves():
        for line in example_lines(command.epilog):
            yield pytest.param(" ".join(path), line, id=line)


@pytest.mark.parametrize("name, line", list(_example_cases()))
def test_every_example_works(name, line, fleet_dir, monkeypatch):
    import shlex

    words = shlex.split(line)
    monkeypatch.chdir(fleet_dir.parent)  # clusters/ is the copy: the examples' default --clusters
    if name in RUNNABLE:
        result = runner.invoke(app, words[1:], env={"COLUMNS": "200"})
        assert result.exit_code == 0, f"{line}\n{result.output}"
        return
    command = dict((" ".join(p), c) for p, c in _leaves())[name]
    rest = words[len(name.split()):]
    with command.make_context(name, rest) as ctx:  # parses; raises on a bad option or value
        assert ctx.params
