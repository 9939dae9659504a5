"""Subcommands of the `tracelab` CLI, one module each (see tracelab.cli.COMMANDS)."""
