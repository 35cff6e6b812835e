"""What every corral command shares: the clusters folder, loading, output.

Commands import the heavy parts of corral (Pulumi, ansible-runner) inside
their own bodies, so `corral validate` never pays for the cloud SDKs.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import Annotated, NoReturn

import typer
import typer.core
from rich.console import Console
from rich.markup import escape

from corral.model import Cluster, Fleet, ValidationFailed, load_fleet

# Piped output (CI logs, `| less`) gets wide tables rather than 80 columns.
out = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, highlight=False, soft_wrap=True)

DEFAULT_CLUSTERS = Path(os.environ.get("CORRAL_CLUSTERS", "clusters"))

ClustersOption = Annotated[
    Path,
    typer.Option(
        "--clusters",
        help="Folder of cluster files (env CORRAL_CLUSTERS).",
        file_okay=False,
    ),
]


def check_cluster_name(name: str) -> str:
    """A cluster name is a DNS label: never a path, so it cannot leave --clusters."""
    from corral.model.schema import check_dns_label

    try:
        return check_dns_label(name)
    except ValueError as error:
        raise typer.BadParameter(f"cluster name {error}") from None


def check_ssh_user_option(name: str) -> str:
    """--ssh-user (or $CORRAL_ETCD_SSH_USER): a POSIX user name, never an ssh option."""
    from corral.etcd.restore import check_ssh_user

    try:
        return check_ssh_user(name)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None


def etcdctl_or_exit(endpoints, tls):
    """The etcd client for `endpoints`; a bad $CORRAL_ETCD_COMMAND_TIMEOUT is one message, not a traceback."""
    from corral.etcd import EtcdError, Etcdctl

    try:
        return Etcdctl(endpoints, tls=tls)
    except EtcdError as error:
        fail(str(error))


ClusterArg = Annotated[str, typer.Argument(
    help="Cluster name (clusters/<name>.yaml).", show_default=False, callback=check_cluster_name)]


def fail(message: str, code: int = 1) -> NoReturn:
    err.print(f"[bold red]error:[/] {escape(message)}")
    raise typer.Exit(code)


def report_problems(failed: ValidationFailed) -> NoReturn:
    """Print every problem, one line each, and exit 1."""
    for problem in failed.problems:
        out.print(str(problem), markup=False)
    files = len({p.file for p in failed.problems})
    err.print(
        f"[red]{len(failed.problems)} problem{'s' * (len(failed.problems) != 1)} "
        f"in {files} file{'s' * (files != 1)}[/]"
    )
    raise typer.Exit(1)


def fleet_or_exit(paths: list[Path]) -> Fleet:
    try:
        return load_fleet(paths)
    except ValidationFailed as failed:
        report_problems(failed)


def cluster_path(clusters: Path, name: str) -> Path:
    """clusters/NAME.yaml, refused unless NAME is a cluster name and the file is inside `clusters`.

    The argument callback already checks the name; this holds for every
    caller, and also refuses a symbolic link that points out of the folder.
    """
    check_cluster_name(name)
    path = clusters / f"{name}.yaml"
    if clusters.exists() and not path.resolve().is_relative_to(clusters.resolve()):
        fail(f"{path} leads outside {clusters} (to {path.resolve()}); refusing to use it")
    return path


def cloud_extra_or_exit(command: str, cluster: Cluster) -> None:
    """Exit with the extra to install when the cluster's cloud provider is not installed.

    Each cloud's Pulumi provider is an extra (pyproject.toml): a command that
    runs the Pulumi program names it, rather than failing on an ImportError.
    """
    from corral.infra.extras import install_hint, provider_installed

    cloud = cluster.control_plane.cloud
    if not provider_installed(cloud):
        fail(f"corral {command} {cluster.name} needs the {cloud} extra: {install_hint(cloud)}")


def cluster_or_exit(clusters: Path, name: str) -> Cluster:
    """One cluster, validated together with the rest of its fleet."""
    path = cluster_path(clusters, name)
    if not path.is_file():
        known = sorted(p.stem for p in clusters.glob("*.yaml")) if clusters.is_dir() else []
        fail(f"no cluster '{name}': {path} does not exist" + (f" (clusters: {', '.join(known)})" if known else ""))
    fleet = fleet_or_exit([clusters])
    if name not in fleet.clusters:
        fail(f"{path} defines no cluster named '{name}'")
    return fleet.clusters[name]


# The command-line conventions (docs/cli.md): `-o/--output FORMAT` picks what a
# command prints, `--out FILE` names a file it writes, usage lines name
# arguments in capitals (NAME, CLUSTER), and flags carry no metavar.
# typer 0.29 prints a required argument as `{name}` and every flag as `<bool>`
# (typer/core.py: TyperArgument._usage_display_name, TyperOption.display_type):
# these classes say it the corral way for every command.


def _plain_metavars(params) -> None:
    for param in params:
        # Arguments keep their lower-case name in the help panel and in error
        # hints ("Invalid value for 'cluster'"); only the usage line capitalises it.
        if isinstance(param, typer.core.TyperOption) and param.is_flag and param.metavar is None:
            param.metavar = ""


def _usage_pieces(command, ctx) -> list[str]:
    pieces = [command.options_metavar] if command.options_metavar else []
    for param in command.get_params(ctx):
        if isinstance(param, typer.core.TyperArgument):
            name = param.metavar or param.name.upper()
            name = name if param.required else f"[{name}]"
            pieces.append(name + ("..." if param.nargs != 1 else ""))
    return pieces


class CorralCommand(typer.core.TyperCommand):
    def get_params(self, ctx):
        params = super().get_params(ctx)
        _plain_metavars(params)
        return params

    def collect_usage_pieces(self, ctx) -> list[str]:
        return _usage_pieces(self, ctx)


class CorralGroup(typer.core.TyperGroup):
    def get_params(self, ctx):
        params = super().get_params(ctx)
        _plain_metavars(params)
        return params


class CorralTyper(typer.Typer):
    """A typer app whose commands follow the conventions above."""

    def __init__(self, **kwargs) -> None:
        kwargs.setdefault("cls", CorralGroup)
        kwargs.setdefault("no_args_is_help", True)
        super().__init__(**kwargs)

    def command(self, *args, **kwargs):
        kwargs.setdefault("cls", CorralCommand)
        return super().command(*args, **kwargs)


def examples(*lines: str) -> str:
    """A command's Examples section (its epilog): commands that run on the shipped clusters.

    typer renders a command's `epilog` after the options, one paragraph per
    blank-line-separated block (typer 0.6.0 release notes,
    https://github.com/tiangolo/typer/releases/tag/0.6.0; typer/rich_utils.py
    splits the epilog on "\n\n"): one example a paragraph.

    tests/test_cli_conventions.py runs every line (or parses it, when it
    needs a cloud), so an example cannot go stale.
    """
    return "Examples:\n\n" + "\n\n".join(f"  $ {line}" for line in lines)


def example_lines(epilog: str | None) -> list[str]:
    """The commands in an epilog made by examples(), without the prompt."""
    return [line.strip()[2:] for line in (epilog or "").splitlines() if line.strip().startswith("$ ")]


def chosen_format(output, legacy_format):
    """`-o/--output`, or the hidden `--format` that shipped workflows and docs still spell."""
    return legacy_format if legacy_format is not None else output


# The cloud provider SDKs deprecate their own resource classes when they are
# imported (pulumi_aws/ec2/encryption_control.py:517: "EncryptionControl has
# been deprecated in favor of VpcEncryptionControl"): nothing a corral user can
# act on, so they stay silent even under PYTHONWARNINGS=default or -X dev.
PROVIDER_SDK_MODULES = r"pulumi_(aws|azure_native|gcp|tls|random|kubernetes|command)(\.|$)"


def _warning_line(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning as one line, `warning: ...`, never the source file and line it was raised at."""
    err.print(f"[yellow]warning:[/] {escape(str(message))}")


def plain_warnings() -> None:
    """Warnings are one line a user can read; provider SDK deprecations are not shown."""
    warnings.filterwarnings("ignore", category=DeprecationWarning, module=PROVIDER_SDK_MODULES)
    # The Pulumi mock runtime leaves its event loop to the garbage collector,
    # which reports it at exit (asyncio/base_events.py:692), past showwarning.
    warnings.filterwarnings("ignore", category=ResourceWarning, message="unclosed event loop")
    warnings.showwarning = _warning_line
