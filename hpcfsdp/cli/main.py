"""The `hpcfsdp` command: a registry of subcommands, each a module with `add_parser(subparsers)`."""

import argparse
import importlib
import sys

from hpcfsdp._version import __version__

__all__ = ["main", "build_parser", "COMMANDS"]

# Subcommand modules, in the order `hpcfsdp --help` lists them. Each exposes
# `add_parser(subparsers)`, which registers its parser and sets `func(args) -> int`.
COMMANDS = (
    "hpcfsdp.cli.info",
    "hpcfsdp.cli.launch",
    "hpcfsdp.cli.demo",
    "hpcfsdp.cli.train",
    "hpcfsdp.cli.data",
    "hpcfsdp.cli.bench",
    "hpcfsdp.cli.plan",
    "hpcfsdp.cli.slurm",
    "hpcfsdp.cli.checkpoint",
    "hpcfsdp.cli.generate",
    "hpcfsdp.cli.plot",
    "hpcfsdp.cli.trace",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hpcfsdp",
        description="Fully sharded data-parallel training on MPI, NumPy and CuPy.",
    )
    parser.add_argument("--version", action="version", version=f"hpcfsdp {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(name).add_parser(sub)
    return parser


def _error_once(parser, message):
    """argparse's error(), printed by rank 0 only: every rank of a job parses the same arguments."""
    from .runtime import launch_rank

    if launch_rank() == 0:
        parser.print_usage(sys.stderr)
        sys.stderr.write(f"{parser.prog}: error: {message}\n")
    sys.exit(2)


def main(argv=None) -> int:
    parser = build_parser()
    parser.error = _error_once.__get__(parser)
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
