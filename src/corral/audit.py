"""The audit: what a run planted where the host will trust it, found and undone on every
exit path; and, while the run lives, a watch on git directories (:mod:`corral.livewatch`).

At launch, a :class:`Census` records the writable trees: their git directories, the paths
with protected names, corral's placeholders, and (where nothing inside is mounted
read-only: a reused ``corral run`` workspace) a copy of each git control file and
protected file up to a size.  After the run, however it ended (a normal exit, Ctrl-C,
SIGTERM or SIGHUP, which the CLI turns into an orderly unwinding, a crashed payload, an
exception in corral's own supervision), :func:`audit` walks the trees again:

* a git directory that appeared during the run (``git init``, a bare ``x.git``, a clone)
  loses to the quarantine its ``config`` unless every key in it is one git never runs
  anything for (:data:`INERT`), every hook that is not a ``.sample``, its ``commondir``
  and its ``config.worktree``;
* a git directory that existed loses a ``commondir`` (main git directories) or
  ``config.worktree`` that appeared, and any control file changed during the run, whose
  copy from launch is put back;
* a path with a protected name (``.envrc``, ``.vscode``, ``.husky``...) created or changed
  during the run goes to the quarantine (the copy from launch put back);
* git's in-progress state (``rebase-merge``, ``rebase-apply``, ``sequencer``) that holds
  a command the launch did not (:mod:`corral.gitstate`) goes to the quarantine whole;
* alternates, legacy remotes, replace refs and grafts made or changed during the run
  (:mod:`corral.gitredirect`) go to the quarantine (a packed-refs keeps its other refs);
* a set-user-ID or set-group-ID bit set during the run is cleared;
* a ``.git`` that is neither a plain folder nor a plain file goes to the quarantine;
* the placeholders corral made are removed (first: a placeholder ``commondir``, naming its
  own git directory, is not a plant).

"During the run" is the inode's change time, which only the kernel sets: a payload cannot
make what it changed look older.  The quarantine is ``RUNS/<run-id>/quarantine``.
Everything done is an :class:`Action`, for stderr, ``--json`` and the run record.  All of
it goes through :mod:`corral.fsops`; nothing found is run.
"""

from __future__ import annotations

import errno
import os
import pwd
import stat
import time
from types import ModuleType

from . import fsops, small
from . import sig as signal
from .errors import STOPPING
from .fswalk import join, move, walk
from .guard import PROTECTED_NAMES, SELF_COMMONDIR, Finding, vcs_control
from .record import NamedTuple, Record, field

TYPE_CHECKING = False  # typing costs ~3 ms at every start (corral.record says why)
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    from .gitredirect import Budget
    from .livewatch import LiveWatch

__all__ = ["INERT", "Action", "Auditor", "Census", "census_of_findings", "census_of_tree"]

# Keys of a config git never runs a program for: a new repository's config holding only
# these is left in place (a clone's remote and branches, git init's core settings).
INERT = frozenset({
    "core.repositoryformatversion", "core.filemode", "core.bare", "core.logallrefupdates",
    "core.ignorecase", "core.precomposeunicode", "core.symlinks", "core.autocrlf", "core.eol",
    "init.defaultbranch", "user.name", "user.email", "extensions.objectformat",
    "remote.*.url", "remote.*.pushurl", "remote.*.fetch", "remote.*.push", "remote.*.tagopt",
    "remote.*.mirror", "branch.*.remote", "branch.*.merge", "branch.*.rebase",
    "branch.*.pushremote", "submodule.*.url", "submodule.*.active",
})
SETID = stat.S_ISUID | stat.S_ISGID
BACKUP_CAP = 1 << 20  # bytes of one file copied at launch
BACKUP_TOTAL = 32 << 20  # bytes of all of them
AUDIT_CAP = 500_000  # entries walked after the run
CHUNK = 4096  # entries of one directory held at once: the launcher's memory stays small
MAX_WATCHED = 4_000  # git directories the live watch follows (like discover.MAX_MASKS)


class Action(NamedTuple):
    """One thing the audit did (or could not do), and why."""

    path: str
    did: str  # quarantined, restored, cleared set-id bits, removed, failed
    why: str
    to: str | None = None  # where the quarantined thing now is

    def line(self) -> str:
        if self.did == "failed":
            return f"{self.path}: {self.why}; corral could not undo it: inspect it before " \
                   "running git or other tools there"
        where = f" to {self.to}" if self.to else ""
        return f"{self.did} {self.path}{where}: {self.why}"

    def to_json(self) -> dict[str, str]:
        return {k: v for k, v in self._asdict().items() if v is not None}


