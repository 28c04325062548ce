"""Entries of a git index that host git would not look at in the work tree.

An index entry flagged *assume-unchanged* (``CE_VALID``) or *skip-worktree* makes
``git status`` and ``git diff`` skip its file: an agent that edits a tracked file and
then runs ``git update-index --skip-worktree FILE`` leaves a change the user's review
never shows (``tests/test_agent_gitredirect.py``).  :func:`unhide` finds such entries
and clears their flags, in place, with the index's checksum made again; git 2.39's
formats 2, 3 and 4, SHA-1 or SHA-256.  Pure: bytes in, bytes out.
"""

from __future__ import annotations

__all__ = ["unhide"]

CE_VALID = 0x8000  # assume-unchanged, in the entry's flags
CE_EXTENDED = 0x4000  # two more bytes of flags follow (version 3 and up)
SKIP_WORKTREE = 0x4000  # in those extended flags
FIXED = 40  # ctime, mtime, dev, ino, mode, uid, gid, size: 10 x 4 bytes


def unhide(data: bytes, skip_worktree: bool = True) -> tuple[bytes, list[bytes]] | None:
    """(the index without those flags, the paths that had them), or None when no entry
    has one (or ``data`` is no index git 2.39 reads: git ignores nothing there then).
    ``skip_worktree=False`` leaves that flag (a sparse checkout sets it for every file it
    does not check out)."""
    if len(data) < 12 or data[:4] != b"DIRC":
        return None
    version, count = int.from_bytes(data[4:8], "big"), int.from_bytes(data[8:12], "big")
    if version not in (2, 3, 4):
        return None
    import hashlib  # OpenSSL's ~2.5 ms: only for a repository's index, never corral run's

    for size in (20, 32):  # the hash of the trailer tells SHA-1 from SHA-256
        digest = hashlib.sha1 if size == 20 else hashlib.sha256
        if len(data) > 12 + size and digest(data[:-size]).digest() == data[-size:]:
            break
    else:
        return None
    out, paths = bytearray(data), []
    at, previous = 12, b""
    for _ in range(count):
        flags_at = at + FIXED + size
        if flags_at + 2 > len(data) - size:
            return None
        flags = int.from_bytes(data[flags_at:flags_at + 2], "big")
        path_at = flags_at + 2 + (2 if flags & CE_EXTENDED and version >= 3 else 0)
        ext = int.from_bytes(data[flags_at + 2:path_at], "big") if path_at > flags_at + 2 \
            else 0
        path, at = _path(data, path_at, at, version, previous)
        if at < 0:
            return None
        previous = path
        hidden = flags & CE_VALID or (skip_worktree and ext & SKIP_WORKTREE)
        if hidden:
            paths.append(path)
            out[flags_at] &= ~(CE_VALID >> 8) & 0xFF
            if skip_worktree and ext & SKIP_WORKTREE:
                out[flags_at + 2] &= ~(SKIP_WORKTREE >> 8) & 0xFF
    if not paths:
        return None
    out[-size:] = digest(bytes(out[:-size])).digest()
    return bytes(out), paths


def _path(data: bytes, path_at: int, start: int, version: int, previous: bytes
          ) -> tuple[bytes, int]:
    """(the entry's path, where the next entry starts; -1 when the index is cut short)."""
    if version == 4:  # a varint of bytes to strip from the previous path, then the rest
        strip, shift, i = 0, 0, path_at
        while i < len(data):
            byte = data[i]
            i += 1
            strip = (strip << 7) | (byte & 0x7F) if shift else byte & 0x7F
            if not byte & 0x80:
                break
            strip += 1  # git's offset varint: each continuation adds one
            shift = 1
        end = data.find(b"\0", i)
        if end < 0 or strip > len(previous):
            return b"", -1
        return previous[:len(previous) - strip] + data[i:end], end + 1
    end = data.find(b"\0", path_at)
    if end < 0:
        return b"", -1
    return data[path_at:end], start + ((end - start + 8) & ~7)
