"""The one exception every ``ebplus`` subcommand raises for an expected failure.

It lives apart from :mod:`ebplus.cli` (the entry point, the top layer of the import
contract) so that the layers below it (``ebplus.deploy``, ...) can raise it without
importing upwards; ``ebplus.cli.main`` prints it as one line and exits with code 2.
"""

from __future__ import annotations


class CommandError(Exception):
    """Bad input or an expected failure detected by a subcommand: one line, exit code 2."""
