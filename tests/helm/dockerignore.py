"""``.dockerignore`` read the way Docker reads it, and the sources of a Dockerfile's COPY lines.

There is no Docker daemon on these machines, so the image is checked statically: which
files of the build context ``docker build`` would send, and whether every COPY source is
among them. The rules follow Docker's documented behaviour (moby's patternmatcher, used
by both the classic builder and BuildKit):

* a line starting with ``#`` is a comment; surrounding whitespace is trimmed; empty lines
  are skipped;
* ``!`` makes an exception (re-includes what an earlier pattern excluded);
* a pattern is cleaned like a path (``a/./b`` -> ``a/b``, a trailing ``/`` dropped) and a
  leading ``/`` is dropped: every pattern is relative to the context root;
* ``*`` matches any run of characters except ``/``, ``?`` one such character, ``[...]`` a
  class; ``**`` matches any number of directories, zero included (``**/x`` matches ``x``);
* a pattern matches a path if it matches the path itself or one of its parent directories;
* the last pattern that matches decides.
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

_REGEX_SPECIAL = set(".+()|{}$^")


def _translate(pattern: str) -> re.Pattern[str]:
    """The regular expression Docker compiles a cleaned pattern into."""
    out, i = ["^"], 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "*":
            if pattern[i + 1 : i + 2] == "*":
                i += 1
                if pattern[i + 1 : i + 2] == "/":  # "**/" is "**"
                    i += 1
                # "**" at the end matches everything below; elsewhere any number of directories
                out.append(".*" if i + 1 == len(pattern) else "(.*/)?")
            else:
                out.append("[^/]*")
        elif ch == "?":
            out.append("[^/]")
        elif ch == "\\":
            if i + 1 < len(pattern):
                i += 1
                out.append(re.escape(pattern[i]))
            else:
                out.append(r"\\")
        elif ch in _REGEX_SPECIAL:
            out.append("\\" + ch)
        else:
            out.append(ch)  # includes "[" and "]": character classes pass through
        i += 1
    out.append("$")
    return re.compile("".join(out))


@dataclass(frozen=True)
class Pattern:
    """One line of ``.dockerignore``."""

    text: str
    exception: bool
    regex: re.Pattern[str]

    def matches(self, path: str) -> bool:
        """Whether the pattern matches ``path`` or one of its parent directories."""
        if self.regex.match(path):
            return True
        parts = path.split("/")[:-1]
        return any(self.regex.match("/".join(parts[: i + 1])) for i in range(len(parts)))


def parse(text: str) -> list[Pattern]:
    """The patterns of a ``.dockerignore`` file, in order."""
    patterns = []
    for raw in text.splitlines():
        if raw.startswith("#"):
            continue
        line = raw.strip()
        if not line:
            continue
        exception = line.startswith("!")
        if exception:
            line = line[1:].strip()
        if not line:
            raise ValueError(f"illegal exclusion pattern: {raw!r}")
        cleaned = posixpath.normpath(line)
        if len(cleaned) > 1 and cleaned.startswith("/"):
            cleaned = cleaned.lstrip("/")
        patterns.append(Pattern(raw.strip(), exception, _translate(cleaned)))
    return patterns


class DockerIgnore:
    """The patterns of a build context's ``.dockerignore``."""

    def __init__(self, text: str) -> None:
        self.patterns = parse(text)

    @classmethod
    def of_context(cls, context: Path) -> DockerIgnore:
        path = context / ".dockerignore"
        return cls(path.read_text() if path.exists() else "")

    def excluded(self, path: str) -> bool:
        """Whether ``path`` (relative to the context, ``/``-separated) is left out of the context."""
        path = posixpath.normpath(path).lstrip("/")
        verdict = False
        for pattern in self.patterns:
            if pattern.exception == verdict and pattern.matches(path):  # only a change can matter
                verdict = not pattern.exception
        return verdict

    def kept(self, paths: list[str]) -> list[str]:
        return [p for p in paths if not self.excluded(p)]


@dataclass(frozen=True)
class Copy:
    """A COPY (or ADD) instruction of the final image: its sources in the build context."""

    line: int
    sources: tuple[str, ...]
    dest: str


def instructions(dockerfile: str) -> list[tuple[int, str, str]]:
    """``(line, INSTRUCTION, arguments)`` with continuation lines joined and comments dropped."""
    out: list[tuple[int, str, str]] = []
    buffer, start = "", 0
    for number, raw in enumerate(dockerfile.splitlines(), 1):
        stripped = raw.strip()
        if not buffer and (not stripped or stripped.startswith("#")):
            continue
        if buffer and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if not buffer:
            start = number
        if stripped.endswith("\\"):
            buffer += stripped[:-1] + " "
            continue
        buffer += stripped
        keyword, _, args = buffer.partition(" ")
        out.append((start, keyword.upper(), args.strip()))
        buffer = ""
    return out


def copies(dockerfile: str) -> list[Copy]:
    """The context sources of every COPY/ADD (``--from=`` copies read another stage, not the context)."""
    found = []
    for line, keyword, args in instructions(dockerfile):
        if keyword not in ("COPY", "ADD"):
            continue
        flags, rest = re.match(r"^((?:--\S+\s+)*)(.*)$", args, re.S).groups()
        if "--from=" in flags:
            continue
        words = json.loads(rest) if rest.startswith("[") else shlex.split(rest)
        *sources, dest = words
        found.append(Copy(line, tuple(sources), dest))
    return found
