"""Git repositories inside writable trees: what git obeys stays out of the agent's reach.

An agent must be able to commit, so a repository's git directory stays writable, but git
*runs* or *obeys* some of what is in it, later, on the host, outside any sandbox.  A git
directory is anything git would open as one: a ``.git`` folder, the target of a ``.git``
file, a bare repository (``HEAD``, ``objects/``, ``refs/``) under any name, submodule and
worktree git directories.  For each:

* it is bound onto itself ("pinned"), so that it cannot be renamed away and replaced;
* ``config``, ``config.worktree``, ``hooks`` (created if missing), ``info`` are read-only;
  so are the files its config includes (``include.path``, every ``includeIf`` whatever its
  condition, ``~`` and relative forms, nested includes), the hook folder it names
  (``core.hooksPath``), and the program of every key git runs (``core.fsmonitor``,
  ``core.sshCommand``, ``alias.*``, filters, ...) when they lie in a writable tree; what
  is named but missing gets an empty read-only placeholder, so that it cannot be created;
  so does a missing ``config.worktree`` in every submodule and worktree git directory, and
  in a main one whose config sets ``extensions.worktreeConfig``;
* hook entries that are links are followed: their targets in a writable tree are
  read-only too; a link on the way inside a writable tree is refused;
* ``modules`` and ``worktrees`` are read-only (created empty if missing), so no new
  submodule or worktree git directory can appear; existing ones are pinned writable with
  their own control files read-only;
* ``commondir`` (which would redirect git to another config and hooks) is refused in a
  main git directory before launch, and read-only in the others; where there is none, a
  read-only placeholder naming the git directory itself (``.``, which git reads as no
  commondir) keeps one from being created while the run lives;
* a control file that is not a plain file or folder (a FIFO), is too large to read, has
  other hard links, or a config git itself could not parse, is refused.

The global config files (``~/.gitconfig``, ``~/.config/git/config``, ``/etc/gitconfig``)
are read too: what they include or name inside a writable tree is protected the same way,
and their ``core.hooksPath`` applies to every repository.  All reads and creations under
writable trees go through :mod:`corral.fsops`; nothing found is ever run.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import sys
from collections.abc import Iterator

from . import fsops, gitconfig, hgrc, interp, shellread, small
from .errors import UsageError
from .fswalk import walk
from .guard import SELF_COMMONDIR, Finding
from .locate import Landing, Roots, land
from .record import NamedTuple

__all__ = ["GITDIR", "LINKED", "NESTED", "Scope", "config_named", "gather", "git_findings",
           "gitfile_target", "global_config", "global_named", "global_paths", "hg_global",
           "hg_repository", "holds_git_dir",
           "hook_folders", "is_git_dir", "protect", "valid_head"]

CONTROL = ("config", "config.worktree", "hooks", "info")  # read-only in every git directory
CREATED = ("hooks", "modules", "worktrees")  # made to exist, so that they can be read-only
NESTED = ("modules", "worktrees")  # the git directories of submodules and worktrees
CONFIG_CAP = 1 << 20  # bytes of one config file; a larger one is refused
NESTED_CAP = 100_000  # entries walked in one git directory's modules/ or worktrees/
GITDIR = "git directory: cannot be renamed or replaced"  # the reason of a git directory's pin
LINKED = "a submodule's or worktree's git directory: cannot be renamed or replaced"
GLOBAL_CONFIGS = ("/etc/gitconfig", "~/.config/git/config", "~/.gitconfig")  # git's order


class Scope(NamedTuple):
    """What every git directory of one sandbox is judged against."""

    roots: Roots  # the writable trees
    home: str  # what ``~`` means to the user's git on the host
    create: bool  # make what must exist (hooks/, placeholders); False for --dry-run
    inherited: tuple[tuple[str, str | None], ...] = ()  # entries of the global config files
    hg: tuple[tuple[str, str, str | None], ...] = ()  # those of the global hg configs


def _refuse(path: str, what: str, why: str) -> UsageError:
    return UsageError(f"{path} {what}, so corral cannot keep it out of the agent's reach", why,
                      "inspect it (a previous sandboxed session may have planted it), fix it, "
                      "and start again")


def is_git_dir(names: set[str]) -> bool:
    """Whether a directory listing is one git opens as a repository (setup.c)."""
    return "HEAD" in names and ("commondir" in names or {"objects", "refs"} <= names)


def valid_head(tree: fsops.Tree, rel: str) -> bool:
    """Whether git could take ``rel``/HEAD for a repository's (``validate_headref``): used
    where a listing alone would be too eager, at the top of a tree (a project with a file
    named HEAD).  Anything but a plain file that is neither ``ref:`` nor an object id
    counts: a link or a FIFO git might follow, or a file corral cannot read."""
    head = f"{rel}/HEAD" if rel else "HEAD"
    try:
        st = tree.lstat(head)
        if st is None or not stat.S_ISREG(st.st_mode):
            return st is not None
        text = (tree.read(head, 4096) or b"").lstrip()
    except OSError:
        return True
    # git reads an object id's hex digits and ignores what follows them (``<id> junk``
    # is a detached HEAD to git 2.39): a HEAD held to a whole line of 40 or 64 left such
    # a repository, its hook and its config unaudited (review 12).  At least as eager.
    return text.startswith(b"ref:") or (len(text) >= 40 and all(
        c in b"0123456789abcdefABCDEF" for c in text[:40]))


def holds_git_dir(tree: fsops.Tree, rel: str) -> bool:
    """:func:`is_git_dir` for the directory ``rel``, by its marker names alone (no listing:
    for walks that see a large directory a part at a time)."""
    names = {n for n in ("HEAD", "commondir", "objects", "refs")
             if tree.lstat(f"{rel}/{n}" if rel else n) is not None}
    return is_git_dir(names)


def _control(scope: Scope, tree: fsops.Tree, rel: str, reason: str) -> Finding | None:
    """A read-only finding for the control path ``rel``; refuses what cannot be one."""
    path, name = tree.path(rel), os.path.basename(rel)
    st = tree.lstat(rel)
    if st is None and name in CREATED:
        if not scope.create:
            return Finding(path, "protect", "dir", reason, origin="planned")
        st = tree.mkdir(rel)
    if st is None:
        return None
    if stat.S_ISLNK(st.st_mode):
        raise _refuse(path, "is a symbolic link", "git follows it to its hooks and config")
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
        raise _refuse(path, f"is a {fsops.kind_of(st.st_mode)}", "git reads it as a control "
                      "file, and corral will not open or mount it")
    if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
        raise _refuse(path, f"has {st.st_nlink} hard links",
                      "its other names would stay writable")
    return Finding(path, "protect", "dir" if stat.S_ISDIR(st.st_mode) else "file", reason)


def git_findings(scope: Scope, tree: fsops.Tree, gitdir: str, worktree: str,
                 main: bool = True) -> Iterator[Finding]:
    """Everything to re-mount for the git directory ``gitdir`` (relative to ``tree``) of
    the work tree ``worktree`` (absolute; the git directory itself when bare).  ``main``
    is false for submodule and worktree git directories, whose ``commondir`` is
    legitimate (and then read-only)."""
    yield Finding(tree.path(gitdir), "pin", "dir", GITDIR if main else LINKED)
    commondir = f"{gitdir}/commondir"
    st = tree.lstat(commondir)
    if st is None or _own_commondir(tree, commondir, st):
        yield _commondir_placeholder(scope, tree, commondir, st is None)
    elif main:
        raise _refuse(tree.path(commondir), "exists in a main git directory",
                      "git would take its config and hooks from wherever it points")
    elif (found := _control(scope, tree, commondir, "git runs or obeys it on the host")):
        yield found  # a submodule's or worktree's own: legitimate, and read-only
    names = (*CONTROL, "modules", "worktrees") + (() if main else ("gitdir",))
    for name in names:
        found = _control(scope, tree, f"{gitdir}/{name}", "git runs or obeys it on the host")
        if found is not None:
            yield found
    yield from _hook_links(scope, tree, f"{gitdir}/hooks")
    for sub in ("modules", "worktrees"):
        yield from _nested(scope, tree, f"{gitdir}/{sub}")
    cfg = tree.path(f"{gitdir}/config")
    entries, included = gather(scope, cfg)
    yield from included
    # A linked worktree's git directory has no config of its own: whether git reads its
    # config.worktree is said in the common one, which this does not read (review 9 made one
    # mid-run, and host git in the worktree ran its fsmonitor).  So every git directory but
    # a main one gets one where there is none, empty and read-only, as does a main one
    # whose config says git reads it.
    if (not main or _worktree_config(entries)) and \
            tree.lstat(f"{gitdir}/config.worktree") is None:
        yield from _protect(scope, tree.path(f"{gitdir}/config.worktree"),
                            "git reads it (extensions.worktreeConfig)", "file")
    yield from config_named(scope, tree.path(gitdir), worktree, entries)


def config_named(scope: Scope, gitdir: str, worktree: str,
                 entries: list[tuple[str, str | None]] | None = None) -> Iterator[Finding]:
    """What git reads for the git directory ``gitdir`` (absolute, as git would open it,
    inside a writable tree or not) names in a writable tree: the files its configs
    include, the hook folder, the programs git runs, resolved against ``worktree``.  Its
    configs are the common one (a linked worktree's or a submodule's ``commondir``: git
    reads that repository's config there, review 30), its own ``config`` (``entries``,
    includes inlined, when already read) and ``config.worktree``, in git's order."""
    here = land(gitdir, scope.roots, "a git directory")
    if here.st is None or not stat.S_ISDIR(here.st.st_mode):
        return
    ordered: list[tuple[str, str | None]] = []
    common = _common_dir(scope, gitdir)
    if common is not None:
        more, included = gather(scope, os.path.join(common, "config"))
        ordered += more
        yield from included
    if entries is None:
        entries, included = gather(scope, os.path.join(gitdir, "config"))
        yield from included
    ordered += entries
    worktree_cfg = os.path.join(gitdir, "config.worktree")
    if land(worktree_cfg, scope.roots, "a git config").st is not None:
        more, included = gather(scope, worktree_cfg)
        ordered += more
        yield from included
    yield from _named(scope, [*scope.inherited, *ordered], worktree)
    last = gitconfig.last([*scope.inherited, *ordered], "core.hookspath")
    hooks = gitconfig.expand(last, scope.home) if last else None
    yield from _hook_modules(scope, os.path.join(worktree, hooks) if hooks else
                             os.path.join(common or gitdir, "hooks"), worktree)


