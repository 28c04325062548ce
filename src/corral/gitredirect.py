"""What in a git directory sends host git elsewhere: other objects, other remotes, other
commits than the ones it pushes.

Beyond its config, hooks and in-progress state (:mod:`corral.gitstate`), git 2.39 obeys
these files of a git directory, each reproduced from a ``corral agent`` run in
``tests/test_agent_gitredirect.py``:

* ``objects/info/alternates`` and ``objects/info/http-alternates``: git reads objects
  from any store they name, one the sandbox never showed (a ref the agent writes then
  names another repository's commits, which ``git push`` sends on);
* the legacy ``remotes/NAME`` and ``branches/NAME``: the URL of a remote the config does
  not name, ``origin`` included, so a plain ``git push`` sends the user's code (and the
  credential helper's answer) where the agent chose;
* ``refs/replace/*``, loose or in ``packed-refs``, and ``info/grafts``: ``git log``,
  ``git show``, ``git diff`` and even ``git checkout`` show another commit (or other
  parents) than the one ``git push`` sends, so what the user reviews is not what leaves;
* ``refs/remotes/*``, loose or packed: moved onto the agent's commits, ``git log
  origin/main..`` and ``git status`` ("up to date") show nothing to push, and the user's
  next push sends them unreviewed.  These refs are a cache of the remote, which
  ``git fetch`` restores: one made or changed during the run goes (the packed value
  from the launch, if any, is what git sees again);
* ``rr-cache/*/postimage`` (and its ``preimage``): rerere, on in any repository that has
  ``rr-cache``, answers a conflict it has seen with the recorded resolution, so the user's
  next ``git merge`` on the host writes the agent's text into the file and reports it
  "Resolved using previous resolution";
* a loose object (``objects/XX/...``) whose content does not hash to its name: git reads
  loose objects unchecked (only ``git fsck`` sees the "hash-path mismatch"), so an agent
  that rewrites the blob of a committed file with its own edit makes ``git diff`` show
  nothing, ``git show`` and ``git log -p`` show its text as the commit's, and
  ``git checkout``/``git restore`` of the file write its text back;
* a pack whose ``.idx`` lies (``objects/pack/*.idx``, any name): git looks objects up in packs
  before loose ones, through the index, unchecked, so an index that names the blob of a
  committed file for the agent's text does what a forged loose object does.  A pack or
  index made or changed during the run is indexed afresh by the host's own
  ``git index-pack`` (as the tree's owner, outside any repository, no config, with one
  thread, bounded memory and one time budget for all the audit's packs), and an
  index that does not say what that one says goes; the caches git does without and reads
  unchecked (``multi-pack-index``, ``*.bitmap``, ``*.rev``) go when made or changed;
* grafts by other names: ``shallow`` cuts the parents of the commits it lists, and
  ``objects/info/commit-graph`` (or a ``commit-graphs/`` chain), whose parents and trees
  git reads before the objects and never checks against them, says what its writer chose.

Little of it is written by an agent's ordinary work (git itself never writes the legacy
remotes, grafts or alternates but at ``git clone --shared``, replace refs only at
``git replace``, ``shallow`` only at a shallow fetch; a commit-graph is a cache that
``git gc`` writes and git does without; ``rr-cache`` is a cache of resolutions that git
records only where rerere is on; remote-tracking refs are moved by a fetch or a
push, and a later ``git fetch`` on the host brings them back), so :func:`planted` names
each such file made or changed during the run; the audit quarantines it.  A
``packed-refs`` changed during the run that holds replace or remote-tracking refs is
quarantined and put back without them, so the run's other refs stay.
Reads go through :mod:`corral.fsops`.
"""

from __future__ import annotations

import itertools
import os
import stat
import struct
import subprocess
import time
import zlib
from collections.abc import Callable, Iterator

from . import fsops, gitconfig, gitindex, host
from .fswalk import join, walk

__all__ = ["planted"]

ELSEWHERE = "git would read objects from the store it names, one the sandbox never showed"
ALTERNATES = ("objects/info/alternates", "objects/info/http-alternates")
LEGACY = ("`git push`, `git fetch` and `git pull` (for `origin` too, when the config "
          "names none) would send to the URL it holds, the agent's choice")
REPLACED = ("git log, show, diff and checkout would show another {} than the one git push "
            "sends")
GRAPH = ("a commit-graph: git reads commits' parents and trees from it, unchecked, and "
         f"{REPLACED.format('history')}; git does without it, and rebuilds it with "
         "`git commit-graph write --reachable`")
