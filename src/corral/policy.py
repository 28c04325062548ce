"""Policy: what a sandbox may do, as frozen data validated when built.

A :class:`Policy` says nothing about *how* bwrap is driven; that is the job
of :mod:`corral.bwrap`.  Constructors do no I/O: paths are checked for shape
here and for existence when a run is resolved.

Every weakening of the defaults is a named field of :class:`Allow`, and
nowhere else.
"""

from __future__ import annotations

from .errors import UsageError
from .record import Record, field, field_names, replace

TYPE_CHECKING = False  # typing costs ~3 ms at every start (corral.record says why)
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

__all__ = ["Allow", "Limits", "Network", "Policy", "State", "parse_duration", "parse_size"]

_DIGITS = frozenset("0123456789")
_INF = float("inf")  # (math is not imported at every start for isfinite)
_SIZE_SUFFIXES = ("", "i", "b", "ib")  # after K, M, G or T, or none: 64KiB, 1kb, 512b
_ENV_FIRST = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_")
_ENV_REST = _ENV_FIRST | frozenset("0123456789")
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "": 1.0}
MiB = 1 << 20
# Processes of corral's own in every run (bwrap, bwrap's PID 1 inside, corral's init): the
# pids limit gets them on top, and they hold open files too.
CORRAL_PIDS = 3
# The fewest open files a process of a run may have once the run's budget is shared out:
# interpreters, compilers and package managers open a few dozen.
MIN_NOFILE = 64
# At most this many pseudo-terminals per sandbox: kernel.pty.max (4096 by default, 1024 of
# them kept for the host's own /dev/pts) is shared by every sandbox and container.
MAX_PTYS = 256


def _number_and_unit(text: str) -> tuple[str, str] | None:
    """``text`` (spaces around it dropped) as a decimal number, ``12`` or ``1.5`` in ASCII
    digits, and the unit after it (spaces between dropped); None when it does not start
    with one.  By hand, not with re: every profile's limits are read at every start."""
    text = text.strip()
    end = next((i for i, c in enumerate(text) if c not in _DIGITS), len(text))
    if end == 0:
        return None
    if text[end:end + 1] == "." and text[end + 1:end + 2] in _DIGITS and text[end + 1:end + 2]:
        end = next((i for i in range(end + 1, len(text)) if text[i] not in _DIGITS), len(text))
    return text[:end], text[end:].lstrip()


def parse_size(text: str | int, what: str = "size") -> int:
    """Parse ``512M``, ``1G``, ``64KiB`` or a plain byte count (binary units)."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        found = _number_and_unit(str(text))
        unit = found[1].lower() if found is not None else ""
        scale, suffix = (unit[:1], unit[1:]) if unit[:1] in _UNITS else ("", unit)
        if found is None or suffix not in _SIZE_SUFFIXES:
            raise UsageError(
                f"{what} {text!r} is not a size",
                "sizes are a number with an optional unit K, M, G or T (powers of 1024)",
                "write it like 512M or 2G",
            )
        value = int(float(found[0]) * _UNITS[scale])
    if value <= 0:
        raise UsageError(f"{what} {text!r} must be positive", "", "give a size above zero")
    return value


def parse_duration(text: str | float, what: str = "duration") -> float:
    """Parse ``30``, ``30s``, ``500ms``, ``5m`` or ``1h`` into seconds."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        value = float(text)
    else:
        found = _number_and_unit(str(text))
        if found is None or found[1] not in _SECONDS:
            raise UsageError(
                f"{what} {text!r} is not a duration",
                "durations are a number of seconds, or a number with ms, s, m or h",
                "write it like 30, 30s or 5m",
            )
        value = float(found[0]) * _SECONDS[found[1]]
    if not 0 < value < _INF:  # NaN and infinity too
        raise UsageError(f"{what} {text!r} must be positive", "", "give a duration above zero")
    return value


def check_path(path: str, what: str) -> str:
    """Reject path strings that no honest caller writes: empty, relative, NUL or newline."""
    if not path or "\0" in path or "\n" in path or "\r" in path:
        raise UsageError(
            f"{what} {path!r} is not a usable path",
            "empty paths and paths containing NUL, CR or newline are refused",
            "rename the file or pick another path",
        )
    if not path.startswith("/"):
        raise UsageError(f"{what} {path!r} is not absolute", "policies hold absolute paths",
                         "give the full path")
    return path