# A hook that runs `python -m NAME` (pre-commit's: `"$INSTALL_PYTHON" -mpre_commit`), its
# short flags joined or not (`-Bm`), and those flags; an interpreter's path in a hook
MODULE_RUN = re.compile(rb"(?<![\w-])-([A-Za-z]*)m\s*['\"]?([A-Za-z_][A-Za-z0-9_.]*)")
SAFE_FLAGS = re.compile(rb"(?<![\w-])-[A-Za-z]*[PI]")
INTERPRETER = re.compile(rb"(/[^\s\"'=;|&]*python[0-9.]*)(?![\w/])")
BARE_PYTHON = re.compile(rb"(?<![\w/.-])(python[0-9.]*)(?![\w/])")
HOOK_READ_CAP = 1 << 16  # bytes of a hook read for what it runs


def _hook_modules(scope: Scope, hooks: str, worktree: str) -> Iterator[Finding]:
    """What a hook's ``python -m NAME`` imports from the work tree's top, where git runs
    hooks: ``-m`` puts that folder first on the import path for the whole run (review
    37: pre-commit's hook runs ``python -mpre_commit``; review 38: then every module it
    imports, ``argparse`` as well, and ``-Bm``).  For NAME, every module of the standard
    library and every module of the hook's interpreter's site-packages: the files and
    regular packages of those names at the top are read-only where they are and watched
    where they are not.  Not with ``-P`` or ``-I`` on the same line."""
    folder = land(hooks, scope.roots, "a folder of hooks")
    if folder.st is None or not stat.S_ISDIR(folder.st.st_mode):
        return
    try:
        entries = os.listdir(folder.path)
    except OSError:
        return
    runs: set[str] = set()
    interpreters: set[str] = set()
    for entry in entries:
        if entry.endswith(".sample"):
            continue
        path = os.path.join(folder.path, entry)
        with small.suppress(OSError):
            if stat.S_ISLNK(os.lstat(path).st_mode):  # (its target: see _hook_links)
                path = os.path.realpath(path)
        spot = land(path, scope.roots, "a hook")
        if spot.st is None or not stat.S_ISREG(spot.st.st_mode):
            continue
        data = b""
        with small.suppress(OSError):
            data = (spot.tree.read(spot.rel, HOOK_READ_CAP) if spot.tree is not None else
                    fsops.read_file(spot.path, HOOK_READ_CAP)) or b""
        before = len(runs)
        for line in data.splitlines():
            for m in MODULE_RUN.finditer(line):
                if b"P" in m.group(1) or b"I" in m.group(1) or \
                        SAFE_FLAGS.search(line, 0, m.start()):
                    continue
                runs.add(m.group(2).decode().split(".")[0])
        if len(runs) > before:  # the interpreters this hook names: by path, or on PATH
            interpreters.update(p.decode(errors="surrogateescape")
                                for p in INTERPRETER.findall(data))
            search = os.environ.get("PATH", os.defpath)
            for bare in BARE_PYTHON.findall(data):
                found = interp.which(bare.decode(), search)
                if found is not None:
                    interpreters.add(os.path.realpath(found))
    if not runs:
        return
    top = land(worktree, scope.roots, "a work tree")
    if top.tree is None or top.st is None or not stat.S_ISDIR(top.st.st_mode):
        return
    try:
        there = set(os.listdir(top.path))  # (one listing: most of these names are absent)
    except OSError:
        there = None
    shadows = set(sys.stdlib_module_names) | _site_modules(interpreters)
    arch = os.uname().machine
    for module in sorted(runs | shadows):
        files = [f"{module}.py", f"{module}.pyc", f"{module}.so", f"{module}.abi3.so",
                 *(f"{module}.cpython-3{minor}-{arch}-linux-gnu.so" for minor in range(8, 16)),
                 f"{module}/__init__.py", f"{module}/__init__.pyc"]
        if module in runs:
            files.append(module)  # (its own folder: a namespace package with __main__)
        why = f"a module a hook's python -m may import ({module})"
        for file in files:
            if there is not None and file.split("/")[0] not in there:
                yield Finding(os.path.join(top.path, file), "watch", "file", why)
                continue
            spot = land(os.path.join(top.path, file), scope.roots, "a module a hook runs")
            if spot.tree is None:
                continue
            if spot.st is None:
                yield Finding(spot.path, "watch", "file", why)
            elif not stat.S_ISDIR(spot.st.st_mode) or module in runs:
                yield from _protect(scope, spot.path, why, "file")


