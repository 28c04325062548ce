"""Which program a command names, and which interpreter prefix it needs: resolved from
the launcher's own settings, never by running anything, never on the word of a file the
payload can write (DESIGN, wave 2, root 1).

* A pyenv shim is only a file in the launcher's own ``$PYENV_ROOT/shims`` (from its
  environment; else pyenv's default ``.pyenv`` in the launcher's home, by ``$HOME`` and
  by its account).  Its version comes from ``PYENV_VERSION``,
  else the nearest ``.python-version``, else ``$PYENV_ROOT/version``: each word only a
  *name*, which must be an installed ``$PYENV_ROOT/versions/NAME`` (a ``.python-version``
  in a project may choose among installed versions, never a path).  ``system`` is the
  next match on ``PATH`` after the shims.  pyenv itself is never run.
* An interpreter is mounted by its installation prefix (the parent of its ``bin``).  A
  prefix holding a home directory is refused; one inside a home directory only when it is
  an installation (the landmark the interpreter itself looks for: ``lib/pythonX.Y/os.py``,
  node's ``lib/node_modules``), never a home's ``.local`` whole; one inside a writable
  tree never.
* A virtualenv's base interpreter comes from the real path of its own ``bin/python``
  (``pyvenv.cfg``'s ``home`` only for a venv made with ``--copies``); because a venv may
  sit in a payload-writable tree, its prefix inside the home directory is accepted only
  when it is corral's own Python or an installed pyenv version.
"""

from __future__ import annotations

import os

from . import fsops, small
from .errors import UsageError, pattern
from .policy import check_path

TYPE_CHECKING = False  # typing costs ~3 ms at every start (corral.record says why)
if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["check_prefix", "homes", "installed", "is_interpreter", "prefix_of",
           "pyenv_roots", "venv", "which", "which_command"]

_INTERPRETERS = frozenset(("python", "pypy", "node", "nodejs", "deno", "bun", "ruby", "perl"))
VERSION_NAME = r"[A-Za-z0-9][A-Za-z0-9._+-]*\Z"  # compiled where used: corral.errors.pattern
SMALL = 64 << 10  # bytes of a .python-version or pyvenv.cfg read


def is_interpreter(name: str) -> bool:
    """Whether the program name ``name`` is an interpreter's (``python3.11``, ``node``,
    ``perl5.36``): one of the names, then ASCII digits and dots only."""
    return name.rstrip("0123456789.") in _INTERPRETERS