RERERE = ("a recorded conflict resolution: host git's next merge, rebase or cherry-pick that "
          "meets the same conflict writes the agent's resolution into the file and says "
          "it was resolved (rerere is on wherever rr-cache exists)")
REMOTE = ("a remote-tracking ref: moved, `git log origin/main..` and `git status` would "
          "hide commits the next `git push` sends; `git fetch` brings it back")
UNSEEN = ("the index marks files that git status and git diff would not look at "
          "(assume-unchanged, skip-worktree), so a change there goes unreviewed")
# The host's git index-pack re-indexes each pack made or changed during the run, outside
# the sandbox, so what the agent's pack data costs it is bounded: a 16 KiB pack of deltas
# each copying a 16 MiB base 64 times has index-pack hold 1 GiB per object and hash it
# (reproduced).  A loose object costs the audit's own hashing as much: 2 MiB of zeros
# deflated is 2 GiB to inflate and hash, 9 s here (reproduced).  All the loose objects
# and packs one audit checks share CHECK_S of wall time (those left when it is spent go
# unchecked, so they go); each index-pack runs with one thread, INDEX_PACK_BYTES of
# address space and no more CPU seconds than are left.
CHECK_S = 600
INDEX_PACK_BYTES = 2 << 30
FORGED = ("a loose object whose content is not what its name says (git fsck: hash-path "
          "mismatch; or one corral could not finish hashing within the "
          f"{CHECK_S} s it gives all of a run's objects): git reads it unchecked, so git "
          "diff, show and checkout would give its text for what the commit holds")
LYING = ("a pack index that does not say what git index-pack finds in its pack (or a "
         "pack it cannot index within corral's bounds: one thread, "
         f"{INDEX_PACK_BYTES >> 30} GiB, {CHECK_S} s for all of a run's objects): git "
         "reads objects through it unchecked, so git diff, show and checkout would give "
         "other content than the commit holds")
PACK_CACHE = ("an index of packs that git reads unchecked and does without (`git repack "
              "-d` or `git multi-pack-index write` rebuilds it)")
INDEX_CAP = 1 << 30  # bytes of a pack index read to compare (28 bytes an object)
HEX = frozenset("0123456789abcdef")
HASHES = {38: "sha1", 62: "sha256"}  # a loose object's name after its folder's two digits
READ_CHUNK = 1 << 14  # inflated, at most ~16 MiB a part
TRUE = ("true", "yes", "on", "1", "")
CONFIG_CAP = 1 << 20
REPLACE = "refs/replace"
DROPPED = {b"refs/replace/": f"replace refs: {REPLACED.format('commit')}",
           b"refs/remotes/": REMOTE}  # the refs a changed packed-refs loses, and why
PACKED_CAP = 64 << 20  # bytes of a packed-refs read; a larger changed one is taken whole
WALK_CAP = 100_000  # entries of refs/replace, remotes/ or branches/ walked

Changed = Callable[[os.stat_result | None], bool]


class Budget:
    """The seconds left to check one audit's loose objects and packs (hashing them, and
    the host's git index-pack)."""

    def __init__(self, seconds: float = CHECK_S) -> None:
        self.left = float(seconds)


def planted(tree: fsops.Tree, gitdir: str, changed: Changed, budget: Budget | None = None
            ) -> Iterator[tuple[str, str, bytes | None]]:
    """(path relative to ``tree``, why, what to put back or None) for each file of
    ``gitdir`` that redirects host git and was made or changed during the run.  ``budget``
    is shared by every git directory of one audit (a fresh one per call without it)."""
    for name, why in ((ALTERNATES[0], ELSEWHERE), (ALTERNATES[1], ELSEWHERE),
                      ("info/grafts", f"grafts: {REPLACED.format('history')}"),
                      ("shallow", f"shallow (grafts without parents): "
                                  f"{REPLACED.format('history')}"),
                      ("objects/info/commit-graph", GRAPH)):
        st, link = _reach(tree, gitdir, name, changed)
        if link or changed(st):
            yield link or f"{gitdir}/{name}", why, None
    for folder, why in (("remotes", f"a legacy remote: {LEGACY}"),
                        ("branches", f"a legacy remote: {LEGACY}"),
                        (REPLACE, f"a replace ref: {REPLACED.format('commit')}"),
                        ("objects/info/commit-graphs", GRAPH),
                        ("refs/remotes", REMOTE),
                        ("rr-cache", RERERE)):
        yield from ((rel, why, None) for rel in _files(tree, gitdir, folder, changed))
    yield from _index(tree, gitdir, changed)
    budget = budget or Budget()
    yield from ((rel, FORGED, None) for rel in _loose(tree, gitdir, changed, budget))
    yield from ((rel, why, None) for rel, why in _packs(tree, gitdir, changed, budget))
    packed = f"{gitdir}/packed-refs"
    verdict = _packed(tree, packed, changed)
    if verdict is not None:
        kept, kinds = verdict
        yield packed, "it holds " + "; and ".join(DROPPED[k] for k in kinds), kept or None


