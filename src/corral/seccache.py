"""The compiled seccomp programs, cached in a file beside the code by ``make setup``.

Building the filters through libseccomp costs a CLI process ~9 ms (the rule table
~3 ms, libseccomp ~6 ms), every time: ``corral run`` is a new process each run.
``make setup`` compiles them once into ``seccomp.cache`` in the package directory,
which is as trusted as the code beside it (a payload that could write it could
write ``seccomp.py`` too); no cache is ever read from or written to a user-writable
or shared place.

The file is used only when everything the programs depend on is unchanged: its
key is a hash of the source of :mod:`corral.seccomp` and :mod:`corral.syscalls`
(the compiler and the rule tables; nothing else feeds them), the loaded
libseccomp's version and the native architecture.  It is also checked as a file
(a regular file, not a symlink, owned like ``seccomp.py`` and writable by no one
else) and by a digest of its programs.  Any mismatch and the filters are compiled
as before: the cache can make a start slower, never different.

    python -m corral.seccache --write    # what make setup runs
"""

from __future__ import annotations

import os
import stat
import sys

from . import jsonio, small

TYPE_CHECKING = False  # typing costs ~3 ms at every start (corral.record says why)
if TYPE_CHECKING:
    from hashlib import sha256

    from .seccomp import Programs
else:
    try:  # the C module behind hashlib.sha256: hashlib itself loads OpenSSL (~2.5 ms a start)
        from _sha256 import sha256
    except ImportError:  # Python 3.12 renamed it
        from hashlib import sha256

__all__ = ["CACHE_NAME", "FORMAT", "cache_path", "key", "load", "read_trusted", "sha256",
           "write", "write_json"]

CACHE_NAME = "seccomp.cache"
FORMAT = "corral-seccomp-cache 1"
SOURCES = ("seccomp.py", "syscalls.py")  # the compiler and the tables it compiles
MAX_BYTES = 1 << 20  # far above the two programs (~10 KiB): a bigger file is not ours


def _here() -> str:
    return os.path.dirname(os.path.abspath(__file__))


def cache_path() -> str:
    return os.path.join(_here(), CACHE_NAME)


def key(libseccomp: str, arch: int) -> str | None:
    """The hash of every input of the programs; None when a source cannot be read
    (a sourceless install: no cache)."""
    h = sha256(f"{FORMAT}\0{libseccomp}\0{arch:#x}\0".encode())
    for name in SOURCES:
        try:
            with open(os.path.join(_here(), name), "rb") as f:
                h.update(name.encode() + b"\0" + f.read() + b"\0")
        except OSError:
            return None
    return h.hexdigest()


def _digest(key_hex: str, programs: Programs) -> str:
    h = sha256(f"{key_hex}\0{programs.init_pid}".encode())
    for program in (programs.sandbox, programs.payload or b""):
        h.update(b"\0" + program)
    return h.hexdigest()


def _trusted(fd: int) -> bool:
    """A regular file owned like the code beside it and writable by its owner alone."""
    st = os.fstat(fd)
    try:
        code = os.stat(os.path.join(_here(), SOURCES[0]))
    except OSError:
        return False
    return (stat.S_ISREG(st.st_mode) and st.st_uid == code.st_uid
            and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and st.st_size <= MAX_BYTES)


def read_trusted(path: str) -> bytes | None:
    """A file of the package directory, if it passes :func:`_trusted` (also the built-in
    profiles' cache, corral.profcache)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, MAX_BYTES + 1) if _trusted(fd) else None
    finally:
        os.close(fd)


@small.cache
def load(key_hex: str | None, path: str | None = None) -> Programs | None:
    """The cached programs (the payload's always present) if the file matches
    ``key_hex`` in every respect, else None."""
    from .seccomp import Programs

    if key_hex is None:
        return None
    raw = read_trusted(path or cache_path())
    if raw is None:
        return None
    try:
        data = jsonio.loads(raw)
        if data["format"] != FORMAT or data["key"] != key_hex or type(data["pid"]) is not int:
            return None
        programs = Programs(bytes.fromhex(data["sandbox"]), bytes.fromhex(data["payload"]),
                            data["pid"])
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    if data.get("digest") != _digest(key_hex, programs):
        return None
    # struct sock_filter is 8 bytes: anything else was never an exported program
    if any(not p or len(p) % 8 for p in (programs.sandbox, programs.payload or b"")):
        return None
    return programs


def write(path: str | None = None) -> str:
    """Compile the programs afresh and write them, atomically; returns the path."""
    from . import seccomp

    lib = seccomp._library()
    key_hex = key(seccomp.libseccomp_version(), int(lib.seccomp_arch_native()))
    if key_hex is None:
        raise OSError("corral's seccomp sources cannot be read: nothing to key a cache on")
    programs = seccomp.compiled(unix_sockets=False)
    assert programs.payload is not None
    body = {"format": FORMAT, "key": key_hex, "digest": _digest(key_hex, programs),
            "pid": programs.init_pid, "sandbox": programs.sandbox.hex(),
            "payload": programs.payload.hex()}
    return write_json(path or cache_path(), body)


def write_json(dest: str, body: object) -> str:
    """``body`` as JSON in ``dest``, atomically (also the profiles' cache, corral.profcache)."""
    tmp = f"{dest}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(jsonio.dumps(body))
        os.replace(tmp, dest)
    except BaseException:
        os.unlink(tmp)
        raise
    return dest


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python -m corral.seccache --write")
    try:
        print(f"corral: seccomp programs cached in {write()}")
    except Exception as e:  # no libseccomp here: runs compile (or refuse) as without a cache
        print(f"corral: no seccomp cache written ({e}); runs compile the filters", file=sys.stderr)