class Census(Record):
    """The writable trees at launch, as the audit compares them."""

    trees: tuple[tuple[str, tuple[int, int] | None], ...]  # (top, whose they are)
    names: frozenset[str]  # protected names (guard.PROTECTED_NAMES and --protect)
    gitdirs: frozenset[str] = frozenset()  # main git directories
    linked: frozenset[str] = frozenset()  # submodule and worktree git directories
    protected: frozenset[str] = frozenset()  # paths with protected names
    placeholders: tuple[tuple[str, int, int], ...] = ()  # (path, dev, ino)
    hook_folders: tuple[str, ...] = ()  # relative core.hooksPath every repository gets
    backups: dict[str, tuple[bytes, int]] = field(default_factory=dict)  # path: data, mode
    commands: dict[str, frozenset[str]] = field(default_factory=dict)  # gitstate.at_launch
    started_ns: int = field(default_factory=time.time_ns)
    # (dev, ino) at launch, in a reused workspace, of each git directory and its hooks
    # folder, and of each protected path and every folder beneath a protected folder: a
    # folder renamed into place keeps its files' change times, so the folder's own
    # identity tells it apart (reviews 11 and 25)
    folders: dict[str, tuple[int, int]] = field(default_factory=dict)
    # The census walked the whole tree (a reused workspace): a protected path or a .git
    # file it did not see is new, whatever its change time (review 26 carried a .vscode
    # and a .git file out of a folder inside a .git, where the walks look at no names, in
    # a later run: their files kept the earlier run's times).  Agent mode's scan stops
    # at submodules' git directories, so there what it did not see is judged by time.
    whole: bool = False
    # Folders the whole census could not list (another user's, mode 0700): what lies
    # beneath is judged by time, as the user's own files there may be (review 27).
    blind: tuple[str, ...] = ()
    # Paths the repositories' configs and the user's global ones name in a reused
    # workspace (included files, the core.hooksPath folder, programs git runs), whatever
    # their names, there or not at launch (review 29: the payload rewrote the hook in the
    # folder a repository's own core.hooksPath names, and put a core.fsmonitor in a file
    # its include.path names; host git obeyed both).
    named: frozenset[str] = frozenset()

    def swapped(self, tree: fsops.Tree, rel: str) -> bool:
        """Whether the folder ``rel`` is not the one the census saw there."""
        want = self.folders.get(tree.path(rel))
        if want is None:
            return False
        st = tree.lstat(rel)
        return st is None or (st.st_dev, st.st_ino) != want

    def changed(self, st: os.stat_result | None) -> bool:
        return st is not None and st.st_ctime_ns >= self.started_ns

    def watched(self) -> list[tuple[str, str, tuple[int, int] | None]]:
        """(git directory, its tree's top, owner) for the live watch."""
        return [(g, top, owner) for g in sorted(self.gitdirs) for top, owner in self.trees
                if g.startswith(top.rstrip("/") + "/") or g == top][:MAX_WATCHED]


HELD = set(STOPPING)


@small.contextmanager
def signals_held() -> Iterator[None]:
    """Every signal that stops corral (errors.STOPPING) waits while the block runs (this
    thread's mask; corral's other threads block them for good), then is delivered."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, HELD)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


@small.contextmanager
def audited(census: Census, quarantine: Callable[[], str], actions: list[Action],
            done: Callable[[], None] = lambda: None) -> Iterator[None]:
    """Watch the census' git directories while the block runs, then audit, however the
    block ends; the stopping signals wait meanwhile (a second Ctrl-C must not cut the
    audit short).  ``actions`` receives what the watch and the audit did; ``done`` is
    called once the audit has run to its end and did all it had to (not when it raised,
    met its cap, or failed to move something)."""
    watched = census.watched()
    if watched:  # (a fresh workspace has no git directory: no watch, not even its import)
        from .livewatch import LiveWatch  # it reports with Action, defined here

        watch: LiveWatch | small.nullcontext = LiveWatch(watched)
    else:
        watch = small.nullcontext()
    try:
        with watch:
            yield
    finally:
        with signals_held():
            actions += getattr(watch, "actions", [])
            audited = Auditor(census, quarantine).run()
            actions += audited
            if not any(a.did == "failed" for a in audited):  # else still owed (pending)
                done()


def _short(name: str) -> str:
    """``name`` cut to 200 bytes: the quarantine's own prefix must still fit a file name
    (a hook named with 253 bytes made every move fail, and the audit stayed owed for ever;
    found by review)."""
    return os.fsdecode(os.fsencode(name)[:200])


def census_of_findings(trees: Sequence[tuple[str, tuple[int, int] | None]],
                       findings: Sequence[Finding], names: frozenset[str],
                       hook_folders: tuple[str, ...] = (), watched: Sequence[str] = ()
                       ) -> Census:
    """Agent mode: the scan has found everything (and all of it is read-only inside);
    ``watched``: missing files git's commands name, a plant if made during the run."""
    from . import gitstate, repos  # (this module's git parts are imported where used)

    placeholders = []
    for f in findings:
        if f.origin == "placeholder":
            try:
                st = os.lstat(f.path)  # made just now by corral; checked again at removal
                placeholders.append((f.path, st.st_dev, st.st_ino))
            except OSError:
                continue
    gitdirs = frozenset(f.path for f in findings if f.reason == repos.GITDIR)
    linked = frozenset(f.path for f in findings if f.reason == repos.LINKED)
    return Census(
        tuple(trees), names, gitdirs=gitdirs, linked=linked,
        protected=frozenset(f.path for f in findings if os.path.basename(f.path) in names
                            or os.path.basename(f.path) == ".git"
                            or vcs_control(f.path, f.kind)),
        placeholders=tuple(placeholders), hook_folders=hook_folders, named=frozenset(watched),
        commands=gitstate.at_launch(trees, gitdirs | linked))


