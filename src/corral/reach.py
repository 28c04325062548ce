"""What a user can reach on the host, so that a sandbox never reaches more.

Started by root, corral runs the payload as another user; a folder bwrap creates inside
(a parent of a mount point, an emptied tree) is root's, and its mode decides what that
user may do there.  :func:`dir_modes` gives each such folder the rights the user has on
the host's folder of the same path (read and search; never write), so that, say,
``/root`` (0700 on the host) stays closed inside.  The one deliberate exception is
search (never listing) on the way to an interpreter the launcher itself chose to run
(corral's own Python, the command it resolved from its own ``PATH``): see
docs/threat-model.md.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing costs ~3 ms at every start (corral.record says why)
if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["READ", "SEARCH", "can_reach", "dir_modes", "reach_bits"]

SEARCH, READ = 0o1, 0o4


def reach_bits(st: os.stat_result, uid: int, gid: int) -> int:
    """The read (4) and search (1) rights ``uid``/``gid`` (no other groups) have on ``st``,
    as the host's permission check grants them."""
    if uid == 0:
        return READ | SEARCH
    shift = 6 if st.st_uid == uid else 3 if st.st_gid == gid else 0
    return (st.st_mode >> shift) & (READ | SEARCH)


def can_reach(path: str, uid: int, gid: int) -> bool:
    """Whether ``uid``/``gid`` could open ``path`` on the host: search on every folder on
    the way and read on the path itself (links followed, as exec would)."""
    parts = [p for p in os.path.realpath(path).split("/") if p]
    here = "/"
    try:
        for part in parts:
            if not reach_bits(os.stat(here), uid, gid) & SEARCH:
                return False
            here = os.path.join(here, part)
        return bool(reach_bits(os.stat(here), uid, gid) & READ)
    except OSError:
        return False


def _ancestors(path: str) -> list[str]:
    out = []
    while path not in ("/", ""):
        out.append(path)
        path = os.path.dirname(path)
    return out


def dir_modes(folders: Iterable[str], uid: int, gid: int, traverse: Iterable[str] = ()
              ) -> dict[str, int]:
    """The mode inside for each of ``folders`` and every folder above them: 0700 for
    its owner inside (root, or the payload itself in a user namespace) and, for everyone
    else, what ``uid``/``gid`` may do on the host's folder there; search added on the way
    to each of ``traverse``.  A folder the host does not have is left out (bwrap's 0755)."""
    granted = {a for t in traverse for a in _ancestors(os.path.dirname(t))}
    out: dict[str, int] = {}
    for folder in folders:
        for here in _ancestors(folder):
            if here in out:
                continue
            try:
                bits = reach_bits(os.stat(here), uid, gid)
            except OSError:
                continue
            bits |= SEARCH if here in granted else 0
            out[here] = 0o700 | bits << 3 | bits
    return out
