"""Reading git's configuration files the way git reads them (git 2.39, ``config.c``).

corral does not run git to read a config: the config may sit in a payload-writable tree,
and ``git config`` itself would obey parts of it.  This parser follows ``config.c``
character by character: sections ``[name]``, ``[name "sub"]`` (with ``\\"`` and
``\\\\`` escapes) and the old ``[name.sub]``; a key may follow a header on the same line;
``#`` and ``;`` start a comment anywhere outside double quotes; quotes may open and close
anywhere in a value; ``\\n``, ``\\t``, ``\\b``, ``\\"``, ``\\\\`` and a backslash at the
end of a line (continuation); runs of blanks inside a value are kept, blanks at its ends
are not; a key alone (no ``=``) is the boolean true.  What git would reject
(:class:`ConfigError`) corral rejects too: it cannot be sure what git would make of it.

Names come back as git prints them: section and key in lower case, a ``"sub"`` section
as written.  Values are text with undecodable bytes kept (``surrogateescape``).
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Iterator, Sequence

__all__ = ["MAX_INCLUDE_DEPTH", "ConfigError", "commands", "expand", "is_bool", "last",
           "parse"]

MAX_INCLUDE_DEPTH = 10  # git's own limit on nested includes
BOOLS = {"true", "yes", "on", "1", "false", "no", "off", "0", ""}
# Keys whose values git runs as a program or a shell command, matched as
# (section, subsection is present, key); "*" in the middle stands for any subsection.
COMMAND_KEYS = {
    ("core", False, "fsmonitor"), ("core", False, "sshcommand"), ("core", False, "pager"),
    ("core", False, "editor"), ("core", False, "askpass"), ("core", False, "gitproxy"),
    ("sequence", False, "editor"), ("gpg", False, "program"), ("gpg", True, "program"),
    ("credential", False, "helper"), ("credential", True, "helper"),
    ("diff", False, "external"), ("diff", True, "command"), ("diff", True, "textconv"),
    ("difftool", True, "cmd"), ("mergetool", True, "cmd"), ("merge", True, "driver"),
    ("filter", True, "clean"), ("filter", True, "smudge"), ("filter", True, "process"),
    ("interactive", False, "difffilter"), ("uploadpack", False, "packobjectshook"),
    ("remote", True, "uploadpack"), ("remote", True, "receivepack"),
    # Review 32: gpg.ssh.defaultKeyCommand runs on every signed commit; the rest run on
    # their commands (git mergetool, difftool, archive, interpret-trailers, send-email,
    # help -w, help -m, submodule update).
    ("gpg", True, "defaultkeycommand"), ("mergetool", True, "path"),
    ("difftool", True, "path"), ("tar", True, "command"), ("trailer", True, "cmd"),
    ("trailer", True, "command"), ("sendemail", False, "smtpserver"),
    ("sendemail", True, "smtpserver"), ("sendemail", False, "tocmd"),
    ("sendemail", True, "tocmd"), ("sendemail", False, "cccmd"), ("sendemail", True, "cccmd"),
    ("sendemail", False, "sendmailcmd"), ("sendemail", True, "sendmailcmd"),
    ("browser", True, "cmd"), ("browser", True, "path"), ("man", True, "cmd"),
    ("man", True, "path"), ("submodule", True, "update"),
    # Review 34: run by fetch and push with alternates, imap-send, git gui, instaweb
    ("core", False, "alternaterefscommand"), ("imap", False, "tunnel"),
    ("guitool", True, "cmd"), ("instaweb", False, "httpd"), ("gui", False, "editor"),
}
COMMAND_SECTIONS = ("alias", "pager")  # every key of these is a command (or may be)
# Keys whose values are folders git copies or runs hooks from.
HOOK_FOLDERS = ("core.hookspath", "init.templatedir")


class ConfigError(ValueError):
    """The text is not a config git would read; ``line`` is where git would stop."""

    def __init__(self, line: int, why: str) -> None:
        super().__init__(f"line {line}: {why}")
        self.line = line


class _Source:
    """The characters of one file, as ``get_next_char`` hands them out."""

    def __init__(self, data: bytes) -> None:
        self.text = data.removeprefix(b"\xef\xbb\xbf").decode("utf-8", "surrogateescape")
        self.pos = 0
        self.line = 1
        self.eof = False

    def next(self) -> str:
        if self.pos >= len(self.text):
            self.eof = True
            return "\n"  # like git: the end of the file ends the last line
        c = self.text[self.pos]
        self.pos += 1
        if c == "\r" and self.text[self.pos:self.pos + 1] == "\n":
            self.pos += 1
            c = "\n"
        if c == "\n":
            self.line += 1
        return c


def _keychar(c: str) -> bool:
    return c.isascii() and (c.isalnum() or c == "-")


def _space(c: str) -> bool:
    return c in " \t\n\v\f\r"


def parse(data: bytes) -> list[tuple[str, str | None]]:
    """Every (name, value) of the config ``data``, in order; ConfigError where git fails."""
    src, stem, comment = _Source(data), "", False
    out: list[tuple[str, str | None]] = []
    while True:
        c = src.next()
        if c == "\n":
            if src.eof:
                return out
            comment = False
        elif comment or _space(c):
            continue
        elif c in "#;":
            comment = True
        elif c == "[":
            stem = _section(src) + "."
        elif c.isascii() and c.isalpha():
            out.append(_entry(src, stem, c))
        else:
            raise ConfigError(src.line, "not a section, a key or a comment")


def _section(src: _Source) -> str:
    name = ""
    while True:
        c = src.next()
        if src.eof or (not _keychar(c) and c not in ".]" and not _space(c)):
            raise ConfigError(src.line, "bad section header")
        if c == "]":
            if not name:
                raise ConfigError(src.line, "empty section name")
            return name
        if _space(c):
            return name + "." + _subsection(src, c)
        name += c.lower()


def _subsection(src: _Source, c: str) -> str:
    while _space(c):
        if c == "\n":
            raise ConfigError(src.line, "incomplete section header")
        c = src.next()
    if c != '"':
        raise ConfigError(src.line, 'a subsection must be in double quotes: [name "sub"]')
    sub = ""
    while True:
        c = src.next()
        if c == "\n":
            raise ConfigError(src.line, "incomplete section header")
        if c == '"':
            break
        if c == "\\":
            c = src.next()
            if c == "\n":
                raise ConfigError(src.line, "incomplete section header")
        sub += c
    if src.next() != "]":
        raise ConfigError(src.line, "bad section header")
    return sub


def _entry(src: _Source, stem: str, first: str) -> tuple[str, str | None]:
    key = first.lower()
    while True:
        c = src.next()
        if src.eof or not _keychar(c):
            break
        key += c.lower()
    while c in " \t":
        c = src.next()
    if c == "\n":
        return stem + key, None
    if c != "=":
        raise ConfigError(src.line, f"bad key {key!r}")
    return stem + key, _value(src)


ESCAPES = {"t": "\t", "b": "\b", "n": "\n", "\\": "\\", '"': '"'}


def _value(src: _Source) -> str:
    value, quote, comment, spaces = "", False, False, 0
    while True:
        c = src.next()
        if c == "\n":
            if quote:
                raise ConfigError(src.line, "unterminated double quote")
            return value
        if comment:
            continue
        if _space(c) and not quote:
            spaces += 1 if value else 0
            continue
        if not quote and c in ";#":
            comment = True
            continue
        value, spaces = value + " " * spaces, 0
        if c == "\\":
            c = src.next()
            if c == "\n":
                continue
            if c not in ESCAPES:
                raise ConfigError(src.line, f"bad escape \\{c}")
            value += ESCAPES[c]
        elif c == '"':
            quote = not quote
        else:
            value += c


def split_name(name: str) -> tuple[str, str | None, str]:
    """("section", "subsection" or None, "key") of a parsed name."""
    section, _, rest = name.partition(".")
    sub, _, key = rest.rpartition(".")
    return section, (sub if _ else None), key


def last(entries: Sequence[tuple[str, str | None]], name: str) -> str | None:
    """The value of ``name`` git uses: the last non-empty one."""
    values = [v for n, v in entries if n == name and v]
    return values[-1] if values else None


def is_bool(value: str | None) -> bool:
    return value is None or value.strip().lower() in BOOLS


def expand(path: str, home: str) -> str | None:
    """``~/`` and ``~user/`` as git's ``interpolate_path`` reads them; None for forms git
    expands from its own install (``%(prefix)/``) or a user that does not exist."""
    if path.startswith("%(prefix)/"):
        return None
    if path == "~" or path.startswith("~/"):
        return home + path[1:]
    if path.startswith("~"):
        user, _, rest = path[1:].partition("/")
        try:
            return os.path.join(pwd.getpwnam(user).pw_dir, rest)
        except KeyError:
            return None
    return path


def commands(entries: list[tuple[str, str | None]]) -> Iterator[tuple[str, str]]:
    """(name, text) of every value git would run as a program or a shell command (an
    alias's ``!`` taken off); :mod:`corral.shellread` reads what the text names."""
    for name, value in entries:
        section, sub, key = split_name(name)
        # An ext:: URL is a command git-remote-ext runs (with protocol.ext.allow): in a
        # remote's or submodule's URL, or as what url.<ext::...>.insteadOf puts in
        # (review 35: `remote.origin.url = ext::sh fsm.sh` ran on fetch)
        url = value if key in ("url", "pushurl") and section in ("remote", "submodule") \
            else sub if section == "url" and key in ("insteadof", "pushinsteadof") else None
        if url and url.startswith("ext::") and url[5:].strip():
            yield name, url[5:].strip()
            continue
        command = section in COMMAND_SECTIONS or (section, sub is not None, key) in COMMAND_KEYS
        if not command or value is None or (name == "core.fsmonitor" and is_bool(value)):
            continue
        text = value.strip()
        text = text[1:] if text.startswith("!") else text
        if text.strip():
            yield name, text