def census_of_tree(top: str, owner: tuple[int, int] | None, names: frozenset[str]) -> Census:
    """Run mode, a reused workspace: nothing is read-only inside, so copies are kept."""
    from . import gitstate

    gitdirs: set[str] = set()
    linked: set[str] = set()
    protected: set[str] = set()
    budget = [BACKUP_TOTAL]
    backups: dict[str, tuple[bytes, int]] = {}
    folders: dict[str, tuple[int, int]] = {}
    blind: list[OSError] = []
    gitfiles: list[str] = []
    hgdirs: list[str] = []
    found = _Found(gitdirs, linked, protected, backups, budget, folders, gitfiles, hgdirs)
    with fsops.Tree(top, owner) as tree:
        try:
            # A bare repository as the workspace itself, as the audit takes it: its
            # controls kept, then the walk goes on (else a run that changed nothing had
            # its hooks quarantined as a new repository's).
            bare_top = _holds_git_dir(tree, "") and _repos().valid_head(tree, "")
            if bare_top:
                gitdirs.add(tree.path("."))
                _keep(tree, ".", backups, budget, folders)
                _guarded(_nested_census, tree, ".", linked, backups, budget, folders)
            for here, entries in walk(tree, limit=AUDIT_CAP, stats=True, chunk=CHUNK,
                                      errors=blind, unlock=False):
                if not here and bare_top:  # its submodules' and worktrees': done above
                    entries[:] = [e for e in entries if e.name not in _repos().NESTED]
                # One folder that cannot be looked into (a name too long) leaves only its
                # part unrecorded, and the census goes on (review 29).
                with small.suppress(OSError):
                    _census_part(tree, here, entries, names, found)
        except OSError:
            # It stopped short (the cap): what it did not see stays new.  Never "judge it by
            # time" instead: review 28 made the census fail on purpose (a path too long
            # beneath a submodule's git directory) and carried an older .git file out.
            pass
        unseen = tuple(_absolute(tree, e) for e in blind)
        for path in unseen:  # its identity: one put in its place later is seen after all
            with small.suppress(OSError):
                st = os.lstat(path)
                folders[path] = (st.st_dev, st.st_ino)
        named, hook_folders = _config_named(tree, owner, gitdirs, linked, gitfiles, hgdirs)
        for path, kind in named.items():
            rel = os.path.relpath(path, tree.root)
            if kind == "missing" or tree.lstat(rel) is None:
                continue  # one made during the run is new
            protected.add(path)
            _identities(tree, rel, kind, folders)
            if kind == "file":
                _copy(tree, rel, backups, budget)
    return Census(((top, owner),), names, frozenset(gitdirs), linked=frozenset(linked),
                  protected=frozenset(protected), backups=backups, folders=folders,
                  whole=True, blind=unseen, named=frozenset(named), hook_folders=hook_folders,
                  commands=gitstate.at_launch([(top, owner)], gitdirs | linked))


def _config_named(tree: fsops.Tree, owner: tuple[int, int] | None, gitdirs: set[str],
                  linked: set[str], gitfiles: list[str], hgdirs: Sequence[str] = ()
                  ) -> tuple[dict[str, str], tuple[str, ...]]:
    """{path: kind} of what the workspace's repositories' configs and the user's global
    configs name inside it, as agent mode makes them read-only (the same
    :func:`repos.config_named` and :func:`repos.global_named`), and the global relative
    ``core.hooksPath``.  The global configs are both the launcher's and, started by root
    for a user, that user's (review 30: root read only its own, and the user's dotfiles
    hooks went unaudited).  What git would not read, or a link inside the workspace on the
    way, refuses the run, as in agent mode."""
    from .locate import Roots

    repos = _repos()
    homes = [os.path.expanduser("~")]
    if owner is not None:
        with small.suppress(KeyError):
            homes.append(pwd.getpwuid(owner[0]).pw_dir)
    # Each git directory with the work tree its relative paths are resolved against.
    pairs = [(g, os.path.dirname(g) if os.path.basename(g) == ".git" else g)
             for g in sorted(gitdirs)] + [(g, g) for g in sorted(linked)]
    for rel in gitfiles:  # a worktree or submodule: its git directory (and the common
        target = repos.gitfile_target(tree, rel)  # one's config), wherever it is
        if target is not None:
            pairs.append((os.path.normpath(target), os.path.dirname(tree.path(rel))))
    from . import discover

    found: list[Finding] = []
    hook_folders: list[str] = []
    for home in dict.fromkeys(homes):
        scope = repos.Scope(Roots([tree]), home, create=False)
        # The user's own files with the user's rights (review 31: root read a root-only
        # file a user's config included, and quoted it in its refusal).
        with fsops.acting_as(owner if home != homes[0] else None):
            scope, more = repos.global_findings(scope)
            found += more
            # What the home's start-up files link to in the workspace, as in agent mode
            # (review 31: ~/.bash_aliases a link into it, and bash ran what the run added)
            found += discover.home_links(scope, home)
        for gitdir, worktree in pairs:
            found += repos.config_named(scope, gitdir, worktree)
        for hgdir in hgdirs:  # an hg repository's configs, hooks and extensions
            found += repos.hg_repository(scope, hgdir)
        hook_folders += repos.hook_folders(scope.inherited)
    top = os.path.normpath(tree.root)
    # Watched: missing at launch, nothing to look at now ("missing")
    named = {f.path: "missing" for f in found if f.action == "watch"}
    named.update({f.path: f.kind for f in found if f.action == "protect"
                  and os.path.normpath(f.path) != top})  # (the workspace: not a hook folder)
    return named, tuple(dict.fromkeys(hook_folders))


