"""The `corral` command line."""

from typing import Annotated

import typer

from . import capacity, certs, diff, doctor, edit, etcd, fleet, infra, manifests, nodes, sites, upgrade, usage
from .common import CorralTyper, out, plain_warnings

# add_completion gives --install-completion/--show-completion for bash, zsh,
# fish and PowerShell (typer's own CLI documents them the same way:
# https://manpages.ubuntu.com/manpages/questing/man1/typer.1.html).
app = CorralTyper(
    name="corral",
    help="GPU Kubernetes clusters across Azure, AWS, GCP and your own data centres.",
    pretty_exceptions_enable=False,
    add_completion=True,
)


def installed_version() -> str:
    """The version pip installed (the package metadata), not a constant that drifts from pyproject.toml."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("corral")
    except PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"


def _print_version(wanted: bool) -> None:
    if wanted:
        out.print(f"corral {installed_version()}", markup=False)
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option(
        "--version", help="Print corral's version and exit.", callback=_print_version, is_eager=True)] = False,
) -> None:
    """GPU Kubernetes clusters across Azure, AWS, GCP and your own data centres."""
    plain_warnings()


fleet.register(app)
nodes.register(app)
edit.register(app)
diff.register(app)
infra.register(app)
manifests.register(app)
upgrade.register(app)
certs.register(app)
usage.register(app)
capacity.register(app)
etcd.register(app)
doctor.register(app)
sites.register(app)


def main() -> None:
    _tools_beside_interpreter()
    app()


def _tools_beside_interpreter() -> None:
    """Put the interpreter's bin directory first on PATH.

    corral drives ansible-playbook (through ansible-runner), which is installed
    beside corral in the project's virtualenv; `.venv/bin/corral join` must
    find it there without the venv being activated.
    """
    import os
    import sys

    bindir = os.path.dirname(sys.executable)
    path = os.environ.get("PATH", "")
    if bindir not in path.split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + path if path else bindir
