"""`console`: the jobs of the local index in a browser (docs/console.md)."""
from __future__ import annotations

import click

from submit.cli.cli_base import cli, echo


@cli.command("console")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (0.0.0.0 shows your jobs to the network, to "
                   "those who have its token).")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535),
              help="Port to listen on (0 picks a free one).")
@click.option("--token", default=None, metavar="TOKEN",
              help="The token a browser must present (other users see it in ps; prefer "
                   "--token-file). Off loopback, one is made and printed when none is given.")
@click.option("--token-file", default=None, metavar="PATH",
              help="A file holding the token a browser must present.")
@click.option("--allowed-hosts", default=None, metavar="NAMES",
              help="Comma-separated names the Host header may carry besides loopback and "
                   "the bound address ('*' takes any: then only the token protects).")
def console_command(host, port, token, token_file, allowed_hosts):
    """The jobs of the local index in a browser: states, replicas, live logs, trials,
    CPU and memory, cancel."""
    from submit import console
    return console.serve(host, port, echo, token, token_file, allowed_hosts)