def _site_modules(interpreters: set[str]) -> set[str]:
    """Every module name the interpreters a hook names (``INSTALL_PYTHON=/venv/bin/python3``),
    and corral's own, can import from their own folders: the standard library's files as
    they are there, not only ``sys.stdlib_module_names`` (review 39: ``-m venv`` imports
    ``_sysconfigdata__x86_64-linux-gnu``), ``lib-dynload``, and ``site-packages`` and
    Debian's ``dist-packages``."""
    folders = [p for p in sys.path if os.path.isabs(p)]
    for interpreter in filter(os.path.isabs, interpreters):
        prefix = os.path.dirname(os.path.dirname(interpreter))
        for lib in (os.path.join(prefix, "lib"), os.path.join(prefix, "local", "lib")):
            with small.suppress(OSError):
                for version in os.listdir(lib):
                    if version.startswith("python"):
                        base = os.path.join(lib, version)
                        folders += [base, os.path.join(base, "lib-dynload"),
                                    os.path.join(base, "site-packages"),
                                    os.path.join(base, "dist-packages")]
    names: set[str] = set()
    for folder in dict.fromkeys(folders):
        with small.suppress(OSError):
            for entry in os.listdir(folder):
                if entry == "__pycache__" or entry.endswith((".dist-info", ".egg-info",
                                                             ".pth", ".egg-link")):
                    continue
                names.add(entry.split(".")[0])
    return names