class _Found(NamedTuple):
    """What :func:`census_of_tree` records, as it goes."""

    gitdirs: set[str]
    linked: set[str]
    protected: set[str]
    backups: dict[str, tuple[bytes, int]]
    budget: list[int]
    folders: dict[str, tuple[int, int]]
    gitfiles: list[str]  # .git files: worktrees' and submodules'
    hgdirs: list[str]  # .hg folders: hg repositories


def _census_part(tree: fsops.Tree, here: str, entries: list[fsops.Entry],
                 names: frozenset[str], f: _Found) -> None:
    """One part of one folder's listing, for the census; prunes ``entries`` to the
    folders to walk into."""
    if ".git" in here.split("/"):
        # Inside a .git folder nothing is recorded: what git keeps there has no protected
        # name, and what an earlier corral left there unaudited is not the user's (the
        # audit now walks there too, and takes whatever it finds for new).
        return
    if here and (tree.path(here) in f.gitdirs or _holds_git_dir(tree, here)):
        if tree.path(here) not in f.gitdirs:  # its first part
            f.gitdirs.add(tree.path(here))
            _keep(tree, here, f.backups, f.budget, f.folders)
            _guarded(_nested_census, tree, here, f.linked, f.backups, f.budget, f.folders)
        # Its submodules' and worktrees' git directories: recorded just above.  The rest
        # of it is walked like any folder, as the audit walks it (review 29 hid a user's
        # repository in a folder inside a .git, a link left in its place).
        entries[:] = [e for e in entries if e.name not in _repos().NESTED]
    f.hgdirs.extend(tree.path(join(here, e.name)) for e in entries
                    if e.name == ".hg" and e.kind == "dir")
    for e in [e for e in entries if e.name in names or e.name == ".git"
              or vcs_control(tree.path(join(here, e.name)), e.kind)]:
        rel = join(here, e.name)
        f.protected.add(tree.path(rel))
        if e.name != ".git" or e.kind != "dir":
            _identities(tree, rel, e.kind, f.folders)
        if e.name == ".git" and e.kind == "dir":
            f.gitdirs.add(tree.path(rel))
            _keep(tree, rel, f.backups, f.budget, f.folders)
            _guarded(_nested_census, tree, rel, f.linked, f.backups, f.budget, f.folders)
            continue  # walked into: see above
        if e.kind == "file":
            _copy(tree, rel, f.backups, f.budget)
            if e.name == ".git":
                f.gitfiles.append(rel)
        entries.remove(e)


def _guarded(step: Callable[..., None], *args: object) -> None:
    """A census step beneath one git directory: one that fails (a name too long, a folder
    gone) leaves that part unrecorded, and the census goes on with the rest."""
    with small.suppress(OSError):
        step(*args)


def _absolute(tree: fsops.Tree, e: OSError) -> str:
    """The folder a walk could not list (its error names it relative to the tree)."""
    name = os.fsdecode(e.filename or "")
    return name if name.startswith("/") else tree.path(name)


def _identities(tree: fsops.Tree, rel: str, kind: str,
                folders: dict[str, tuple[int, int]]) -> None:
    """Record the identity of a protected path and, for a folder, of every folder beneath:
    one renamed into place keeps its files' old change times (review 25 swapped a copy of
    ``.hg`` made by an earlier run in, its ``hgrc`` with a hook), so only the identity
    tells the audit it is not the one the launch saw."""
    st = tree.lstat(rel)
    if st is None:
        return
    folders[tree.path(rel)] = (st.st_dev, st.st_ino)
    if kind != "dir":
        return
    with small.suppress(OSError):  # an unreadable corner: every file there is new
        for here, entries in walk(tree, rel, limit=AUDIT_CAP, stats=True, chunk=CHUNK):
            for e in entries:
                if e.kind == "dir" and e.st is not None:
                    folders[tree.path(join(here, e.name))] = (e.st.st_dev, e.st.st_ino)


def _nested_census(tree: fsops.Tree, gitdir: str, linked: set[str],
                   backups: dict[str, tuple[bytes, int]], budget: list[int],
                   folders: dict[str, tuple[int, int]]) -> None:
    """The submodules' and worktrees' git directories in ``gitdir``'s modules/ and
    worktrees/, found as the audit finds them (Auditor._gitdir): recorded with their
    controls kept, else the audit takes them for ones made during the run and quarantines
    the user's own submodule config (review 10)."""
    for nested in _repos().NESTED:
        if tree.lstat(f"{gitdir}/{nested}") is None:
            continue
        for here, entries in walk(tree, f"{gitdir}/{nested}", limit=AUDIT_CAP, chunk=CHUNK):
            if tree.path(here) in linked or (tree.lstat(f"{here}/HEAD") is not None and (
                    tree.lstat(f"{here}/config") is not None or _holds_git_dir(tree, here))):
                if tree.path(here) not in linked:  # its first part
                    linked.add(tree.path(here))
                    _keep(tree, here, backups, budget, folders)
                    _copy(tree, f"{here}/commondir", backups, budget)
                entries[:] = [e for e in entries if e.name in _repos().NESTED]


