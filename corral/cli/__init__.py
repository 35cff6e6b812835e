"""The `corral` command line."""

import typer

from . import diff, edit, fleet, infra, manifests, nodes

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


def main() -> None:
    app()
