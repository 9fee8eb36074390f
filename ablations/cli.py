"""What the command-line tools share: argparse that reports a bad argument as one line and exit status 2."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn


class OneLineParser(argparse.ArgumentParser):
    """argparse without the usage dump: an error is one ``error: ...`` line on stderr and exit status 2."""

    def error(self, message: str) -> NoReturn:
        fail(message)


def fail(message: str) -> NoReturn:
    sys.stderr.write(f"error: {' '.join(str(message).split())}\n")
    sys.exit(2)
