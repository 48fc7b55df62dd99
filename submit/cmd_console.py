"""`console`: the jobs of the local index in a browser (docs/console.md)."""
from __future__ import annotations

import click

from submit.cli_base import cli, echo


@cli.command("console")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (0.0.0.0 shows your jobs to the network).")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535),
              help="Port to listen on (0 picks a free one).")
def console_command(host, port):
    """The jobs of the local index in a browser: states, replicas, live logs, trials,
    CPU and memory, cancel."""
    from submit import console
    return console.serve(host, port, echo)