def _repos() -> ModuleType:
    """:mod:`corral.repos`, imported where a git directory is audited (with gitconfig and
    locate): not by a run whose workspace holds none."""
    from . import repos

    return repos


def _holds_git_dir(tree: fsops.Tree, rel: str) -> bool:
    """``repos.holds_git_dir``, whose first test (a ``HEAD``) is made here: a directory
    without one is no git directory, and repos is not imported for it."""
    return tree.lstat(f"{rel}/HEAD" if rel else "HEAD") is not None and \
        _repos().holds_git_dir(tree, rel)


def _keep(tree: fsops.Tree, gitdir: str, backups: dict[str, tuple[bytes, int]],
          budget: list[int], folders: dict[str, tuple[int, int]] | None = None) -> None:
    for folder in (gitdir, f"{gitdir}/hooks"):
        st = tree.lstat(folder)
        if st is not None and folders is not None:
            folders[tree.path(folder)] = (st.st_dev, st.st_ino)
    for name in ("config", "config.worktree"):
        _copy(tree, f"{gitdir}/{name}", backups, budget)
    if tree.lstat(f"{gitdir}/hooks") is not None:
        for e in tree.scandir(f"{gitdir}/hooks"):
            _copy(tree, f"{gitdir}/hooks/{e.name}", backups, budget)


def _copy(tree: fsops.Tree, rel: str, backups: dict[str, tuple[bytes, int]],
          budget: list[int]) -> None:
    try:
        st = tree.lstat(rel)
        data = tree.read(rel, min(BACKUP_CAP, budget[0])) if st is not None else None
    except OSError:
        return
    if st is not None and data is not None:
        budget[0] -= len(data)
        backups[tree.path(rel)] = (data, stat.S_IMODE(st.st_mode) & 0o755)