def _common_dir(scope: Scope, gitdir: str) -> str | None:
    """The common git directory a ``commondir`` names (relative to ``gitdir``), when it is
    another than ``gitdir`` itself (corral's placeholder names ``.``)."""
    spot = land(os.path.join(gitdir, "commondir"), scope.roots, "a git directory's commondir")
    if spot.st is None or not stat.S_ISREG(spot.st.st_mode):
        return None
    try:
        data = spot.tree.read(spot.rel, 4096) if spot.tree is not None else \
            fsops.read_file(spot.path, 4096)
    except OSError:
        return None
    text = (data or b"").decode(errors="surrogateescape").strip()
    if not text:
        return None
    common = os.path.normpath(os.path.join(gitdir, text))
    return None if common == os.path.normpath(gitdir) else common


def global_named(scope: Scope) -> Iterator[Finding]:
    """What the user's global configs (``scope.inherited``) name by an absolute or ``~``
    path: their hook folder and programs, for every repository, even where the writable
    trees hold none (review 30: a dotfiles folder holding ``core.hooksPath``)."""
    # The hook folder against "/": a relative one means one in each repository (done
    # there).  The commands against where the user may run git outside any repository:
    # the home and the writable trees' tops.
    return _named(scope, list(scope.inherited), "/", _outside(scope))


def _outside(scope: Scope) -> list[str]:
    """Where the user may run git or hg outside any repository, for the commands of the
    global configs: the home and the writable trees' tops."""
    return [scope.home, *(t.root for t in scope.roots.trees)]


def _commondir_placeholder(scope: Scope, tree: fsops.Tree, rel: str, make: bool) -> Finding:
    """A read-only ``commondir`` where there is none, naming the git directory itself.

    One created while the run lives would send the host's git (a prompt or an editor
    polling ``git status``, into the submodules that existed at launch too) to a config and
    hooks of the payload's: the live watch removes it, but not before git may read it
    (seen by review 8, in a submodule's git directory, which it did not watch).  Git reads
    ``.`` as no commondir at all; an empty file would make it fail.  Removed after the run,
    like every placeholder; one left by a run whose audit never came is taken as corral's
    again."""
    why = "a commondir made there would send git to another config and hooks"
    if make and not scope.create:
        return Finding(tree.path(rel), "protect", "file", why, origin="planned")
    if make:
        tree.write_new(rel, SELF_COMMONDIR)
    return Finding(tree.path(rel), "protect", "file", why, origin="placeholder")


