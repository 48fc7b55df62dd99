"""The command line's root group and command classes, shared by every `cmd_*` module.

- `python -m submit JOB_ID ...` is the short form of `jobs submit training JOB_ID ...`:
  a first word that names no command is a job id (a reserved word never is one).
- Boolean flags take gcloud's `--flag=true|false` as well as `--flag` / `--no-flag`.
- `--` ends the command's flags; what follows belongs to the trainer.
"""
from __future__ import annotations

import click

from submit.jobdef import spellings
from submit.errors import UsageError

_TRUE, _FALSE = ("true", "yes", "1", "on"), ("false", "no", "0", "off")


def gcloud_booleans(command: click.Command, args: list[str]) -> list[str]:
    """`--flag=true` is `--flag`; `--flag=false` is its opposite (`--no-flag`, or no
    word for a plain flag), as gcloud takes boolean flags."""
    flags: dict[str, tuple[str | None, str | None]] = {}
    for param in command.params:
        if isinstance(param, click.Option) and param.is_flag and param.is_bool_flag:
            on = param.opts[0] if param.opts else None
            off = param.secondary_opts[0] if param.secondary_opts else None
            flags.update({o: (on, off) for o in param.opts})
            flags.update({o: (off, on) for o in param.secondary_opts})
    out: list[str] = []
    for i, arg in enumerate(args):
        if arg == "--":
            return out + args[i:]
        name, eq, value = arg.partition("=")
        if eq and name in flags:
            if value.lower() not in _TRUE + _FALSE:
                raise UsageError(f"{name} takes true or false, not {value!r:.30}; write "
                                 f"{name}=true, {name}=false or {name}")
            word = flags[name][0 if value.lower() in _TRUE else 1]
            if word:
                out.append(word)
        else:
            out.append(arg)
    return out


class GcloudCommand(click.Command):
    """A command taking gcloud's boolean spellings."""

    def parse_args(self, ctx, args):
        return super().parse_args(ctx, gcloud_booleans(self, list(args)))


class TrainerArgsCommand(GcloudCommand):
    """Everything after `--` belongs to the trainer; stray words before it are errors."""

    def parse_args(self, ctx, args):
        args = list(args)
        if "--" in args:
            cut = args.index("--")
            ctx.meta["trainer_args"] = tuple(args[cut + 1:])
            args = args[:cut]
        else:
            ctx.meta["trainer_args"] = None
        return super().parse_args(ctx, args)


class GcloudGroup(click.Group):
    """A group whose commands and subgroups take gcloud's spellings."""

    command_class = GcloudCommand
    group_class = type  # subgroups are GcloudGroups too


class MainGroup(GcloudGroup):
    """`submit` is the default command: `python -m submit job01 ...` means
    `python -m submit submit job01 ...` unless the first word names a command; a
    reserved word (gcloud's command groups) that is not a command here is refused."""

    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            if args[0].lower() in spellings.RESERVED_WORDS:
                raise UsageError(f"{args[0]!r} is a gcloud ai-platform command mljob does "
                                 "not have, and never a job id; see python -m submit --help")
            args = ["submit", *args]
        return super().parse_args(ctx, args)


@click.group(cls=MainGroup, context_settings={"help_option_names": ["-h", "--help"]})
def cli():
    """Run TensorFlow training jobs as Cloud ML Engine did: as processes on this machine,
    or (--runner kubeflow|vertex) on a Kubeflow cluster or Vertex AI. The commands are
    gcloud ai-platform's.

    \b
    python -m submit JOB_ID [options] [-- trainer args]
        Submit a job: the short form of `jobs submit training JOB_ID`.
    python -m submit jobs submit training JOB_ID [options] [-- trainer args]
    python -m submit jobs list | describe JOB | stream-logs JOB | cancel JOB | update JOB
        Manage submitted jobs (`python -m submit jobs --help`).
    python -m submit models ... | versions ... | predict --model M --json-instances F
        Models, their versions, and online prediction against `predict serve`.
    python -m submit local train [--distributed] [-- trainer args] | local predict
        Run the working tree's trainer locally without staging; predict from an export.
    """


def echo(text: str, err: bool = False) -> None:
    click.echo(text, err=err)
