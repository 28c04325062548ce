"""What an agent's program needs from the hidden trees, and nothing more.

Started from a hidden tree (``~/.cargo/bin/cargo``, ``~/.npm-global/bin/claude``), the
agent's program needs its own file, what that links to, and for a script its
interpreter.  Mounting the whole installation prefix (all of ``~/.cargo``) would show
``credentials.toml`` to every build script, so only these are mounted read-only:

* the program's own file, and the file it links to;
* the package folder of a script (the nearest folder above it with a ``package.json``),
  whose modules it loads;
* an interpreter's installation prefix (the parent of its ``bin``, with the landmark
  the interpreter itself looks for), which holds its standard library: the one kind of
  folder mounted even where the agent's user could not reach it on the host (root's
  pyenv), with search, never listing, granted on the folders above it;

never the home directory, a folder holding it, or ``~/.local`` whole; never any other
path the agent's own user cannot reach on the host (started by root, root's own
``/root/.cargo`` is another user's folder).  Secret and credential names inside what is mounted
are hidden (:func:`corral.discover.secrets_in`).
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Sequence

from . import fsops
from .errors import UsageError
from .interp import installed, is_interpreter
from .reach import can_reach

__all__ = ["needed"]


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def needed(found: str, hidden: Sequence[str], home: str, uid: int, gid: int
           ) -> tuple[list[tuple[str, str]], list[str]]:
    """(path, "file" or "dir") to mount read-only so that ``found`` runs as ``uid``, and
    the interpreter installations among them, whose parents the agent may search."""
    out: dict[str, str] = {}
    installs: list[str] = []
    _add(found, hidden, home, uid, gid, out, installs, depth=0)
    dirs = [p for p, k in out.items() if k == "dir"]
    return [(p, k) for p, k in out.items()
            if k == "dir" or not any(_under(p, d) for d in dirs)], installs


def _add(found: str, hidden: Sequence[str], home: str, uid: int, gid: int,
         out: dict[str, str], installs: list[str], depth: int) -> None:
    real = os.path.realpath(found)
    hid = any(_under(real, t) for t in hidden)
    # An interpreter's installation (its own landmark checked) is mounted whole even where
    # the agent's user cannot reach it on the host (root's pyenv, say): it holds no one's
    # secrets, and the launcher chose it from its own PATH.  Anything else must be
    # reachable by that user: corral never mounts another user's folder.
    prefix = _interpreter_prefix(real, home) if hid else None
    for path in dict.fromkeys((found, real)):
        if not any(_under(path, t) for t in hidden) or (prefix and _under(path, prefix)):
            continue
        if not can_reach(path, uid, gid):
            raise UsageError(
                f"the agent's program {path} is in a folder its user (uid {uid}) cannot "
                "reach on the host", "corral never mounts another user's folder",
                "install the program where that user can run it, or under /usr")
        out.setdefault(path, "file")
    if prefix is not None:
        out[prefix] = "dir"
        installs.append(prefix)
    elif hid and (package := _package_folder(real, hidden, home)) is not None:
        out[package] = "dir"
    interpreter = _shebang(found)
    if interpreter is not None and depth < 4:
        import shutil  # with bz2 and lzma ~2.5 ms: only for a script that names its interpreter

        located = shutil.which(interpreter) if "/" not in interpreter else interpreter
        if located and located != found:
            _add(located, hidden, home, uid, gid, out, installs, depth + 1)


def _safe_folder(path: str, home: str) -> bool:
    return path not in (home, os.path.join(home, ".local"), "/") and not _under(home, path)


def _interpreter_prefix(real: str, home: str) -> str | None:
    """An interpreter's installation prefix, which its standard library lives in."""
    bindir = os.path.dirname(real)
    prefix = os.path.dirname(bindir)
    if not is_interpreter(os.path.basename(real)) or os.path.basename(bindir) != "bin":
        return None
    if not _safe_folder(prefix, home) or not installed(prefix, real):
        return None
    return prefix


def _package_folder(real: str, hidden: Sequence[str], home: str) -> str | None:
    """The nearest folder above a script that has a package.json: its package."""
    here = os.path.dirname(real)
    while any(_under(here, t) and here != t for t in hidden) and _safe_folder(here, home):
        try:
            if stat.S_ISREG(os.lstat(os.path.join(here, "package.json")).st_mode):
                return here
        except OSError:
            pass
        here = os.path.dirname(here)
    return None


def _shebang(path: str) -> str | None:
    """The interpreter a script's first line names (``env NAME`` gives NAME)."""
    try:
        head = fsops.read_file(path, 256, whole=False)
    except OSError:
        return None
    line = (head or b"").split(b"\n", 1)[0].decode(errors="replace")
    match = re.match(r"#!\s*(\S+)(?:\s+(\S+))?", line)
    if match is None:
        return None
    if os.path.basename(match.group(1)) == "env" and match.group(2):
        return match.group(2)
    return match.group(1)