def _reach(tree: fsops.Tree, gitdir: str, name: str, changed: Changed
           ) -> tuple[os.stat_result | None, str | None]:
    """(``name`` itself or None, a link made during the run on the way to it): git
    follows links (``objects`` or ``objects/info`` made one), corral's walk does not.
    A link the launch held is the user's own, and what lies beyond it is left alone."""
    parts = name.split("/")
    for i in range(1, len(parts) + 1):
        rel = "/".join([gitdir, *parts[:i]])
        try:
            st = tree.lstat(rel)
        except OSError:
            return None, None  # only a link before it does that: already returned
        if st is None:
            return None, None
        if stat.S_ISLNK(st.st_mode) and i < len(parts):
            return None, rel if changed(st) else None
    return st, None


def _files(tree: fsops.Tree, gitdir: str, folder: str, changed: Changed) -> Iterator[str]:
    """What git reads under ``folder`` that changed: a link or file in its place (git
    follows links there) is taken whole; a folder is walked, every entry but folders."""
    st, link = _reach(tree, gitdir, folder, changed)
    top = link or f"{gitdir}/{folder}"
    if link or st is None or not stat.S_ISDIR(st.st_mode):
        if link or changed(st):
            yield top
        return
    try:
        for here, entries in walk(tree, top, limit=WALK_CAP, stats=True):
            yield from (join(here, e.name) for e in entries
                        if e.kind != "dir" and changed(e.st))
    except OSError:
        yield top  # a folder corral cannot walk as git would: all of it goes


def _index(tree: fsops.Tree, gitdir: str, changed: Changed
           ) -> Iterator[tuple[str, str, bytes | None]]:
    """A changed ``index`` with entries git status would skip: put back without their
    marks (taken whole when corral cannot read it as git would).  A sparse checkout's
    skip-worktree marks are its own: only assume-unchanged is cleared there."""
    rel = f"{gitdir}/index"
    try:
        if not changed(tree.lstat(rel)):
            return
        data = tree.read(rel, PACKED_CAP)
    except OSError:
        data = None
    if data is None:
        yield rel, f"{UNSEEN} (corral could not read it; `git reset` rebuilds it)", None
        return
    found = gitindex.unhide(data, skip_worktree=not _sparse(tree, gitdir))
    if found is not None:
        names = ", ".join(p.decode(errors="replace") for p in found[1][:5])
        more = f" and {len(found[1]) - 5} more" if len(found[1]) > 5 else ""
        yield rel, f"{UNSEEN}: {names}{more}", found[0]


def _loose(tree: fsops.Tree, gitdir: str, changed: Changed, budget: Budget
           ) -> Iterator[str]:
    """Loose objects made or changed during the run that are not what their names say:
    anything but a regular file (git follows a link there; corral does not), or one whose
    inflated bytes do not hash to its name.  A folder made a link is taken whole."""
    top = f"{gitdir}/objects"
    st, link = _reach(tree, gitdir, "objects", changed)
    if link or st is None or not stat.S_ISDIR(st.st_mode):
        if link or changed(st):  # a link the launch held is the user's own: left alone
            yield link or top
        return
    for folder in tree.scandir(top, stats=True):
        if len(folder.name) != 2 or not set(folder.name) <= HEX:
            continue
        rel = f"{top}/{folder.name}"
        try:
            entries = tree.scandir(rel, stats=True) if folder.kind == "dir" else None
        except OSError:  # locked during the run: corral cannot check it, all of it goes
            entries = None
        if entries is None:
            if changed(folder.st):
                yield rel
            continue
        for e in entries:
            algorithm = HASHES.get(len(e.name))
            if algorithm is None or not set(e.name) <= HEX or not changed(e.st):
                continue  # git's own temporary files (tmp_obj_*) are never read as objects
            if e.kind != "file" or not _hashes_to(tree, f"{rel}/{e.name}", algorithm,
                                                  folder.name + e.name, budget):
                yield f"{rel}/{e.name}"