class Auditor:
    """Runs the audit of one census; ``quarantine`` makes (once) the folder things go to."""

    def __init__(self, census: Census, quarantine: Callable[[], str]) -> None:
        self.census = census
        self.make_quarantine = quarantine
        self.qtree: fsops.Tree | None = None
        self.actions: list[Action] = []
        self.errors: list[OSError] = []  # folders no walk could list, even unlocked
        self.here: str | None = None  # the directory the walk is in, and whether it is
        self.here_is_git = False  # a git directory (each is audited once, not per part)
        self.packs: Budget | None = None  # time to check objects: one for all git dirs
        self.gitdirs_done: set[str] = set()  # each git directory is audited once
        self._by_identity: dict[tuple[int, int], str] | None = None

    def run(self) -> list[Action]:
        try:
            # Corral's own first: a placeholder commondir is not a plant in a git directory.
            self._placeholders()
            for top, owner in self.census.trees:
                self._tree(top, owner)
            self.actions += [Action(e.filename or "?", "failed", "the audit could not look "
                                    f"inside it ({e.strerror})") for e in self.errors]
        finally:
            if self.qtree is not None:
                self.qtree.close()
        return self.actions

    def _tree(self, top: str, owner: tuple[int, int] | None) -> None:
        try:
            tree = fsops.Tree(top, owner)
        except OSError as e:
            self.actions.append(Action(top, "failed", f"cannot audit it ({e.strerror})"))
            return
        with tree:
            try:
                for here, entries in self._walk(tree, ""):
                    try:
                        self._directory(tree, here, entries)
                    except OSError as e:
                        # One folder that cannot be examined (a path too long to look up
                        # inside it) must not end the audit of every folder after it
                        # (review 29 made one, and plants in the folders walked later
                        # stayed): it is reported, the walk goes on into it and the rest.
                        self.actions.append(Action(tree.path(here), "failed", "the audit "
                                                   f"could not examine it ({e.strerror})"))
            except OSError as e:
                self.actions.append(Action(tree.path(""), "failed",
                                           f"the audit could not finish ({e.strerror})"))
            self._named(tree)

    def _named(self, tree: fsops.Tree) -> None:
        """What the repositories' configs name (:attr:`Census.named`), by its path: as a
        protected path is, made or changed during the run, a link on the way included."""
        top = tree.root.rstrip("/") + "/"
        listings: dict[str, set[str] | None] = {}  # a folder's names, listed once
        for path in sorted(self.census.named):
            if not path.startswith(top) or os.path.basename(path) in self.census.names:
                continue  # another tree's, or judged by the walk already
            rel = path[len(top):]
            parent, _, name = rel.rpartition("/")
            if parent not in listings:  # (a hook's python -m names thousands, most absent)
                try:
                    listings[parent] = {e.name for e in tree.scandir(parent)}
                except OSError:  # gone, or a link on the way: looked at one by one below
                    listings[parent] = None
            there = listings[parent]
            if there is not None and name not in there:
                continue  # nothing there now: nothing to take
            try:
                try:
                    st = tree.lstat(rel)
                except OSError:  # a link on the way (none was: the census would refuse)
                    self._link_on_the_way(tree, rel)
                    continue
                if st is not None:
                    kind = fsops.kind_of(st.st_mode)
                    self._protected(tree, rel, fsops.Entry(os.path.basename(rel), kind, st))
            except OSError as e:
                self.actions.append(Action(path, "failed", "the audit could not examine it "
                                           f"({e.strerror})"))

    def _link_on_the_way(self, tree: fsops.Tree, rel: str) -> None:
        parts = rel.split("/")
        for i in range(1, len(parts)):
            st = tree.lstat("/".join(parts[:i]))
            if st is not None and stat.S_ISLNK(st.st_mode):
                self._quarantine(tree, "/".join(parts[:i]), "a link made during the run on "
                                 "the way to what a git config names: git would follow it")
                return

    def _walk(self, tree: fsops.Tree, rel: str) -> Iterator[tuple[str, list[fsops.Entry]]]:
        """Every folder beneath ``rel``: one the payload locked is unlocked (it is the
        owner's), one that cannot be listed even so is reported, and the rest is walked."""
        return walk(tree, rel, limit=AUDIT_CAP, stats=True, chunk=CHUNK, errors=self.errors)

    def _directory(self, tree: fsops.Tree, here: str, entries: list[fsops.Entry]) -> None:
        if here != self.here:  # a directory's parts come one after another
            # A bare repository (the tree's top too, when its HEAD is one git takes): its
            # controls, and then its folders like any other, since a folder that merely
            # looks like a repository must not hide what lies beneath it.
            self.here, self.here_is_git = here, False  # (if the test below fails)
            self.here_is_git = _holds_git_dir(tree, here) and (
                bool(here) or _repos().valid_head(tree, ""))
            if self.here_is_git:
                self._gitdir(tree, here or ".")  # the walk goes on into it
        if self.here_is_git or tree.path(here) in self.gitdirs_done:
            # its submodules' and worktrees': walked by _gitdir
            entries[:] = [e for e in entries if e.name not in _repos().NESTED]
        self._entries(tree, here, entries)

    def _entries(self, tree: fsops.Tree, here: str, entries: list[fsops.Entry]) -> None:
        """What one part of a folder's entries needs, wherever the folder is (in a git
        directory's modules/ too: a folder that looks like a repository hid its .git and
        its protected names from the audit, review 5); prunes ``entries`` to the folders
        to walk into."""
        keep = []
        for e in entries:
            rel = join(here, e.name)
            if e.kind == "file" and e.st is not None and e.st.st_mode & SETID \
                    and self.census.changed(e.st):
                self._strip(tree, rel)
            if e.name == ".git":
                self._dot_git(tree, rel, e)
                if e.kind == "dir":  # and all inside it, like any folder's (review 29: a
                    keep.append(e)  # repository hidden in a folder inside a .git, a link
                    # left in its place, was never looked at)
            elif e.name in self.census.names or vcs_control(tree.path(rel), e.kind):
                self._protected(tree, rel, e)
            elif e.kind == "dir":
                keep.append(e)
        entries[:] = keep

    def _strip(self, tree: fsops.Tree, rel: str) -> None:
        try:
            tree.chmod(rel, SETID)
            self.actions.append(Action(tree.path(rel), "cleared set-id bits of",
                                       "set during the run: it would run as its owner"))
        except OSError as e:
            self.actions.append(Action(tree.path(rel), "failed", f"a set-id bit set during "
                                       f"the run could not be cleared ({e.strerror})"))

    def _origin(self, path: str, st: os.stat_result | None) -> str | None:
        """Where the census saw the protected path now at ``path``: there, or (a whole
        census) where the same file or folder was when a folder above it has been renamed
        since (``mv app web``: the user's own ``.hg/hgrc`` is no plant); None if new."""
        if path in self.census.protected:
            return path
        if not self._strict(path) or st is None or (
                not stat.S_ISDIR(st.st_mode) and st.st_nlink > 1):
            return None  # a second name of the user's file is a plant
        if self._by_identity is None:  # protected paths; never a git directory (review 27
            # renamed one the census knew to .githooks, its planted hook then taken as the
            # user's)
            self._by_identity = {v: k for k, v in self.census.folders.items()
                                 if k in self.census.protected and k not in
                                 self.census.gitdirs and k not in self.census.linked}
        origin = self._by_identity.get((st.st_dev, st.st_ino))
        # Moved with a folder above it, a protected path keeps its name.
        same = origin is not None and os.path.basename(origin) == os.path.basename(path)
        return origin if same else None

    def _strict(self, path: str) -> bool:
        """Whether the census saw all there was at ``path``: then what it did not see
        there is new, whatever its change time."""
        return self.census.whole and not any(
            (path == b or path.startswith(b.rstrip("/") + "/")) and self._same(b)
            for b in self.census.blind)

    def _same(self, folder: str) -> bool:
        """Whether the folder the census could not list is still the one at its path (one
        the payload renamed away and replaced with its own is no longer unseen)."""
        try:
            st = os.lstat(folder)
        except OSError:
            return False
        return self.census.folders.get(folder) == (st.st_dev, st.st_ino)

    def _dot_git(self, tree: fsops.Tree, rel: str, e: fsops.Entry) -> None:
        path = tree.path(rel)
        origin = self._origin(path, e.st) if e.kind == "file" else None
        if e.kind == "dir":
            self._gitdir(tree, rel)
        elif e.kind != "file" or (origin is None and (self.census.changed(e.st)
                                                      or self._strict(path))):
            self._quarantine(tree, rel, f"a .git ({e.kind}) made during the run")
        elif self.census.changed(e.st) or path in self.census.gitdirs:
            # A .git file that was there, rewritten, or one in place of the git directory
            # the launch saw: git follows it on the host, to a git directory of the
            # payload's wherever it points (review 13: into a folder inside a .git, which
            # no walk audits, with a core.fsmonitor host `git status` ran).
            self._quarantine(tree, rel, "a .git file changed during the run, or put in "
                             "place of a git directory: git would follow it on the host",
                             restore=True, origin=origin)

    def _protected(self, tree: fsops.Tree, rel: str, e: fsops.Entry) -> None:
        origin = self._origin(tree.path(rel), e.st)
        if origin is None:
            if e.kind != "dir" or self.census.changed(e.st) or self._strict(tree.path(rel)):
                self._quarantine(tree, rel, "made during the run, and trusted by tools on "
                                 "the host")
                return
            # A folder the launch did not make read-only (one its scan did not reach): what
            # changed inside it during the run goes, as in one it did.
            for here, entries in self._walk(tree, rel):
                for sub in entries:
                    if sub.kind != "dir" and self.census.changed(sub.st):
                        self._quarantine(tree, join(here, sub.name), "changed during the "
                                         "run, inside a folder tools on the host trust")
            return
        if e.kind != "dir":
            if self.census.changed(e.st) or self.census.swapped(tree, rel):
                self._quarantine(tree, rel, "changed during the run, and trusted by tools "
                                 "on the host", restore=True, origin=origin)
            return
        # A folder that is not the one the launch saw there (renamed in, its files keeping
        # their old change times), when the census knows: all beneath it counts as changed.
        other = {rel} if self.census.swapped(tree, rel) else set()
        moved = (tree.path(rel), origin)  # where the census saw what is beneath
        for here, entries in self._walk(tree, rel):
            for sub in entries:
                path = join(here, sub.name)
                if sub.kind == "dir":
                    if here in other or self._other_folder(tree, path, sub.st, moved):
                        other.add(path)
                elif here in other or self.census.changed(sub.st):
                    self._quarantine(tree, path, "changed during the run, inside a folder "
                                     "tools on the host trust", restore=True)

    def _other_folder(self, tree: fsops.Tree, rel: str, st: os.stat_result | None,
                      moved: tuple[str, str]) -> bool:
        """Whether a folder inside a protected one is not the one the census recorded
        there (a reused workspace's census records them all; agent mode's, where they
        are read-only, none).  ``moved``: the protected folder's path now and where the
        census saw it."""
        if not self.census.folders:
            return False
        now, then = moved
        want = self.census.folders.get(then + tree.path(rel)[len(now):])
        return st is None or want != (st.st_dev, st.st_ino)

    def _gitdir(self, tree: fsops.Tree, rel: str) -> None:
        """A git directory's controls, and its submodules' and worktrees' git directories;
        every folder inside it is walked by the walk that found it, like any other."""
        if tree.path(rel) in self.gitdirs_done:  # reached twice (a .git inside modules/)
            return
        self.gitdirs_done.add(tree.path(rel))
        path = tree.path(rel)
        new = (path not in self.census.gitdirs and path not in self.census.linked and (
            # beneath a folder the census could not list: by its own change time (the
            # user's repository in their own locked folder is theirs: review 29)
            self._strict(path) or self.census.changed(tree.lstat(rel)))) or \
            self.census.swapped(tree, rel)  # a folder renamed into its place: as new
        main = path not in self.census.linked
        hooks_swapped = self.census.swapped(tree, f"{rel}/hooks")
        for name, rule in _controls(tree, rel):
            sub = f"{rel}/{name}"
            st = tree.lstat(sub)
            if st is None:
                continue
            if new:
                if rule != "config" or not self._inert(tree, sub):
                    self._quarantine(tree, sub, "in a git directory made during the run: "
                                     "git would run or obey it on the host")
            elif (name == "commondir" and main) or self.census.changed(st) or (
                    rule == "hook" and hooks_swapped):
                self._quarantine(tree, sub, "changed during the run: git would run or obey "
                                 "it on the host", restore=True)
        if new:
            self._work_tree_hooks(tree, rel)
        from . import gitstate

        for state, what in gitstate.commands(tree, rel).items():
            # A half-finished rebase, cherry-pick or am is left alone unless it would run
            # something the launch did not hold (the user's own rebase -x stays theirs).
            if what - self.census.commands.get(tree.path(state), frozenset()):
                self._quarantine(tree, state, gitstate.why(state, what))
        from . import gitredirect  # hashlib, zlib, tempfile: only where a git dir is audited

        if self.packs is None:  # git directories: made at the first, shared by all
            self.packs = gitredirect.Budget()
        for sub, why, back in gitredirect.planted(tree, rel, self.census.changed,
                                                     self.packs):
            self._quarantine(tree, sub, f"made or changed during the run: {why}; move it "
                             "back if it is yours", back=back)
        for nested in ("modules", "worktrees"):
            if tree.lstat(f"{rel}/{nested}") is None:
                continue
            # Every folder beneath, like the main walk's: a git directory found there is
            # audited as one (its own modules/ and worktrees/ by that call), and the rest
            # of it, and every other folder, is checked like any other, so that nothing
            # that merely looks like a git directory hides what lies beneath it.
            for here, entries in self._walk(tree, f"{rel}/{nested}"):
                if tree.path(here) in self.gitdirs_done or (
                        tree.lstat(f"{here}/HEAD") is not None and (
                            tree.lstat(f"{here}/config") is not None
                            or _holds_git_dir(tree, here))):
                    self._gitdir(tree, here)
                    entries[:] = [e for e in entries if e.name not in _repos().NESTED]
                self._entries(tree, here, entries)

    def _work_tree_hooks(self, tree: fsops.Tree, gitdir: str) -> None:
        """A new repository's hooks in the folder the global ``core.hooksPath`` names,
        relative to its work tree (the git directory itself when bare)."""
        base = os.path.dirname(gitdir) if os.path.basename(gitdir) == ".git" else gitdir
        for folder in self.census.hook_folders:
            rel = os.path.normpath(join(base, folder))
            try:
                if tree.lstat(rel) is None:
                    continue
                names = [e.name for e in tree.scandir(rel)
                         if not e.name.endswith(".sample") or e.kind != "file"]
            except OSError:  # a link, a file, a folder beyond the tree: all of it goes
                names = [""]
            for name in names:
                self._quarantine(tree, join(rel, name) if name else rel, "a hook of a "
                                 "repository made during the run, where the global "
                                 "core.hooksPath points git")

    def _inert(self, tree: fsops.Tree, rel: str) -> bool:
        from . import gitconfig

        try:
            entries = gitconfig.parse(tree.read(rel, _repos().CONFIG_CAP) or b"")
        except (OSError, gitconfig.ConfigError):
            return False
        return all(_inert_key(name, value) for name, value in entries)

    def _quarantine(self, tree: fsops.Tree, rel: str, why: str, restore: bool = False,
                    back: bytes | None = None, origin: str | None = None) -> None:
        """``origin``: where the census saw it, whose copy is put back (its path, unless a
        folder above it was renamed since)."""
        path = tree.path(rel)
        try:
            if self.qtree is None:
                self.qtree = fsops.Tree(self.make_quarantine())
            dest = f"{len(self.actions):04d}-{_short(os.path.basename(rel))}"
            move(tree, rel, self.qtree, dest)
        except Exception as e:  # one plant that cannot be moved must not end the audit
            what = e.strerror if isinstance(e, OSError) else type(e).__name__
            self.actions.append(Action(path, "failed", f"{why} ({what})"))
            return
        self.actions.append(Action(path, "quarantined", why, self.qtree.path(dest)))
        saved = (back, 0o644) if back is not None else self.census.backups.get(origin or path)
        if (restore or back is not None) and saved is not None:
            try:
                tree.write_new(rel, saved[0], saved[1])
                self.actions.append(Action(path, "restored", "its content from the launch"
                                           if back is None else "the rest of it"))
            except OSError as e:
                self.actions.append(Action(path, "failed", f"could not put back its content "
                                           f"from the launch ({e.strerror})"))

    def _placeholders(self) -> None:
        for path, dev, ino in self.census.placeholders:
            held = next(((t, o) for t, o in self.census.trees
                         if path.startswith(t.rstrip("/") + "/")), None)
            if held is None:
                continue
            try:
                with fsops.Tree(held[0], held[1]) as tree:
                    rel = os.path.relpath(path, held[0])
                    st = tree.lstat(rel)
                    if st is not None and (st.st_dev, st.st_ino) == (dev, ino) and \
                            stat.S_ISREG(st.st_mode) and (st.st_size == 0 or tree.read(
                                rel, len(SELF_COMMONDIR)) == SELF_COMMONDIR):
                        tree.unlink(rel)
            except OSError as e:
                if e.errno != errno.ENOENT:
                    self.actions.append(Action(path, "failed", "corral's placeholder could "
                                               f"not be removed ({e.strerror})"))