def _own_commondir(tree: fsops.Tree, rel: str, st: os.stat_result) -> bool:
    """Whether the ``commondir`` there is one of corral's placeholders (``.``)."""
    return stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and \
        st.st_size == len(SELF_COMMONDIR) and tree.read(rel, st.st_size) == SELF_COMMONDIR


def _worktree_config(entries: list[tuple[str, str | None]]) -> bool:
    """Whether git would read config.worktree; a value it cannot read as false counts."""
    values = [v for n, v in entries if n == "extensions.worktreeconfig"]
    return bool(values) and (values[-1] or "true").strip().lower() not in (
        "false", "no", "off", "0", "")


def _nested(scope: Scope, tree: fsops.Tree, folder: str) -> Iterator[Finding]:
    """Existing submodule and worktree git directories: writable, their control read-only."""
    if tree.lstat(folder) is None:
        return
    for here, entries in walk(tree, folder, limit=NESTED_CAP):
        names = {e.name for e in entries}
        if "HEAD" in names and ("config" in names or "commondir" in names):
            entries.clear()
            yield from git_findings(scope, tree, here, tree.path(here), main=False)


def _hook_links(scope: Scope, tree: fsops.Tree, hooks: str) -> Iterator[Finding]:
    """The targets of hook entries that are links, when a writable tree holds them; a hook
    file with another hard link is refused (the other name is writable)."""
    if tree.lstat(hooks) is None:  # --dry-run: hooks/ is made at launch
        return
    for here, entries in walk(tree, hooks, limit=NESTED_CAP, stats=True):
        for e in entries:
            rel = f"{here}/{e.name}"
            if e.kind == "file" and e.st is not None and e.st.st_nlink > 1:
                raise _refuse(tree.path(rel), f"has {e.st.st_nlink} hard links",
                              "git runs it, and its other names would stay writable")
            if e.kind == "link":
                path = os.path.join(tree.path(here), tree.readlink(rel))
                yield from _protect(scope, path, f"the hook {e.name} links to it", "file")


def protect(scope: Scope, path: str, reason: str, kind: str) -> Iterator[Finding]:
    """``path`` read-only wherever it lands in a writable tree (see :func:`_protect`)."""
    return _protect(scope, path, reason, kind)


def _protect(scope: Scope, path: str, reason: str, kind: str) -> Iterator[Finding]:
    """``path`` (as git would open it) read-only when it lands in a writable tree; missing
    there, a placeholder of ``kind`` is made so that it cannot be created."""
    spot = land(path, scope.roots, reason, create=kind if scope.create else None)
    if spot.tree is None:
        return
    if spot.st is None:
        if scope.create:
            raise _refuse(path, "cannot be made in advance (a '..' after a missing folder)",
                          reason)
        yield Finding(spot.path, "protect", kind, reason, origin="planned")
        return
    if not (stat.S_ISREG(spot.st.st_mode) or stat.S_ISDIR(spot.st.st_mode)):
        raise _refuse(spot.path, f"is a {fsops.kind_of(spot.st.st_mode)}", reason)
    if stat.S_ISREG(spot.st.st_mode) and spot.st.st_nlink > 1:
        raise _refuse(spot.path, f"has {spot.st.st_nlink} hard links",
                      "its other names would stay writable")
    kind = "dir" if stat.S_ISDIR(spot.st.st_mode) else "file"
    origin = "placeholder" if spot.made and kind == "file" else ""
    yield Finding(spot.path, "protect", kind, reason, origin=origin)
    if kind == "dir" and spot.tree is not None:
        yield from _hook_links(scope, spot.tree, spot.rel)


def _config_bytes(spot: Landing, tool: str) -> bytes | None:
    """The bytes of one config file; None where there is none, or where the user whose
    ``tool`` reads it cannot read it (read with that user's rights, see audit and agent:
    review 31 had root quote a root-only file a user's config included): what that tool
    cannot read, it obeys nothing of.  Refuses what is not a plain file, or too large."""
    if spot.st is None:
        return None
    if not stat.S_ISREG(spot.st.st_mode):
        raise _refuse(spot.path, f"is a {fsops.kind_of(spot.st.st_mode)}, not a file",
                      f"{tool} reads it as configuration")
    try:
        data = spot.tree.read(spot.rel, CONFIG_CAP) if spot.tree is not None else \
            fsops.read_file(spot.path, CONFIG_CAP)
    except OSError as e:
        if e.errno == errno.EACCES:
            return None
        if e.errno != errno.EFBIG:
            raise
        raise _refuse(spot.path, f"is larger than {CONFIG_CAP} bytes",
                      f"corral reads all of a {tool} config before it trusts any of it"
                      ) from None
    return data or b""