def _under(path: str, roots: Sequence[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _home() -> str:
    return os.path.realpath(os.path.expanduser("~"))


def homes() -> list[str]:
    """Every home directory an interpreter must not be taken from without proof: the
    launcher's own, ``$HOME``, and (started by root, whose runs reach every user's files)
    every user's under /home and /root."""
    found = {_home(), os.path.realpath(os.environ.get("HOME") or _home()),
             *_user_homes(_passwd_version())}
    return sorted(h for h in found if h not in ("/", ""))


def _passwd_version() -> tuple[int, int, int] | None:
    try:
        st = os.stat("/etc/passwd")
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


@small.cache_last  # per /etc/passwd version: getpwall was 0.6 ms of each run
def _user_homes(version: tuple[int, int, int] | None) -> tuple[str, ...]:
    import pwd

    del version  # the cache key only: a changed /etc/passwd is read again (users that come
    # from NSS alone, such as LDAP, are seen as of the first run of this process)
    return tuple(os.path.realpath(e.pw_dir) for e in pwd.getpwall()
                 if e.pw_dir.startswith(("/home/", "/root")))


def installed(prefix: str, exe: str) -> bool:
    """Whether ``prefix`` is an interpreter's installation, by the landmark the
    interpreter itself looks for: a Python's ``lib/pythonX.Y/os.py``, node's
    ``lib/node_modules`` or ``include/node``, else a ``lib`` folder."""
    if prefix in {os.path.join(h, ".local") for h in homes()}:
        return False  # pip --user and friends share it with keyrings and more
    name = os.path.basename(exe)
    lib = os.path.join(prefix, "lib")
    if name.startswith(("python", "pypy")):
        return any(os.path.isfile(os.path.join(lib, d, "os.py")) for d in _listing(lib)
                   if d.startswith(("python", "pypy")))
    if name.startswith("node"):
        return os.path.isdir(os.path.join(lib, "node_modules")) or os.path.isdir(
            os.path.join(prefix, "include", "node"))
    return os.path.isdir(lib)


def _listing(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def which(name: str, search: str) -> str | None:
    """The first executable regular file ``name`` on ``search`` (absolute entries only)."""
    for d in search.split(os.pathsep):
        if not d or not os.path.isabs(d):
            continue
        candidate = os.path.join(d, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def pyenv_roots() -> list[str]:
    """The launcher's own pyenv roots (never one a file names): ``$PYENV_ROOT``, else
    pyenv's default in the launcher's home, by ``$HOME`` and by its account."""
    import pwd

    if os.environ.get("PYENV_ROOT"):
        return [os.path.realpath(os.environ["PYENV_ROOT"])]
    homes = [os.path.expanduser("~")]
    with small.suppress(KeyError):
        homes.append(pwd.getpwuid(os.geteuid()).pw_dir)
    return list(dict.fromkeys(os.path.realpath(os.path.join(h, ".pyenv")) for h in homes))


def _pyenv_shim(path: str, name: str, search: str) -> str | None:
    """The interpreter the launcher's pyenv shim ``path`` runs; None when it is no shim."""
    here = os.path.realpath(os.path.dirname(path))
    root = next((r for r in pyenv_roots() if here == os.path.join(r, "shims")), None)
    if root is None:
        return None
    shims = here
    for version in _pyenv_versions(root):
        if version == "system":
            rest = os.pathsep.join(d for d in search.split(os.pathsep)
                                   if d and os.path.realpath(d) != shims)
            found = which(name, rest)
        else:
            candidate = os.path.join(root, "versions", version, "bin", name)
            found = candidate if os.path.isfile(candidate) and os.access(candidate, os.X_OK) \
                else None
        if found:
            return found
    raise UsageError(f"{path} is a pyenv shim, and none of the versions chosen here "
                     f"({', '.join(_pyenv_versions(root))}) provides {name}",
                     "corral resolves shims itself and never runs pyenv",
                     "install that version, set PYENV_VERSION, or give the interpreter's "
                     "full path")


def _pyenv_versions(root: str) -> list[str]:
    if os.environ.get("PYENV_VERSION"):
        return _names(os.environ["PYENV_VERSION"].replace(":", " "), root)
    d = os.path.realpath(os.getcwd())
    while True:
        words = _version_file(os.path.join(d, ".python-version"), root)
        if words is not None:
            return words
        if d == "/":
            break
        d = os.path.dirname(d)
    return _version_file(os.path.join(root, "version"), root) or ["system"]


def _version_file(path: str, root: str) -> list[str] | None:
    """The version names in a version file; None when there is no such (regular) file."""
    try:
        data = fsops.read_file(path, SMALL, follow=False)
    except OSError:
        return None
    if data is None:
        return None
    text = "\n".join(line.split("#")[0] for line in data.decode(errors="replace").splitlines())
    return _names(text, root) or ["system"]


def _names(text: str, root: str) -> list[str]:
    """Words that name an installed version (or ``system``); anything else is skipped:
    a path, ``..``, or a name with no installation is not a version corral will use."""
    out = []
    for word in text.split():
        if word == "system" or (pattern(VERSION_NAME).match(word) and not word.startswith(".")
                                and os.path.isdir(os.path.join(root, "versions", word))):
            out.append(word)
    return out


def prefix_of(executable: str) -> str | None:
    """The installation prefix of an interpreter: the parent of its ``bin`` directory."""
    bindir = os.path.dirname(executable)
    if os.path.basename(bindir) != "bin":
        return None
    return os.path.dirname(bindir)


def check_prefix(prefix: str, what: str, writable: Sequence[str] = (),
                 trusted: Sequence[str] = (), exe: str = "python3") -> str:
    """``prefix`` if it may be mounted for ``what``; refuses a prefix that holds a home
    directory, lies in a writable tree, or lies in a home directory without being an
    installation of ``exe`` (``trusted`` prefixes pass that last test)."""
    for home in homes():
        if prefix in ("/", "") or home == prefix or home.startswith(prefix.rstrip("/") + "/"):
            raise UsageError(
                f"{what} lives in {prefix}, which contains the home directory {home}",
                "mounting it would expose every file there to the sandbox",
                "install the interpreter in its own prefix (pyenv, nvm, /opt) or under /usr")
    if _under(prefix, writable):
        raise UsageError(f"{what} lives in {prefix}, inside a tree the sandbox can write",
                         "an interpreter there is whatever the payload made it",
                         "use an interpreter installed outside it")
    if _under(prefix, homes()) and prefix not in trusted and not installed(prefix, exe):
        raise UsageError(f"{what} lives in {prefix}, inside a home directory, which is not "
                         "an interpreter's installation", "mounting it would show the "
                         "sandbox whatever else is there", "use an interpreter from pyenv, "
                         "nvm, /opt or /usr, or name its folder with --ro")
    return prefix


def which_command(argv: Sequence[str], search: str, base_dir: str | None = None) -> str:
    """argv[0] as the sandbox will exec it: found on ``search`` like a shell would, the
    launcher's own pyenv shims resolved to the real interpreter.  A relative path with a
    slash is left relative (run mode: relative to /work) or joined to ``base_dir``.
    """
    if not argv or not argv[0]:
        raise UsageError("no command given", "corral runs the command after --",
                         "write it like: corral run -- python3 script.py")
    if any("\0" in arg for arg in argv):
        raise UsageError("an argument of the command contains a NUL byte",
                         "the kernel cannot pass NUL inside an argument", "remove it")
    name = argv[0]
    check_path(name if name.startswith("/") else "/" + name, "command")
    if "/" in name and not name.startswith("/"):
        return name if base_dir is None else os.path.join(base_dir, name)
    found = name if name.startswith("/") else which(name, search)
    if found is None or not os.path.exists(found):
        raise UsageError(f"command {name!r} was not found", "it is not on corral's PATH",
                         "give its full path, or copy it in with --input and run ./NAME")
    shim = _pyenv_shim(found, os.path.basename(found), search)
    return found if shim is None else shim


def venv(path: str, writable: Sequence[str], trusted: Sequence[str]) -> tuple[str, str | None]:
    """A virtualenv's directory and the prefix of the Python it was made from."""
    check_path(path, "virtualenv")
    real = os.path.realpath(path)
    try:
        cfg = fsops.read_file(os.path.join(real, "pyvenv.cfg"), SMALL, follow=False)
    except OSError:
        cfg = None
    if cfg is None:
        raise UsageError(f"{path} is not a virtualenv", "it has no pyvenv.cfg (a plain file)",
                         "create it with python3 -m venv, or drop --venv")
    check_prefix(real, f"the virtualenv {path}")
    exe = next((e for e in (os.path.join(real, "bin", n) for n in ("python3", "python"))
                if os.path.lexists(e)), None)
    base = os.path.realpath(exe) if exe else None
    if base is None or _under(base, [real]):  # --copies: the stdlib is where home says
        home = _cfg_home(cfg)
        base = os.path.join(os.path.realpath(home), "python") if home else None
    prefix = prefix_of(base) if base else None
    if prefix is None:
        return real, None
    if _under(prefix, homes()) and prefix not in trusted and not _under(
            prefix, [os.path.join(r, "versions") for r in pyenv_roots()]):
        raise UsageError(f"the virtualenv {path} was made from a Python in {prefix}, inside "
                         "the home directory", "a virtualenv is data the sandbox may have "
                         "written, and may not choose what of the home directory is mounted",
                         "make the virtualenv from corral's Python, a pyenv version, or a "
                         "Python outside the home directory")
    if not installed(prefix, "python3"):
        raise UsageError(f"the virtualenv {path} was made from {prefix}, which is not a Python "
                         "installation (no lib/pythonX.Y/os.py)", "a virtualenv may not "
                         "choose what gets mounted", "recreate it with python3 -m venv")
    return real, check_prefix(prefix, f"the virtualenv {path}'s Python", writable,
                              [*trusted, prefix])


def _cfg_home(cfg: bytes) -> str | None:
    for line in cfg.decode(errors="replace").splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "home":
            return value.strip()
    return None