def _hashes_to(tree: fsops.Tree, rel: str, algorithm: str, name: str, budget: Budget
               ) -> bool:
    """Whether the loose object ``rel`` inflates, whole, to bytes whose hash is ``name``
    (read and hashed a part at a time: a large blob costs no memory), found within what
    is left of ``budget`` (no: not vouched for)."""
    if budget.left <= 0:
        return False
    fd = tree.open_regular(rel)
    if fd is None:
        return False
    import hashlib  # here: hashlib (OpenSSL) stays off the run path (tests/test_startup.py)

    digest, inflate = hashlib.new(algorithm), zlib.decompressobj()
    began = time.monotonic()
    deadline = began + budget.left
    try:
        while chunk := os.read(fd, READ_CHUNK):
            digest.update(inflate.decompress(chunk))
            if inflate.eof:
                break
            if time.monotonic() > deadline:
                return False
        digest.update(inflate.flush())
        ok = inflate.eof and not inflate.unused_data and not os.read(fd, 1)
    except (OSError, zlib.error):
        return False
    finally:
        os.close(fd)
        budget.left -= time.monotonic() - began
    return ok and digest.hexdigest() == name


def _packs(tree: fsops.Tree, gitdir: str, changed: Changed, budget: Budget
           ) -> Iterator[tuple[str, str]]:
    """``objects/pack`` entries made or changed during the run that git would read and
    corral cannot vouch for: a lying pack index (see :func:`_index_says_what_git_finds`),
    and the unchecked caches beside them."""
    top = f"{gitdir}/objects/pack"
    st, link = _reach(tree, gitdir, "objects/pack", changed)
    if link or st is None or not stat.S_ISDIR(st.st_mode):
        if link or changed(st):
            yield link or top, LYING
        return
    entries = {e.name: e for e in tree.scandir(top, stats=True)}
    for name, e in sorted(entries.items()):
        rel = f"{top}/{name}"
        if name == "multi-pack-index" or name.endswith((".bitmap", ".rev")):
            if changed(e.st):
                yield rel, PACK_CACHE
        elif name.endswith(".idx"):  # git reads any NAME.idx beside NAME.pack, not
            # only pack-HASH.idx (tried: a pack renamed evil.idx/evil.pack is read)
            pack = entries.get(name[:-4] + ".pack")
            if pack is None or not (changed(e.st) or changed(pack.st)):
                continue  # git reads no index without its pack
            if e.kind != "file" or pack.kind != "file" or not _index_says_what_git_finds(
                    tree, rel, f"{top}/{pack.name}", budget):
                yield rel, LYING


def _index_says_what_git_finds(tree: fsops.Tree, idx: str, pack: str, budget: Budget
                               ) -> bool:
    """Whether the pack index ``idx`` maps each object name to the offset that the host's
    ``git index-pack`` finds it at in ``pack`` (it inflates and hashes every object), found
    within what is left of ``budget`` and the bounds of :data:`INDEX_PACK_BYTES`."""
    if budget.left < 1:
        return False
    import tempfile  # here: tempfile loads random, off the run path (tests/test_startup.py)

    # The system's git only: one found in a folder the sandbox could write (a project's
    # bin on PATH) would be the agent's program, run here on the host (found by review).
    git = host.system_program("git")
    try:
        said = _pack_index(tree.read(idx, INDEX_CAP) or b"")
    except OSError:
        return False
    fd = tree.open_regular(pack)
    if git is None or said is None or fd is None:
        if fd is not None:
            os.close(fd)
        return False
    fmt = "sha256" if any(len(name) == 32 for name in said) else "sha1"
    uid, gid = tree.owner or (os.getuid(), os.getgid())
    scratch = tempfile.mkdtemp(prefix="corral-index-pack-")
    try:
        if os.getuid() != uid:
            os.chown(scratch, uid, gid)
        out = os.path.join(scratch, "fresh.idx")
        env = {"PATH": os.defpath, "HOME": scratch, "GIT_CONFIG_NOSYSTEM": "1",
               "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CEILING_DIRECTORIES": "/",
               "LC_ALL": "C"}
        as_owner: dict[str, object] = (
            {"user": uid, "group": gid, "extra_groups": []} if os.getuid() != uid else {})
        seconds = budget.left
        began = time.monotonic()
        try:
            done = subprocess.run(
                [git, "index-pack", "--threads=1", f"--object-format={fmt}", "-o", out,
                 f"/proc/self/fd/{fd}"],
                cwd=scratch, env=env, preexec_fn=_bounded(seconds),
                pass_fds=(fd,), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, timeout=seconds, check=False,
                **as_owner)  # type: ignore[call-overload]
        finally:
            budget.left -= time.monotonic() - began
        if done.returncode != 0:
            return False
        with open(out, "rb") as f:
            found = _pack_index(f.read(INDEX_CAP + 1))
        return found is not None and found == said
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        os.close(fd)
        import shutil  # with bz2 and lzma ~2.5 ms: only where index-pack ran

        shutil.rmtree(scratch, ignore_errors=True)