def _config(spot: Landing) -> list[tuple[str, str | None]]:
    """The entries of one config file (not following includes); refuses what git would."""
    data = _config_bytes(spot, "git")
    try:
        return gitconfig.parse(data) if data is not None else []
    except gitconfig.ConfigError as e:
        raise _refuse(spot.path, f"cannot be read as git reads it ({e})",
                      "corral cannot tell what git would obey in it") from None


def gather(scope: Scope, path: str, depth: int = 0
           ) -> tuple[list[tuple[str, str | None]], list[Finding]]:
    """The entries of the config file ``path`` with its includes inlined, as git reads
    them, and a read-only finding for each included file in a writable tree.  An include
    condition is never evaluated (protect more): each might apply."""
    spot = land(path, scope.roots, "a git config")
    entries: list[tuple[str, str | None]] = []
    found: list[Finding] = []
    for name, value in _config(spot):
        entries.append((name, value))
        section, sub, key = gitconfig.split_name(name)
        included = key == "path" and (name == "include.path" or (section == "includeif"
                                                                 and sub is not None))
        if not included or not value or depth + 1 >= gitconfig.MAX_INCLUDE_DEPTH:
            continue
        target = gitconfig.expand(value, scope.home)
        if target is None:
            continue  # relative to git's own installation: never in a writable tree
        # Relative to the folder of the file as git opened it, not of what a link there
        # lands on (review 31: ~/.gitconfig a link into a dotfiles project, including
        # .gitconfig.local: git reads ~/.gitconfig.local)
        target = os.path.join(os.path.dirname(path), target)
        found += _protect(scope, target, "included by a git config", "file")
        more, deeper = gather(scope, target, depth + 1)
        entries += more
        found += deeper
    return entries, found


def _named(scope: Scope, entries: list[tuple[str, str | None]], worktree: str,
           starts: list[str] | None = None) -> Iterator[Finding]:
    """The hook folder and what the commands of a config name, resolved as git resolves
    them: relative to ``worktree``, where git runs them, or to each of ``starts``."""
    for key in gitconfig.HOOK_FOLDERS:  # core.hooksPath; init.templateDir's hooks get copied
        last = gitconfig.last(entries, key)
        path = gitconfig.expand(last, scope.home) if last else None
        if path is not None:
            yield from _protect(scope, os.path.join(worktree, path),
                                f"a folder of hooks git's config names ({key})", "dir")
    for name, text in gitconfig.commands(entries):
        yield from _command(scope, name, text, starts or [worktree])


def _command(scope: Scope, name: str, text: str, starts: list[str], tool: str = "git"
             ) -> Iterator[Finding]:
    """What one command a tool runs on the host names, from each folder in ``starts``.

    Every word, read as the shell reads it (reviews 31 to 35: a script an interpreter
    runs, `f''sm`, `fs\\m`, `cd && sh x/fsm`, `sh fsm.sh` in the repository's top).  An
    alias runs only when the user calls it, as the project's own scripts do: only its
    words written as paths count, and nothing refuses."""
    alias = name.startswith("alias.")
    reach = shellread.read(text, scope.home)
    for start in starts:
        for path, role, written in reach.paths:
            if written or not alias:
                yield from _reached(scope, name, os.path.join(start, path), role, alias,
                                    tool)
    if reach.unknown and not alias:
        _cannot_follow(scope, name, text, reach, starts, tool)


def hg_gather(scope: Scope, path: str, depth: int = 0
              ) -> tuple[list[tuple[str, str, str | None]], list[Finding]]:
    """The entries of the hg config file ``path``, its ``%include``s read in place, and
    a read-only finding for each included file in a writable tree."""
    spot = land(path, scope.roots, "an hg config")
    data = _config_bytes(spot, "hg")
    try:
        lines = hgrc.parse(data) if data is not None else []
    except hgrc.ConfigError as e:
        raise _refuse(spot.path, f"cannot be read as hg reads it ({e})",
                      "corral cannot tell what hg would obey in it") from None
    entries: list[tuple[str, str, str | None]] = []
    found: list[Finding] = []
    for section, key, value in lines:
        if section != "%include":
            entries.append((section, key, value))
        elif depth + 1 < gitconfig.MAX_INCLUDE_DEPTH:
            target = hgrc.included(key, path, scope.home)
            found += _protect(scope, target, "included by an hg config", "file")
            more, deeper = hg_gather(scope, target, depth + 1)
            entries += more
            found += deeper
    return entries, found