def check_policy_path(path: str, what: str) -> str:
    """An absolute path, or one relative to the home directory (``~/...``)."""
    check_path(path[1:] if path.startswith("~/") else path, what)
    return path


def is_env_name(name: str) -> bool:
    """``[A-Za-z_][A-Za-z0-9_]*``: ASCII letters, digits and underscores, not a digit first."""
    return bool(name) and name[0] in _ENV_FIRST and all(c in _ENV_REST for c in name)


def check_env_name(name: str) -> str:
    if not is_env_name(name):
        raise UsageError(
            f"environment variable name {name!r} is not valid",
            "names are letters, digits and underscores, not starting with a digit",
            "fix the name",
        )
    return name


def passed(names: Sequence[str], environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """The variables of ``environ`` that ``names`` pass: exact names, or ``PREFIX_*``."""
    prefixes = tuple(n[:-1] for n in names if n.endswith("*"))
    exact = [(n, environ[n]) for n in names if not n.endswith("*") and n in environ]
    if not prefixes:  # not a walk of (and a decode of) the whole environment every run
        return exact
    return exact + [(k, v) for k, v in environ.items() if k.startswith(prefixes)]


def _positive(obj: object, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(obj, name)
        if value is not None and (isinstance(value, bool) or not value > 0):
            raise UsageError(f"limit {name} = {value!r} must be positive", "",
                             "give a value above zero, or leave it unset")


class Limits(Record, frozen=True):
    """Per-run resource limits.  ``None`` means "not requested"."""

    timeout_s: float | None = 300.0  # wall clock, from launch to kill
    cpu_s: float | None = None  # CPU time of the whole run
    memory_bytes: int | None = None  # RAM of the whole run, tmpfs pages included
    pids: int | None = None  # processes and threads of the whole run, corral's own 3 not counted
    cpus: float | None = None  # CPU bandwidth, in cores
    disk_bytes: int | None = None  # bytes the run may add to its workspace
    output_bytes: int = 8 * MiB  # captured stdout and stderr, each (--json and API capture)
    nofile: int = 1024  # open files per process (RLIMIT_NOFILE), lowered to fit ``files``
    files: int = 131072  # open files of the whole run: processes x RLIMIT_NOFILE at most
    fsize_bytes: int | None = 4096 * MiB  # largest file a process may write (RLIMIT_FSIZE)
    tmp_bytes: int = 512 * MiB  # size of the private /tmp
    shm_bytes: int = 64 * MiB  # size of the private /dev/shm
    ptys: int = 0  # pseudo-terminals the run may open (its own devpts, max=); 0: none

    def __post_init__(self) -> None:
        _positive(self, tuple(n for n in field_names(self) if n != "ptys"))
        if isinstance(self.ptys, bool) or not 0 <= self.ptys <= MAX_PTYS:
            raise UsageError(f"limit ptys = {self.ptys!r} must be between 0 and {MAX_PTYS}",
                             "every sandbox's pseudo-terminals come from one kernel-wide pool",
                             "give a small number, or 0 for none")
        if self.process_nofile < MIN_NOFILE:
            raise UsageError(
                f"{self.pids} processes leave {self.process_nofile} open files each within "
                f"the run's budget of {self.files}",
                f"every process needs at least {MIN_NOFILE}, and processes x open files per "
                "process is bounded so that one run cannot fill the kernel's file table",
                "lower --pids, or raise [limits] files in the profile")

    @property
    def process_nofile(self) -> int:
        """RLIMIT_NOFILE for each process: ``nofile``, lowered so that every process the
        pids limit allows, corral's own included, holds at most ``files`` in all.

        Without a pids limit, processes are not bounded, and neither are their files.
        """
        if self.pids is None:
            return self.nofile
        return min(self.nofile, self.files // (self.pids + CORRAL_PIDS))


class Network(Record, frozen=True):
    """Egress rules.  An empty ``allow`` means no network at all."""

    allow: tuple[str, ...] = ()  # NAME or *.NAME, optionally :PORT
    deny: tuple[str, ...] = ()  # same syntax; deny wins over allow
    resolve: tuple[tuple[str, str], ...] = ()  # NAME -> ADDRESS pins, like curl --resolve

    def __post_init__(self) -> None:
        if self.allow or self.deny or self.resolve:  # no network: nothing to parse or import
            from .egress.rules import parse_network  # pure; raises UsageError saying why

            parse_network(self)


class Allow(Record, frozen=True):
    """Named relaxations.  Each one weakens the sandbox; all default to off."""

    nested_userns: bool = False  # run where bwrap cannot --disable-userns (setuid, < 0.8)
    no_seccomp: bool = False  # run where the seccomp filter cannot be built (no libseccomp)
    no_landlock: bool = False  # run without Landlock, or with less than the policy needs
    unenforced_limits: bool = False  # run when a requested limit cannot be enforced here

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(n.replace("_", "-") for n in field_names(cls))

    def adding(self, names: Sequence[str]) -> Allow:
        """These relaxations on top of ours, by their ``--allow`` names; UsageError if unknown."""
        known = self.names()
        unknown = [n for n in names if n not in known]
        if unknown:
            raise UsageError(f"--allow {unknown[0]} is not a relaxation corral knows",
                             f"known: {', '.join(known)}", "fix the name")
        return replace(self, **{n.replace("-", "_"): True for n in names})


class State(Record, frozen=True):
    """Agent mode: the agent's state, kept in corral's private copy (see corral.agent.state).

    Paths are ``~/...`` in the agent's home.  ``dirs`` are mounted writable from corral's
    copy; the real ones never are.  ``imports`` (real path, path in the copy) are copied
    in when the copy is made or on ``--import-state``; ``credentials`` are copied in from
    the real files at every launch, and never written back.
    """

    dirs: tuple[str, ...] = ()
    imports: tuple[tuple[str, str], ...] = ()
    credentials: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for path in (*self.dirs, *(p for pair in self.imports for p in pair),
                     *self.credentials):
            if not path.startswith("~/") or ".." in path.split("/"):
                raise UsageError(f"state path {path!r} is not inside the home directory",
                                 "an agent's state paths are written ~/NAME",
                                 "write it like ~/.claude")
            check_policy_path(path, "state path")
        for path in (*(dest for _, dest in self.imports), *self.credentials):
            if not any(path.startswith(d.rstrip("/") + "/") for d in self.dirs):
                raise UsageError(f"state path {path!r} is not inside a state folder",
                                 "imports and credentials land in corral's copy of one",
                                 f"list its folder in dirs, or fix the path ({self.dirs})")


class Policy(Record, frozen=True):
    """What one sandbox may do.  Built from a profile plus flags; see :mod:`corral.profiles`."""

    name: str = "default"
    limits: Limits = field(default_factory=Limits)
    network: Network = field(default_factory=Network)
    env: tuple[tuple[str, str], ...] = ()  # variables set inside
    pass_env: tuple[str, ...] = ()  # variables copied from the launcher's environment
    read_only: tuple[str, ...] = ()  # extra host paths, visible read-only at the same path
    writable: tuple[str, ...] = ()  # agent mode: extra writable paths (the agent's state)
    hidden: tuple[str, ...] = ()  # agent mode: extra paths that appear empty
    protect: tuple[str, ...] = ()  # agent mode: extra names kept read-only in writable trees
    allow_secrets: tuple[str, ...] = ()  # agent mode: secret-looking names left visible
    state: State = field(default_factory=State)  # agent mode: the agent's private state
    home: str | None = None  # agent mode: the agent's home directory, instead of the owner's
    venv: str | None = None  # a virtualenv, read-only, first on PATH
    user: str | None = None  # started by root: who the payload runs as (NAME or UID[:GID])
    unix_sockets: bool = True  # False: the payload's socket(AF_UNIX) fails (socketpair works)
    allow: Allow = field(default_factory=Allow)

    def __post_init__(self) -> None:
        for name, value in self.env:
            check_env_name(name)
            if "\0" in value:
                raise UsageError(f"environment variable {name} contains NUL", "",
                                 "remove the NUL byte")
        for name in self.pass_env:
            check_env_name(name.removesuffix("*") if name.endswith("_*") else name)
        for group, what in ((self.read_only, "read-only path"), (self.writable, "writable path"),
                            (self.hidden, "hidden path")):
            for path in group:
                check_policy_path(path, what)
        for name in (*self.protect, *self.allow_secrets):
            if not name or "/" in name or "\0" in name or "\n" in name:
                raise UsageError(f"name pattern {name!r} is not usable",
                                 "protect and allow-secret entries are file names or globs",
                                 "write it like .envrc or *.pem")
        if self.venv is not None:
            check_path(self.venv, "virtualenv")
        if self.home is not None:
            check_path(self.home, "home directory")
