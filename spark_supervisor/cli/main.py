"""The parser and `main()`: every subcommand, its options and its help (`make man` writes the man page
from this parser). Standard library only at import: each command imports what it needs when it runs."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypedDict, Unpack

from . import logs, maintenance, ops, record, status, tools
from .base import DEFAULT_CONFIG, ENVIRONMENT, EXIT_NOTE, SYSTEM_CONFIG, _status_epilog, _wrapped


class _Version(argparse.Action):
    """--version, with the version looked up only when asked for (it reads the installed metadata)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, help: str | None = None):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    # argparse.Action's signature: --version takes no value and sets nothing
    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,  # noqa: ARG002
                 values: str | Sequence[Any] | None, option_string: str | None = None) -> None:  # noqa: ARG002
        from .. import version
        print(f"spark-supervisor {version()}")
        parser.exit()


class _ParserOptions(TypedDict, total=False):
    """What a subcommand sets beyond its help and description (add_parser's own keywords)."""
    epilog: str
    formatter_class: type[argparse.HelpFormatter]


DESCRIPTION = """Keeps multi-node vLLM deployments serving: observes every node's Docker engine, Ray and
the served model, plans, and repairs what is wrong, within a repair budget."""


def _epilog() -> str:
    return "\n".join(["environment:"] + [_wrapped(text, " " * 27, f"  {name:<25}") for name, text in ENVIRONMENT]
                     + ["", _status_epilog("exit status: " + EXIT_NOTE)])