def hg_repository(scope: Scope, hgdir: str) -> Iterator[Finding]:
    """What the hg repository ``hgdir`` (its ``.hg``) reads and runs names in a writable
    tree: its config (``hgrc``, ``hgrc-not-shared``; a share's, the source repository's
    ``hgrc`` too, review 36: hg reads it and runs its hooks from the share's root), what
    they include, and, with the user's global configs (``scope.hg``, review 36: a
    repository with no hgrc of its own), the files its hooks, tools and extensions run,
    resolved against the repository's root, where hg runs its hooks."""
    configs = [os.path.join(hgdir, "hgrc"), os.path.join(hgdir, "hgrc-not-shared")]
    spot = land(os.path.join(hgdir, "sharedpath"), scope.roots, "an hg share's source")
    data = _config_bytes(spot, "hg")
    if data:
        source = data.decode(errors="surrogateescape").strip()
        configs.insert(0, os.path.join(hgdir, source, "hgrc"))
    entries: list[tuple[str, str, str | None]] = []
    for config in configs:
        more, found = hg_gather(scope, config)
        entries += more
        yield from found
    yield from _hg_commands(scope, [*scope.hg, *entries], [os.path.dirname(hgdir)])


def _hg_commands(scope: Scope, entries: list[tuple[str, str, str | None]],
                 starts: list[str]) -> Iterator[Finding]:
    for name, kind, text in hgrc.commands(entries):
        if kind == "shell":
            yield from _command(scope, name, text, starts, "hg")
            continue
        path = hgrc.expand(text, scope.home)  # Python hg loads: a file, or a package
        if name.startswith("extensions.") and not os.path.isabs(path):
            # hg takes it relative to the folder it runs in, any folder (review 36)
            _cannot_follow(scope, name, text, shellread.Reach(
                (), "an extension's path relative to the folder hg runs in"), starts, "hg")
            continue
        for start in starts:
            yield from _protect(scope, os.path.join(start, path),
                                f"Python hg loads ({name})", "file")


def hg_global(scope: Scope) -> tuple[tuple[tuple[str, str, str | None], ...], list[Finding]]:
    """The entries of the user's global hg configs, what they include in the writable
    trees, and what their commands name from where the user may run hg outside any
    repository (the home, the writable trees' tops)."""
    paths = [*hgrc.GLOBAL_CONFIGS]
    with small.suppress(OSError):
        paths += sorted(os.path.join("/etc/mercurial/hgrc.d", n)
                        for n in os.listdir("/etc/mercurial/hgrc.d") if n.endswith(".rc"))
    if os.environ.get("HGRCPATH") is not None:
        paths = [p for p in os.environ["HGRCPATH"].split(os.pathsep) if p]
    entries: list[tuple[str, str, str | None]] = []
    found: list[Finding] = []
    for raw in paths:
        path = hgrc.expand(raw, scope.home)
        if not os.path.isabs(path):
            continue
        found += _protect(scope, path, "the user's global hg config", "file")
        more, named = hg_gather(scope, path)
        entries += more
        found += named
    found += _hg_commands(scope, entries, _outside(scope))
    return tuple(entries), found


def _reached(scope: Scope, name: str, path: str, role: str, alias: bool, tool: str = "git"
             ) -> Iterator[Finding]:
    """One path a command names: a program is read-only (a placeholder where missing); a
    file among its arguments is read-only, a missing one watched (the audit takes one made
    during the run for a plant); a folder it goes into, or gives a program that runs code,
    refuses the run (a folder an ordinary program is given, black's ``.``, is only read)."""
    if role == "program":
        yield from _protect(scope, path, f"a program {tool} runs ({name})", "file")
        return
    spot = land(path, scope.roots, f"a file {tool}'s {name} names")
    if spot.tree is None:
        return
    folder = spot.st is not None and stat.S_ISDIR(spot.st.st_mode)
    if not alias and (role == "folder" or (folder and role != "operand") or (
            role == "script" and spot.st is not None)):
        what = "a script run by an interpreter that imports from the script's folder" \
            if role == "script" else "a folder a command goes into or runs code from"
        raise UsageError(f"{spot.path} is {what}, in {tool}'s {name}",
                         f"{tool} runs that command on the host, and it may run any file in "
                         "that folder, which the sandbox can write",
                         _advice(tool, name, role == "script"))
    if spot.st is None:
        if not alias:
            yield Finding(spot.path, "watch", "file", f"a file {tool}'s {name} names")
    elif stat.S_ISREG(spot.st.st_mode):
        yield from _protect(scope, spot.path,
                            f"a file a command {tool} runs names ({name})", "file")