def _controls(tree: fsops.Tree, gitdir: str) -> Iterator[tuple[str, str]]:
    """(name, rule) of what git obeys in a git directory: config, the worktree config,
    commondir, and every hook that is not a sample."""
    yield "config", "config"
    yield "config.worktree", "file"
    yield "commondir", "file"
    if tree.lstat(f"{gitdir}/hooks") is not None:
        try:
            names = tree.scandir(f"{gitdir}/hooks")
        except OSError:  # a link, a file, or a folder no one can list: all of it goes
            yield "hooks", "hook"
            return
        for e in names:
            if not e.name.endswith(".sample") or e.kind != "file":
                yield f"hooks/{e.name}", "hook"


def _inert_key(name: str, value: str | None) -> bool:
    from . import gitconfig

    section, sub, key = gitconfig.split_name(name)
    pattern = f"{section}.*.{key}" if sub is not None else name
    if pattern not in INERT:
        return False
    # A URL with a transport helper ("ext::cmd", "fd::3") runs a program when fetched.
    return not (key in ("url", "pushurl") and value is not None and "::" in value)


# Hidden at launch as secrets, but also run by the host (direnv runs .envrc on entering
# the directory): a new one is planted code.
RUN_BY_HOST = frozenset({".envrc"})


def protected_names(extra: Sequence[str] = ()) -> frozenset[str]:
    """The names the audit compares: what the host runs or trusts, wherever it appears."""
    return frozenset(PROTECTED_NAMES | RUN_BY_HOST | set(extra))
