"""The ``broker`` command line: one module per sub-command under ``broker/cli/``.

Each module defines ``register(subparsers)`` (adds its parser and sets ``func``) and keeps
its own imports lazy where they are heavy, so ``broker --help`` stays fast.
Exit codes: 0 success, 1 runtime failure, 2 bad input (nothing was started).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# Sub-commands in the order ``--help`` lists them.
COMMANDS = ("validate", "plan", "estimate", "simulate", "run", "status", "report", "down", "runs", "catalog",
            "iam_policy")


class UsageError(Exception):
    """Bad input detected by a command; printed without a traceback, exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    from broker import __version__

    parser = argparse.ArgumentParser(
        prog="broker",
        description="Run a bag of independent tasks on your own machines plus the EC2 "
        "instances it rents, within a deadline or a budget.",
    )
    parser.add_argument("--version", action="version", version=f"broker {__version__}")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"broker.cli.{name}")
        except ModuleNotFoundError as exc:  # a command not built yet is simply not offered
            if exc.name == f"broker.cli.{name}":
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from broker.config.errors import ConfigError
    from broker.shells.diskfull import DiskFull, is_disk_full
    from broker.shells.logging import configure_logging
    from broker.shells.private_files import private_files

    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    configure_logging(level=args.log_level)
    try:
        with private_files():  # every file a command writes is 0600, every directory 0700
            return int(args.func(args) or 0)
    except ConfigError as exc:
        print(exc.render(), file=sys.stderr)
        return 2
    except UsageError as exc:
        print(f"broker {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (DiskFull, OSError) as exc:
        if not is_disk_full(exc):
            raise
        if not isinstance(exc, DiskFull):
            where = os.path.dirname(os.path.abspath(exc.filename)) if exc.filename else os.getcwd()
            exc = DiskFull(where, f"cannot write {exc.filename or 'a file'} ({exc.strerror})")
        print(f"broker {args.command}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