def _advice(tool: str, name: str, python: bool) -> str:
    """What the user can change: the command, found where the tool shows it."""
    where = f"`git config --show-origin --get-all {name}`" if tool == "git" else \
        f"`hg config --debug {name}`"
    how = "run Python with -P (3.11 or later) or -I, or the module's own command, so " \
        "that it does not import from that folder" if python else \
        "write it so that it names every file it runs, outside the project if it can"
    return f"{where} shows where it is set: {how}, or leave it out, then start again"


def _cannot_follow(scope: Scope, name: str, text: str, reach: shellread.Reach,
                   starts: list[str], tool: str = "git") -> None:
    """Refuses a command a tool runs by itself that holds what corral cannot follow (a
    glob, a variable the launcher does not set, code given to an interpreter) when that
    may reach a writable tree: which file it runs there, corral cannot tell, so it cannot
    keep it read-only."""
    where = [] if reach.anywhere else [*starts, *(os.path.join(s, p) for s in starts
                                                   for p in reach.prefixes)]
    why = f"where a command {tool} runs starts"
    if where and not any(land(p, scope.roots, why).tree is not None for p in where):
        return
    raise UsageError(f"{tool}'s {name} ({text!r}) holds {reach.unknown}, so corral cannot "
                     "tell which files it runs", f"{tool} runs it on the host, outside the "
                     "sandbox, and it may run a file the sandbox can write",
                     _advice(tool, name, "python" in reach.unknown))


def global_findings(scope: Scope) -> tuple[Scope, list[Finding]]:
    """The user's global git and hg configs read once, for run mode's audit and agent
    mode alike: ``scope`` with their entries, and what they include in the writable trees
    and name by an absolute or ``~`` path (:func:`global_config`, :func:`hg_global`,
    :func:`global_named`).  Called with the user's rights (review 31)."""
    inherited, found = global_config(scope)
    hg, more = hg_global(scope)
    scope = scope._replace(inherited=inherited, hg=hg)
    return scope, [*found, *more, *global_named(scope)]


def global_config(scope: Scope) -> tuple[tuple[tuple[str, str | None], ...], list[Finding]]:
    """The entries of the user's global git config files (includes inlined), and what they
    include inside the writable trees; their programs and hook folder count for every
    repository (see :func:`git_findings`)."""
    entries: list[tuple[str, str | None]] = []
    found: list[Finding] = []
    for raw in global_paths():
        path = gitconfig.expand(raw, scope.home)
        if path is not None:
            # The file itself, when it lands in a writable tree (launched from ~/.config,
            # or ~/.gitconfig a link into a dotfiles project); missing there, a
            # placeholder, so that the agent cannot create the user's global config.
            found += _protect(scope, path, "the user's global git config", "file")
            more, named = gather(scope, path)
            entries += more
            found += named
    return tuple(entries), found


def global_paths() -> list[str]:
    """git's global config files: the usual ones, and those the launcher's environment
    names instead (``GIT_CONFIG_GLOBAL``, ``GIT_CONFIG_SYSTEM``, ``XDG_CONFIG_HOME``: the
    user's git on the host reads them); all are read, to protect more, never less."""
    env, paths = os.environ, list(GLOBAL_CONFIGS)
    for name in ("GIT_CONFIG_SYSTEM", "GIT_CONFIG_GLOBAL"):
        if env.get(name):
            paths.append(os.path.abspath(env[name]))
    if env.get("XDG_CONFIG_HOME"):
        paths.append(os.path.join(os.path.abspath(env["XDG_CONFIG_HOME"]), "git", "config"))
    return paths


def hook_folders(entries: tuple[tuple[str, str | None], ...]) -> tuple[str, ...]:
    """The relative ``core.hooksPath`` of the global config (the last one wins): git
    takes it relative to each repository's work tree, new ones too."""
    last = gitconfig.last(entries, "core.hookspath")
    if not last or last.startswith(("/", "~")):
        return ()
    return (last,)


def gitfile_target(tree: fsops.Tree, rel: str) -> str | None:
    """The git directory a ``.git`` file points at ("gitdir: ..."), as an absolute path
    (not resolved: :func:`locate.land` does that); None when it says no such thing."""
    try:
        head = tree.read(rel, 4096)
    except OSError as e:
        if e.errno != errno.EFBIG:
            raise
        raise _refuse(tree.path(rel), "is larger than a .git file can be",
                      "git reads it to find the repository") from None
    text = (head or b"").decode(errors="surrogateescape")
    if not text.startswith("gitdir:"):
        return None
    target = text[len("gitdir:"):].strip()
    return os.path.join(os.path.dirname(tree.path(rel)), target)
