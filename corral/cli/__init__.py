"""The `corral` command line."""

import typer

from . import certs, diff, doctor, edit, etcd, fleet, infra, manifests, nodes, upgrade, usage

app = typer.Typer(
    name="corral",
    help="GPU Kubernetes clusters across Azure, AWS, GCP and your own data centres.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
fleet.register(app)
nodes.register(app)
edit.register(app)
diff.register(app)
infra.register(app)
manifests.register(app)
upgrade.register(app)
certs.register(app)
usage.register(app)
etcd.register(app)
doctor.register(app)


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
