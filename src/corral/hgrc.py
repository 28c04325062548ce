"""Reading Mercurial's configuration files the way hg 6.3 reads them (``config.py``).

hg runs what its config names on the host: hooks (``[hooks]``, on ``hg status`` too), the
pager, the editor, merge and diff tools, ``fix`` tools, the watchman it starts, and it
loads extensions from files.  What those name in a writable tree must be kept as git's
commands are (:mod:`corral.repos`).  Lines: ``[section]``; ``name = value`` (a line that
starts with blanks continues the value); ``%include path`` (``~`` and variables expanded,
relative to the including file's folder); ``%unset name``; ``#`` or ``;`` comments.  A line
hg would reject is refused too.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator

__all__ = ["GLOBAL_CONFIGS", "ConfigError", "commands", "expand", "included", "parse"]

GLOBAL_CONFIGS = ("/etc/mercurial/hgrc", "~/.hgrc", "~/.config/hg/hgrc")
SECTION = re.compile(r"\[([^\[]+)\]")
ITEM = re.compile(r"([^=\s][^=]*?)\s*=\s*(.*\S|)")
CONTINUED = re.compile(r"\s+(\S|\S.*\S)\s*$")
EMPTY = re.compile(r"(;|#|\s*$)")
COMMENT = re.compile(r"(;|#)")
UNSET = re.compile(r"%unset\s+(\S+)")
INCLUDE = re.compile(r"%include\s+(\S|\S.*\S)\s*$")
# (section, key) whose value hg runs as a shell command or program; "*" any key,
# ".suffix" a key ending so
COMMAND_KEYS = {("hooks", "*"), ("ui", "editor"), ("ui", "ssh"), ("ui", "merge"),
                ("pager", "pager"), ("merge-tools", ".executable"),
                ("diff-tools", ".executable"), ("extdiff", "*"), ("fix", ":command"),
                ("fix", ".command"), ("fsmonitor", "watchman_exe"), ("alias", "*"),
                # review 36: hg import, the merge tool's arguments (through the shell),
                # hg email, the gpg extension
                ("ui", "patch"), ("merge-tools", ".args"), ("email", "method"),
                ("gpg", "cmd")}


class ConfigError(ValueError):
    """A line hg would not read."""


def parse(data: bytes) -> list[tuple[str, str, str | None]]:
    """(section, name, value) in order, and ("%include", path, None) where a file is
    included (to be read there, in place)."""
    out: list[tuple[str, str, str | None]] = []
    section, item, cont = "", None, False
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    # Lines as hg splits them: bytes' line ends, not str's (\x0c, \x85, U+2028...)
    for n, raw in enumerate(data.splitlines(True), 1):
        line = raw.decode(errors="surrogateescape")
        if cont:
            if COMMENT.match(line):
                continue
            m = CONTINUED.match(line)
            if m and item is not None:
                for i in range(len(out) - 1, -1, -1):
                    if out[i][:2] == (section, item):
                        out[i] = (section, item, f"{out[i][2]}\n{m.group(1)}")
                        break
                continue
            item, cont = None, False
        m = INCLUDE.match(line)
        if m:
            out.append(("%include", m.group(1), None))
            continue
        if EMPTY.match(line):
            continue
        m = SECTION.match(line)
        if m:
            section = m.group(1)
            continue
        m = ITEM.match(line)
        if m:
            item, cont = m.group(1), True
            out.append((section, item, m.group(2)))
            continue
        if UNSET.match(line):
            continue
        raise ConfigError(f"line {n}: {line.rstrip()!r}")
    return out


def expand(path: str, home: str) -> str:
    """A path as hg expands it (``~``, variables: the launcher's, with HOME the user's)."""
    expanded = os.path.expandvars(path.replace("${HOME}", home).replace("$HOME", home))
    if expanded == "~" or expanded.startswith("~/"):
        expanded = home + expanded[1:]
    return expanded


def included(arg: str, including: str, home: str) -> str:
    """An ``%include``'s file, relative to the folder of the file that names it."""
    return os.path.normpath(os.path.join(os.path.dirname(including), expand(arg, home)))


def _command_key(section: str, key: str) -> bool:
    for s, k in COMMAND_KEYS:
        if s == section and (k == "*" or k == key or (k[0] in ".:" and key.endswith(k))):
            return True
    return False


def commands(entries: list[tuple[str, str, str | None]]
             ) -> Iterator[tuple[str, str, str]]:
    """(name, kind, text): "shell" for a command hg runs (an alias's ``!`` taken off),
    "python" for a file of Python a hook or an extension loads."""
    for section, key, value in entries:
        if section == "%include" or not value or not value.strip():
            continue
        name = f"{section}.{key}"
        if section == "extensions":
            if not value.startswith("!"):
                yield name, "python", value.strip()
            continue
        if not _command_key(section, key):
            continue
        text = value.strip()
        if section == "hooks" and text.startswith("python:"):
            spec = text[len("python:"):]
            if ":" in spec:  # python:PATH:func: any PATH, a file or a package folder
                yield name, "python", spec.rsplit(":", 1)[0]  # (review 36)
            continue
        if section == "alias":
            if not text.startswith("!"):
                continue
            text = text[1:]
        yield name, "shell", text
