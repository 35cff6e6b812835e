"""The `corral` command line."""

import typer

from . import fleet, nodes

app = typer.Typer(
    name="corral",
    help="GPU Kubernetes clusters across Azure, AWS, GCP and your own data centres.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
fleet.register(app)
nodes.register(app)


def main() -> None:
    app()
