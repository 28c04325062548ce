"""The compiled init (init.c): which init a sandbox gets, and its config encoding.

inner.py, the Python init, starts an interpreter in every sandbox: about three quarters
of a short run's cost (bench/RESULTS.md, "The launch floor").  init.c does the same job,
with the same checks, in a static binary that ``make setup`` builds with the system's C
compiler into ``init.bin`` beside this file.  Which one a run gets:

* ``CORRAL_INIT`` unset or ``auto``: the compiled init when it is built, else inner.py
  (an explicit fallback: the run record's ``init`` and ``corral doctor`` say which);
* ``CORRAL_INIT=c``: the compiled init, or the run fails closed when it is not built;
* ``CORRAL_INIT=python``: inner.py.

With egress, the compiled init serves the bridge itself (the job of
corral/egress/bridge.py, which inner.py runs).

The compiled init's config is NUL-terminated ``key=value`` records (no parser of
marshal or JSON in C).  :func:`encode` refuses a key it does not know, and the init
refuses one it does not know, so that a setting added to one init cannot be silently
dropped by the other.
"""

from __future__ import annotations

import os
import stat

from .errors import HostError, UsageError

TYPE_CHECKING = False  # typing costs ~3 ms at every start (corral.record says why)
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

__all__ = ["BINARY", "available", "choice", "describe", "encode", "join_prefix"]

BINARY = os.path.join(os.path.dirname(__file__), "init.bin")
SOURCE = os.path.join(os.path.dirname(__file__), "init.c")  # and its parts: SOURCES
SOURCES = tuple(os.path.join(os.path.dirname(__file__), name) for name in (
    "init.c", "init.h", "init_config.c", "init_bridge.c", "init_join.c"))
CHOICES = ("auto", "c", "python")
# integers, or absent as None
PLAIN = ("status_fd", "stderr_fd", "tty", "uid", "gid", "pid", "launcher_fd")


def available() -> bool:
    """Whether the compiled init is built, not older than its source, and fit to run.

    It is bound into every sandbox as it is on disk and run there as the payload's uid,
    and run on the host as the launcher: it must be executable by anyone, writable by
    nobody but its owner (root or this user), and not on a noexec file system.
    """
    try:
        st = os.stat(BINARY)
        noexec = bool(os.statvfs(BINARY).f_flag & os.ST_NOEXEC)
    except OSError:
        return False
    fit = (stat.S_ISREG(st.st_mode) and st.st_mode & 0o555 == 0o555
           and not st.st_mode & 0o022 and st.st_uid in (0, os.geteuid()) and not noexec)
    try:
        newest = max(os.stat(path).st_mtime for path in SOURCES)
    except OSError:  # an installed package without the source: the binary is what shipped
        return fit
    return fit and st.st_mtime >= newest


def choice() -> str:
    """``"c"`` or ``"python"``, from ``CORRAL_INIT`` (see the module doc)."""
    wanted = os.environ.get("CORRAL_INIT", "") or "auto"
    if wanted not in CHOICES:
        raise UsageError(f"CORRAL_INIT={wanted} is not one of {', '.join(CHOICES)}", "",
                         "unset it, or set it to auto, c or python")
    if wanted == "python":
        return "python"
    built = available()  # seven stats: once per run (resolve passes the answer down)
    if wanted == "auto" and not built:
        return "python"
    if not built:
        raise HostError("CORRAL_INIT=c, but corral's compiled init is not built (or is older "
                        f"than {SOURCE}, or not fit to run: see 'corral doctor')",
                        "building it needs a C compiler and a static libc",
                        "run 'make setup' with gcc or cc installed, or unset CORRAL_INIT to "
                        "use the Python init")
    return "c"


def describe() -> str:
    """One line for ``corral doctor``: which init runs get here, and why."""
    try:
        which = choice()
    except (HostError, UsageError) as e:
        return f"none: runs refuse to start ({e})"
    if which == "c":
        return f"compiled ({BINARY})"
    if os.environ.get("CORRAL_INIT") == "python":
        return "Python (CORRAL_INIT=python)"
    return (f"Python: the compiled init is not built, older than {SOURCE}, or not fit to run "
            "(mode a+rx, no group or other write, yours or root's, not on a noexec mount); "
            "'make setup' with a C compiler builds it")


def join_prefix(binary: str | None, files: Sequence[str], mount_args: Sequence[str],
                keep: Sequence[int] | None = None) -> list[str] | None:
    """The argv prefix that starts bwrap through the compiled init's ``--join`` mode, which
    (with ``keep``) makes / its directory and closes every descriptor above 2 but those,
    writes 0 into each cgroup file of ``files``, makes the child mounts ``mount_args``
    say (corral.mountns.ChildMounts.joiner_args), then execs the rest.  ``binary`` is the
    run's compiled init (``Sandbox.init_binary``, chosen once by :func:`choice`); None:
    the Python init, and a Python preexec_fn does the same."""
    if binary is None:
        return None
    kept = ["--keep", ",".join(str(fd) for fd in keep)] if keep else []
    return [binary, "--join", *kept, *files, *mount_args, "--"]


def encode(config: Mapping[str, Any]) -> bytes:
    """``config`` (the Python init's dict) as the compiled init's records."""
    out: list[str] = []
    for key, value in config.items():
        if value is None:
            continue
        out.extend(_records(key, value))
    for r in out:  # a NUL would end the record there and start another, of its choosing
        if "\0" in r:
            raise ValueError(f"corral's init config: a NUL byte in {r.split('=', 1)[0]}")
    return b"".join(os.fsencode(r) + b"\0" for r in out)


def _records(key: str, value: Any) -> list[str]:
    if key in PLAIN:
        return [f"{key}={int(value)}"]
    if key == "cwd":
        return [f"cwd={value}"]
    if key == "env":  # the payload's variables (corral.bwrap.init_config): the init has none
        return [f"env={name}={val}" for name, val in value]
    if key == "payload_seccomp":
        return [f"seccomp={value}"]
    if key == "rlimits":
        return [f"rlimit={name}:{int(soft)}:{int(hard)}" for name, (soft, hard) in value.items()]
    if key == "landlock":
        head = (f"landlock={int(value.get('min_abi', 1))}:{int(bool(value.get('best_effort')))}"
                f":{int(bool(value.get('scope', True)))}")
        return [head, *(f"rule={int(rights)}:{path}" for path, rights in value["rules"])]
    if key == "egress":  # the bridge: its descriptor to the proxy, then what it listens on
        listens = [(value.get("host", "127.0.0.1"), value["port"]), *value.get("relays", ())]
        return [f"bridge_fd={int(value['fd'])}", f"bridge_batch={int(value['batch'])}",
                *(f"listen={int(port)}:{host}" for host, port in listens)]
    if key == "payload_cgroups":  # moved into by the payload's process before it runs
        return [f"payload_cgroup={int(fd)}" for fd in value]
    if key == "expect_mounts":
        return [f"mount={int(action == 'hide')}:{int(dev)}:{int(ino)}:{path}"
                for path, action, dev, ino in value]
    raise ValueError(f"the compiled init has no setting {key!r}")