def parser() -> argparse.ArgumentParser:
    # Global options go before or after the subcommand: the top-level parser holds the default, and each
    # subcommand a copy whose default is SUPPRESS, so a value given after the subcommand wins and none
    # given there leaves the top-level one.
    config_help = f"config file (default: $SPARK_SUPERVISOR_CONFIG, else {SYSTEM_CONFIG})"
    json_help = "one JSON document instead of text"
    p = argparse.ArgumentParser(prog="spark-supervisor", description=DESCRIPTION, epilog=_epilog(),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action=_Version, help="print the version and exit")
    p.add_argument("--config", "-c", default=DEFAULT_CONFIG, metavar="FILE", help=config_help)
    json_global = p.add_argument("--json", action="store_true", help=json_help)
    config_opt = argparse.ArgumentParser(add_help=False)
    config_opt.add_argument("--config", "-c", default=argparse.SUPPRESS, metavar="FILE", help=config_help)
    json_opt = argparse.ArgumentParser(add_help=False)
    json_opt.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=json_help)
    sub = p.add_subparsers(title="commands", dest="command", required=True, metavar="COMMAND")

    def add(name: str, fn: Callable[[argparse.Namespace], int], help: str, *, config: bool = True,
            json: bool = False, description: str | None = None,
            **kw: Unpack[_ParserOptions]) -> argparse.ArgumentParser:
        """A subcommand; `json`: it has a JSON output (--json)."""
        parents = ([config_opt] if config else []) + ([json_opt] if json else [])
        sp = sub.add_parser(name, help=help, parents=parents, **kw,
                            description=help[:1].upper() + help[1:] + "." if description is None else description)
        sp.set_defaults(fn=fn, json_ok=json)
        return sp

    add("run", ops.cmd_run, "run the supervisor in the foreground (what the systemd unit runs)")
    add("check", ops.cmd_check, "validate the config: exit 0, or 2 with one line per problem").add_argument(
        "--preflight", action="store_true", help="also check the fabric on every node (exit 1 on a problem)")
    from . import discover  # standard library only at import, as every command module here
    discover.add_arguments(add("discover", discover.cmd_discover, "read the nodes, write the config they can serve "
                               "(each value annotated), qualify it and say what is left to do; change nothing", config=False))
    add("diagnose", ops.cmd_diagnose, "per node, the deepest layer that answers and the first that does not")
    add("plan", ops.cmd_plan, "observe once and print what would be done; change nothing", json=True)
    ap = add("apply", ops.cmd_apply, "what a reload to FILE would do to each deployment (unchanged, settings only, "
             "serve-only restart, replace), each change that stops one proven as the daemon proves it; acts on "
             "nothing", json=True)
    ap.add_argument("file", metavar="FILE", help="the config file a reload would read")
    ap.add_argument("--dry-run", action="store_true", required=True, help="show, change nothing (the only mode: to apply, put the file in place and "
                    "reload the daemon)")
    ap.add_argument("--prove", action="store_true",
                    help="also prove each change that stops a deployment, in short-lived probe containers of what is "
                         "already on the nodes (read-only mounts, no network); still no pull, prefetch or removal")
    add("teardown", ops.cmd_teardown, "remove what the supervisor owns, on every node")
    add("reset", ops.cmd_reset, "re-arm after FAILED and forget the repair budget")
    st = add("status", status.cmd_status, "what the daemon last wrote: phase, nodes, Ray, serve, history", json=True,
             epilog=_status_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    st.add_argument("--state-dir", default="", help="read the status from here instead of the config's")
    st.add_argument("--follow", "-f", action="store_true", help="a live progress bar until SERVING or FAILED")
    pa = add("pause", maintenance.cmd_pause, "maintenance: keep observing and reporting, act on nothing, "
             "spend no repair budget")
    pa.add_argument("--for", dest="duration", default="", metavar="DURATION",
                    help="resume by itself after this long (30m, 1h30m, 90s; a bare number is minutes)")
    pa.add_argument("--reason", default="", help="shown in status and STATUS=")
    add("resume", maintenance.cmd_resume, "leave maintenance mode: detect afresh and reconcile")
    rs = add("restart", maintenance.cmd_restart, "relaunch the models: a start, logged with who asked, not a "
             "repair (the budget is not charged)")
    rs.add_argument("deployment", nargs="?", default="", help="only this deployment (default: every one)")
    rs.add_argument("--serve-only", action="store_true", help="relaunch the serve alone; the containers stay")
    logs.add_arguments(add("logs", logs.cmd_logs, "the serve's log of the current launch (or the previous) on a node"))
    record.add_arguments(add("record", record.cmd_record, "what a deployment ran on when it last reached SERVING "
                             "(or when it last failed), or what changed since the last good serve (--diff)", json=True))
    add("report", record.cmd_report, "a support bundle (tar.gz): records, status, transitions, the serve logs' "
        "tails, the config, secrets removed").add_argument(
        "--out", "-o", default="", metavar="FILE",
        help="where to write it: a new or regular file, or - for standard output (default: "
             "<state_dir>/reports/spark-supervisor-report-<UTC time>.tar.gz)")
    record.add_capture(sub.choices["report"])
    from . import copy as model_copy  # standard library only, as the modules above
    model_copy.add_arguments(add("copy-model", model_copy.cmd_copy_model, "copy the deployment's model from the head to a member, verified; refused while it serves", json=True))
    ls = add("logscan", tools.cmd_logscan, "read a vLLM serve log: phase reached, timings, failure and hint",
             config=False, json=True)
    ls.add_argument("file", help="the log file, or - for standard input")
    add("version", tools.cmd_version, "print the version, the Python and where it runs from", config=False, json=True)
    add("completion", tools.cmd_completion, "print the shell completion script", config=False,
        epilog='bash: eval "$(spark-supervisor completion bash)" in ~/.bashrc, or the output saved as '
        "/usr/local/share/bash-completion/completions/spark-supervisor (`make install` does); zsh: the same "
        "line in ~/.zshrc (after compinit)").add_argument("shell", choices=("bash", "zsh", "fish", "tcsh"),
                                         help="the shell (bash, zsh, fish or tcsh)")
    add("schema", tools.cmd_schema, "print the config file's JSON Schema (for editors that validate TOML)",
        config=False).set_defaults(json_ok=True)  # JSON in any case
    json_global.help = f"{json_help} ({', '.join(n for n, sp in sub.choices.items() if sp.get_default('json_ok'))})"
    return p


def main(argv: Sequence[str] | None = None) -> int:
    p = parser()
    if "_ARGCOMPLETE" in os.environ:  # a shell asking for completions (argcomplete's protocol): answer, exit
        import argcomplete
        argcomplete.autocomplete(p)
    args = p.parse_args(argv)
    if args.json and not args.json_ok:
        p.error(f"--json: `{args.command}` has no JSON output")
    try:
        code = int(args.fn(args))
        sys.stdout.flush()  # here, where a closed pipe can be caught, not at the interpreter's exit
        return code
    except BrokenPipeError:  # `check | head -1`: the reader has what it wants; no traceback at exit either
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
