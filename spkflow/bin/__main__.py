"""``spkflow COMMAND [args]`` (or ``python -m spkflow.bin COMMAND``): one entry point for every
``python -m spkflow.bin.COMMAND``, as lhotse's and WeSpeaker's command-line tools have one.

``spkflow`` alone lists the commands with the first line of each one's docstring; the arguments
after the command go to it unchanged, so ``spkflow train --help`` is ``python -m
spkflow.bin.train --help``.
"""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
NOT_COMMANDS = {"__init__", "__main__", "argtypes"}


def commands() -> dict[str, str]:
    """Command name -> the first line of its module docstring (read from the source, nothing imported)."""
    out = {}
    for path in sorted(HERE.glob("*.py")):
        if path.stem in NOT_COMMANDS:
            continue
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        out[path.stem] = doc.strip().splitlines()[0] if doc.strip() else ""
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    known = commands()
    if not argv or argv[0] in ("-h", "--help"):
        width = max(map(len, known))
        lines = [f"  {name:<{width}}  {line}" for name, line in known.items()]
        print("usage: spkflow COMMAND [ARGS...]   (each command has --help)\n\ncommands:\n" + "\n".join(lines))
        return 0
    name = argv[0].replace("-", "_")
    if name not in known:
        print(f"spkflow: unknown command {argv[0]!r}; run 'spkflow --help' for the list", file=sys.stderr)
        return 2
    sys.argv = [f"spkflow {argv[0]}", *argv[1:]]
    return int(importlib.import_module(f"spkflow.bin.{name}").main(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
