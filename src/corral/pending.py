"""Audits owed by agent runs whose launcher never unwound (SIGKILL, a power cut).

The audit (:mod:`corral.audit`) needs corral to unwind; SIGKILL skips it, and the init,
which watches the launcher's process, ends the sandbox but leaves what it planted.  So
before an agent run starts, its census is written to ``RUNS/.pending/<run-id>.json`` (private to the
launcher), and removed once its audit is done.  The next ``corral agent`` or ``corral
shell`` with the same runs directory finds the census of every run whose launcher is
gone (its pid and start time no longer match a live process) and audits it first, into
``RUNS/<run-id>/quarantine-after-kill``, before its own scan (which would otherwise
refuse a planted ``commondir``, and take the plants for the user's own files).

What this does not do: audit before the user's own next ``git`` on the host; only
corral's next launch.  A pending file is trusted as corral's own only when it is a
regular file of the launcher's uid in a runs directory no sandbox of the launch can
write, carries an HMAC made with the launcher's own key (:func:`_key`: in corral's
state folder, which no sandbox sees), and every tree it names still passes
:func:`guard.check_writable_root`; a runs directory inside a writable tree gets no
pending file at all (the agent could write one).  Review 4 forged a census in a runs
directory that a profile's ``~/`` path made writable, naming ``~/.ssh``: the recovery
moved the key where the next sandbox read it.
"""

from __future__ import annotations

import itertools
import os
import stat

from . import guard, jsonio, small
from .audit import Action, Auditor, Census
from .errors import UsageError
from .workspace import is_run_id

TYPE_CHECKING = False  # typing costs ~3 ms at every start (corral.record says why)
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

__all__ = ["owe", "recover", "settle"]

PENDING = ".pending"
CAP = 8 << 20  # bytes of one pending census (mount bounds keep real ones far smaller)


KEY_BYTES = 32


def _key_path() -> str:
    """The launcher's key: root's in /var/lib/corral, a user's in their XDG state folder
    (whatever runs directory is chosen: a census anywhere is checked with it)."""
    if os.geteuid() == 0:
        return "/var/lib/corral/pending.key"
    state = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return os.path.join(state, "corral", "pending.key")


def _key(create: bool) -> bytes | None:
    """The key (made once, mode 0600, the launcher's own), or None when there is none fit
    to trust (then no census is written or believed)."""
    path = _key_path()
    for _ in range(2):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            if not create:
                return None
            with small.suppress(OSError):
                os.makedirs(os.path.dirname(path), 0o700, exist_ok=True)
                new = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                              | os.O_CLOEXEC, 0o600)
                with os.fdopen(new, "wb") as f:
                    f.write(os.urandom(KEY_BYTES))
            continue
        except OSError:
            return None
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            key = f.read(KEY_BYTES + 1)
        if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and \
                not st.st_mode & 0o077 and len(key) == KEY_BYTES:
            return key
        return None
    return None


def _mac(key: bytes, data: bytes) -> str:
    """HMAC-SHA256 (RFC 2104), with the C sha256 that needs no OpenSSL (hashlib costs
    ~3 ms of every agent launch)."""
    try:
        from _sha256 import sha256  # type: ignore[import-not-found]  # Python 3.11
    except ImportError:
        try:
            from _sha2 import sha256  # type: ignore[import-not-found]  # 3.12 and later
        except ImportError:
            from hashlib import sha256
    padded = key.ljust(64, b"\0")
    inner = sha256(bytes(b ^ 0x36 for b in padded) + data).digest()
    return str(sha256(bytes(b ^ 0x5C for b in padded) + inner).hexdigest())


def _started(pid: int) -> str | None:
    """The start time of process ``pid`` (``/proc/PID/stat`` field 22), None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return None


def _to_json(census: Census) -> dict[str, Any]:
    return {"trees": [[t, list(o) if o else None] for t, o in census.trees],
            "names": sorted(census.names), "gitdirs": sorted(census.gitdirs),
            "linked": sorted(census.linked), "protected": sorted(census.protected),
            "placeholders": [list(p) for p in census.placeholders],
            "hook_folders": list(census.hook_folders), "started_ns": census.started_ns,
            "commands": {k: sorted(v) for k, v in census.commands.items()},
            "folders": {k: list(v) for k, v in census.folders.items()},
            "whole": census.whole, "blind": list(census.blind),
            "named": sorted(census.named)}


def _from_json(data: dict[str, Any]) -> Census:
    trees = tuple((str(t), (int(o[0]), int(o[1])) if o else None) for t, o in data["trees"])
    return Census(trees, frozenset(map(str, data["names"])),
                  gitdirs=frozenset(map(str, data["gitdirs"])),
                  linked=frozenset(map(str, data["linked"])),
                  protected=frozenset(map(str, data["protected"])),
                  placeholders=tuple((str(p), int(d), int(i))
                                     for p, d, i in data["placeholders"]),
                  hook_folders=tuple(map(str, data.get("hook_folders", ()))),
                  started_ns=int(data["started_ns"]),
                  commands={str(k): frozenset(map(str, v))
                            for k, v in data.get("commands", {}).items()},
                  folders={str(k): (int(v[0]), int(v[1]))
                           for k, v in data.get("folders", {}).items()},
                  whole=bool(data.get("whole", False)),
                  blind=tuple(map(str, data.get("blind", ()))),
                  named=frozenset(map(str, data.get("named", ()))))


def _inside(runs: str, writable: Sequence[str]) -> bool:
    """Whether the runs directory is in a tree the sandbox can write: then a census there
    could be the payload's, and none is written or read."""
    return any(runs == w or runs.startswith(w.rstrip("/") + "/") for w in writable)