def _bounded(seconds: float) -> Callable[[], None]:
    """index-pack's limits, set in its process before git runs (nothing but setrlimit:
    safe after a fork)."""
    import resource  # here, with index-pack: off the run path

    cpu = int(seconds) + 1
    setrlimit, limits = resource.setrlimit, ((resource.RLIMIT_AS, INDEX_PACK_BYTES),
                                             (resource.RLIMIT_CPU, cpu))

    def bound() -> None:
        for which, value in limits:
            setrlimit(which, (value, value))
    return bound


def _pack_index(data: bytes) -> dict[bytes, int] | None:
    """A pack index's object names and offsets (version 1 or 2, SHA-1 or SHA-256: the
    hash size is what makes the file's length add up); None for anything else."""
    if len(data) > INDEX_CAP:
        return None
    if data[:4] != b"\377tOc":  # version 1: a fan-out, then (offset, name) pairs
        if len(data) < 1024:
            return None
        count = struct.unpack_from(">I", data, 1020)[0]
        for size in (20, 32):
            if len(data) == 1024 + count * (4 + size) + 2 * size:
                pairs = [(data[at + 4:at + 4 + size], struct.unpack_from(">I", data, at)[0])
                         for at in range(1024, 1024 + count * (4 + size), 4 + size)]
                return _sorted_once(pairs)
        return None
    if len(data) < 1032 or struct.unpack_from(">I", data, 4)[0] != 2:
        return None
    count = struct.unpack_from(">I", data, 1028)[0]
    for size in (20, 32):
        names_at = 1032
        offsets_at = names_at + count * size + count * 4
        large_at = offsets_at + count * 4
        if large_at + 2 * size > len(data):
            continue
        small = struct.unpack_from(f">{count}I", data, offsets_at)
        large = sum(1 for o in small if o & 0x80000000)
        if large_at + 8 * large + 2 * size != len(data):
            continue
        pairs = []
        for i, o in enumerate(small):
            if o & 0x80000000:
                at = large_at + 8 * (o & 0x7FFFFFFF)
                if at + 8 > large_at + 8 * large:
                    return None
                o = struct.unpack_from(">Q", data, at)[0]
            pairs.append((data[names_at + i * size:names_at + (i + 1) * size], o))
        return _sorted_once(pairs)
    return None


def _sorted_once(pairs: list[tuple[bytes, int]]) -> dict[bytes, int] | None:
    """The pairs as a map, if their names are strictly ascending (as git writes them and
    its binary search needs: a name listed twice could be found at either offset)."""
    if any(a[0] >= b[0] for a, b in itertools.pairwise(pairs)):
        return None
    return dict(pairs)


def _sparse(tree: fsops.Tree, gitdir: str) -> bool:
    """Whether ``gitdir`` is a sparse checkout (its config, or its sparse-checkout file)."""
    if tree.lstat(f"{gitdir}/info/sparse-checkout") is not None:
        return True
    for name in ("config", "config.worktree"):
        try:
            entries = gitconfig.parse(tree.read(f"{gitdir}/{name}", CONFIG_CAP) or b"")
        except (OSError, gitconfig.ConfigError):
            return True  # unreadable: leave skip-worktree marks, as a sparse checkout's
        if any(k == "core.sparsecheckout" and (v is None or v.lower() in TRUE)
               for k, v in entries):
            return True
    return False


def _packed(tree: fsops.Tree, rel: str, changed: Changed
            ) -> tuple[bytes, list[bytes]] | None:
    """None: leave ``packed-refs`` (unchanged, or none of :data:`DROPPED` in it); b"":
    take it whole (git follows a link there, and corral cannot read a FIFO or a huge one
    as git would); else its bytes without those refs and their peeled lines, and which
    kinds went."""
    try:
        if not changed(tree.lstat(rel)):
            return None
        data = tree.read(rel, PACKED_CAP)
    except OSError:
        data = None
    if data is None:
        return b"", list(DROPPED)
    keep, kinds, dropping = [], [], False
    for line in data.splitlines(keepends=True):
        if line.startswith(b"^"):  # the peeled value of the ref just before
            keep += [] if dropping else [line]
            continue
        name = line.split(b" ", 1)[-1]
        kind = next((k for k in DROPPED if name.startswith(k)), None)
        dropping = kind is not None
        kinds += [kind] if kind is not None and kind not in kinds else []
        keep += [] if dropping else [line]
    return None if not kinds else (b"".join(keep), kinds)