def owe(runs_dir: str, run_id: str, census: Census, root: str | None,
        writable: Sequence[str]) -> str | None:
    """Write the census of the run about to start; its path, to :func:`settle` once
    audited (None: none written, as for a runs directory inside a writable tree)."""
    runs = os.path.realpath(runs_dir)
    if _inside(runs, writable):
        return None
    folder = os.path.join(runs, PENDING)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    path = os.path.join(folder, f"{run_id}.json")
    key = _key(create=True)
    if key is None:
        return None
    entry = {"pid": os.getpid(), "started": _started(os.getpid()), "root": root,
             "census": _to_json(census)}
    data = jsonio.dumps(entry).encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(_mac(key, data).encode() + b"\n" + data)  # the MAC's line, then the census
    return path


def settle(path: str | None) -> None:
    """The run was audited: it owes nothing any more."""
    if path is not None:
        with small.suppress(FileNotFoundError):
            os.unlink(path)


def recover(runs_dir: str, writable: Sequence[str]) -> list[Action]:
    """Audit every run of ``runs_dir`` whose launcher died before auditing it, or whose
    audit failed to do all it had to; what still cannot be done stays owed.  Nothing is
    read from a runs directory inside ``writable`` (the trees the coming sandbox can write,
    where :func:`owe` writes nothing): a payload could have put a census there naming
    another repository, or a live run's id (found by review)."""
    runs = os.path.realpath(runs_dir)
    if _inside(runs, [os.path.realpath(w) for w in writable]):
        return []
    from . import workspace

    # What is read and written here by path is where no live sandbox writes (review 8: a
    # runs directory inside another live run's tree got root's reads and moves before
    # the launch's own hold refused it).
    try:
        with workspace.held([], [runs]):
            return _recover(runs)
    except UsageError:
        return []  # the launch's own hold of the runs directory refuses it, in its words


def _recover(runs: str) -> list[Action]:
    folder = os.path.join(runs, PENDING)
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(".json")
                       and is_run_id(n[:-len(".json")]))
    except OSError:
        return []
    actions: list[Action] = []
    for name in names:
        path = os.path.join(folder, name)
        entry = _load(path)
        if entry is None:
            continue
        if entry.get("started") is not None and \
                _started(int(entry.get("pid", 0))) == entry["started"]:
            continue  # its launcher still runs: its own audit is to come
        census, why = _trusted(entry)
        if census is None:
            if why is None:  # not a census at all: nothing can ever be audited from it
                settle(path)
            else:  # owed still, and said at every launch until it can be done
                actions.append(Action(path, "failed", "the audit of an earlier run is still "
                                      f"owed, and cannot be done yet: {why}; once you have "
                                      "looked at that tree yourself, delete this file"))
            continue
        root = os.path.join(runs, name[:-len(".json")])  # the run's own, never the file's say
        # Whatever of the run still lives (a sandbox its init could not end) ends first:
        # nothing of it may plant anything after its audit.
        from . import cgroups, host, workspace

        try:
            # No other run's sandbox may write these trees while they are audited.
            with workspace.held([t for t, _ in census.trees]):
                cgroups.end_leftover(host.detect(), name[:-len(".json")])
                done = Auditor(census, _maker(str(root))).run()
        except UsageError as e:
            actions.append(Action(path, "failed", "the audit of an earlier run is still "
                                  f"owed, and cannot be done yet: {e}"))
            continue
        actions += [Action(a.path, a.did, f"{a.why} (left by an earlier run whose audit was "
                                          "not done: its corral was killed, or the audit did "
                                          "not finish)", a.to) for a in done]
        if not any(a.did == "failed" for a in done):  # else the next launch tries again
            settle(path)
        else:
            actions.append(Action(path, "failed", "this audit is still owed: the next launch "
                                  "tries again; once you have looked at what failed above, "
                                  "delete this file to stop it"))
    return actions


def _load(path: str) -> dict[str, Any] | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_size > CAP:
            return None
        mac, _, raw = f.read(CAP).partition(b"\n")
    key = _key(create=False)
    if key is None or not _same(mac, _mac(key, raw).encode()):
        return None  # not corral's own (or its key is gone): nothing in it is believed
    try:
        data = jsonio.loads(raw)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _same(a: bytes, b: bytes) -> bool:
    """Equal, in time that does not depend on where they differ."""
    return len(a) == len(b) and not sum(x ^ y for x, y in zip(a, b, strict=True))


def _trusted(entry: dict[str, Any]) -> tuple[Census | None, str | None]:
    """The census, if every tree it names could still be a project (never a home, a
    system folder or one holding credentials); else None, and why it cannot be audited
    now (None: it is no census)."""
    try:
        census = _from_json(entry["census"])
    except (KeyError, TypeError, ValueError):
        return None, None
    for top, _ in census.trees:
        try:
            if guard.check_writable_root(top, "audited tree") != top:
                return None, f"{top} is no longer the folder it was"
        except UsageError as e:
            return None, str(e)
    return census, None


def _maker(root: str) -> Any:
    made: list[str] = []

    def make() -> str:
        if not made:  # a fresh folder for each try: an earlier one may hold its moves
            os.makedirs(root, mode=0o700, exist_ok=True)
            for n in itertools.count(1):
                path = os.path.join(root, "quarantine-after-kill" + (f"-{n}" if n > 1 else ""))
                try:
                    os.mkdir(path, 0o700)
                    break
                except FileExistsError:
                    continue
            made.append(path)
        return made[0]
    return make
