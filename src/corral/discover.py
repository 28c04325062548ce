"""Discovery: what must stay read-only or hidden inside the writable trees of an agent.

:func:`scan` walks a writable tree (the project, an agent's state folder)
and finds, at any depth, in nested and git-ignored repositories too:

* what the host later runs or trusts: git directories and what git obeys
  (see :mod:`corral.repos`), shell start-up files, editor, agent and
  hook-manager configuration: kept read-only;
* secret-looking files and folders: made to appear empty.

Every directory between a writable tree's top and a protected or hidden path
is pinned too (bound onto itself, so that ``rename(2)`` of it fails with
EBUSY): renaming a parent would otherwise put something unprotected where the
protected path was (``mv lib lib.orig; git init lib``).  A pin inside a
read-only path is not needed (nothing there can be renamed) and not made.

It fails closed: an unreadable folder, a tree too large to finish, a
protected or secret name that is a symbolic link, a FIFO or device, or has
other hard links (the other name would stay writable or readable) stop the
launch.  Every look goes through :mod:`corral.fsops`, by descriptor: nothing
blocks, nothing is followed.  :func:`verify_unchanged` re-checks every
destination component by component just before launch (bwrap 0.8 follows
symlinks while setting up, DESIGN fact 7) and returns, for corral's init to
check once more inside the sandbox, the device and inode of every one of them
and of each tree's top: with every directory on the way pinned, that is every
component between a tree's top and each re-mount.
"""

from __future__ import annotations

import errno
import fnmatch
import itertools
import os
import stat
from collections.abc import Iterator, Sequence

from . import fsops, repos
from .errors import UsageError
from .fswalk import join, walk
from .guard import PROTECTED_NAMES, Finding, vcs_control
from .locate import land

__all__ = ["MAX_MASKS", "MAX_SCANNED", "PROTECTED_NAMES", "home_links", "scan", "secrets_in",
           "verify_unchanged", "with_parents"]

# Secret-looking names, hidden (an empty read-only file or folder) unless allowed.
SECRET_GLOBS = (".env", ".env.*", ".envrc", "*.pem", "*.key", "*.p12", "*.pfx", "*.jks",
                "*.keystore", "id_rsa", "id_dsa", "id_ecdsa", "id_ed25519", "id_ecdsa_sk",
                "id_ed25519_sk", ".netrc", ".npmrc", ".pypirc", ".git-credentials", ".pgpass")
SECRET_TEMPLATES = (".env.example", ".env.sample", ".env.template", ".env.dist",
                    ".env.defaults")
SECRET_DIRS = frozenset({".ssh", ".aws", ".gnupg", ".kube", ".docker", ".azure",
                         ".password-store"})
# Inside read-only exceptions (a program's folder, --ro): credential files too, by names
# that would be too broad inside a project ("credentials.py" is code there).  Files only:
# a program's folder holds code folders by these names (node_modules/typebox/.../token/).
CREDENTIAL_GLOBS = ("credentials", "credentials.*", ".credentials*", "token", "*.token",
                    "tokens", "tokens.*", "*_token", "*-token", "auth.json", "*.age",
                    "hosts.yml", "*.kdbx")
MAX_SCANNED = 500_000  # entries; past this the scan fails closed
SCAN_CHUNK = 4096  # entries of one directory held at once by the launch scan
MAX_EXCEPTION = 100_000  # entries of one read-only exception checked for secret names
MAX_MASKS = 4_000  # protected, hidden and pinned paths; bwrap and the kernel cap mounts
PARENT = "on the way to a protected path: cannot be renamed or replaced"


def _is_secret(name: str, allowed: Sequence[str]) -> bool:
    if name in SECRET_TEMPLATES or any(fnmatch.fnmatchcase(name, g) for g in allowed):
        return False
    return any(fnmatch.fnmatchcase(name, g) for g in SECRET_GLOBS)


def _refuse(path: str, what: str, why: str) -> UsageError:
    return UsageError(f"{path} {what}, so corral cannot keep it from the agent", why,
                      "inspect it (a previous sandboxed session may have planted it), replace "
                      "it with a plain file or folder, and start again")


def scan(tree: fsops.Tree, scope: repos.Scope, allowed_secrets: Sequence[str] = (),
         extra_protected: Sequence[str] = ()) -> list[Finding]:
    """Every protected, hidden and pinned path beneath the writable tree ``tree``.

    ``scope`` holds all the writable trees of the sandbox.  Fails closed (UsageError)
    when the tree is larger than MAX_SCANNED entries, cannot be read, or holds a name
    corral cannot protect.  Pins of parents are added by :func:`with_parents`.
    """
    protected = PROTECTED_NAMES | set(extra_protected)
    found: list[Finding] = []
    last, is_git = None, False
    try:  # a directory at a time, in parts: the launcher's memory stays one part
        for here, entries in walk(tree, limit=MAX_SCANNED, chunk=SCAN_CHUNK):
            first = here != last
            if first:
                last, is_git = here, _is_repository(tree, here, entries)
            found += _directory(tree, scope, here, entries, protected, allowed_secrets,
                                is_git, first)
    except OSError as e:
        if e.errno == errno.E2BIG:
            raise UsageError(
                f"{tree.root} holds more than {MAX_SCANNED} entries",
                "corral scans every writable tree for secrets, hooks and repositories "
                "and refuses to start when it cannot finish",
                "start the agent in a smaller project directory") from None
        raise UsageError(f"cannot scan {e.filename or tree.root}", e.strerror or str(e),
                         "fix its permissions, or start the agent elsewhere") from None
    return found


def _is_repository(tree: fsops.Tree, here: str, part: list[fsops.Entry]) -> bool:
    """Whether git opens the directory ``here`` as a repository, from the first ``part``
    of its entries when that is all of them, else by its marker names."""
    whole = len(part) < SCAN_CHUNK
    looks = repos.is_git_dir({e.name for e in part}) if whole else \
        repos.holds_git_dir(tree, here)
    return looks and bool(here or repos.valid_head(tree, ""))


def _directory(tree: fsops.Tree, scope: repos.Scope, here: str, entries: list[fsops.Entry],
               protected: frozenset[str] | set[str], allowed: Sequence[str],
               is_git: bool, first: bool) -> list[Finding]:
    """What one part of a directory's entries needs; prunes ``entries`` to those to walk
    into.  ``first``: the directory's first part (its own findings are made once)."""
    found: list[Finding] = []
    if is_git:
        # A bare repository, the tree's top too: git opens it as one.  Its folders are
        # walked like any other (all but its submodules' and worktrees', which
        # git_findings covers): looking like a repository must not hide what is beneath.
        if first:
            found += repos.git_findings(scope, tree, here or ".", tree.path(here))
        entries[:] = [e for e in entries if e.name not in repos.NESTED]
    keep = []
    for e in entries:
        rel = join(here, e.name)
        if e.name == ".git":
            found += _dot_git(tree, scope, rel, e.kind)
            continue
        if e.name == ".hg" and e.kind == "dir":  # (an hg repository: see agent)
            found.append(Finding(tree.path(join(rel, "hgrc")), "watch", "file",
                                 "the config of an hg repository"))
        secret = (e.kind == "dir" and e.name in SECRET_DIRS) or _is_secret(e.name, allowed)
        control = e.name in protected or vcs_control(tree.path(rel), e.kind)
        if control or secret:
            found.append(_named(tree, rel, e.kind, control))
            continue
        keep.append(e)
    entries[:] = keep
    return found


def _named(tree: fsops.Tree, rel: str, kind: str, protected: bool) -> Finding:
    path = tree.path(rel)
    if kind == "link":
        raise _refuse(path, "is a symbolic link", "a link there reaches whatever it points "
                      "at, which corral neither protects nor hides")
    if kind not in ("dir", "file"):
        raise _refuse(path, f"is a {kind}", "corral mounts over plain files and folders only")
    st = tree.lstat(rel)
    if st is not None and kind == "file" and st.st_nlink > 1:
        raise _refuse(path, f"has {st.st_nlink} hard links",
                      "its other names would stay writable and readable")
    if kind == "dir":
        _no_hard_links(tree, rel)
    if protected:
        return Finding(path, "protect", kind, "run or trusted by tools on the host")
    return Finding(path, "hide", kind, "looks like a secret")


def _no_hard_links(tree: fsops.Tree, rel: str) -> None:
    """A protected or hidden folder whose files have other names elsewhere is refused: the
    other name would stay writable (or readable).  Fails closed past MAX_EXCEPTION."""
    try:
        for here, entries in walk(tree, rel, limit=MAX_EXCEPTION, stats=True):
            for e in entries:
                if e.kind == "file" and e.st is not None and e.st.st_nlink > 1:
                    raise _refuse(tree.path(join(here, e.name)), f"has {e.st.st_nlink} hard "
                                  "links", "its other names would stay writable and readable")
    except OSError as e:
        raise UsageError(f"cannot check {tree.path(rel)} for hard links",
                         e.strerror or str(e), "make it smaller, or fix its permissions"
                         ) from None


def _dot_git(tree: fsops.Tree, scope: repos.Scope, rel: str, kind: str) -> Iterator[Finding]:
    path = tree.path(rel)
    if kind == "link":
        raise _refuse(path, "is a symbolic link", "git follows it to find hooks and config")
    worktree = os.path.dirname(path)
    if kind == "dir":
        yield from repos.git_findings(scope, tree, rel, worktree)
        return
    if kind != "file":
        raise _refuse(path, f"is a {kind}", "git would open it to find the repository, and "
                      "corral will not")
    # A .git file ("gitdir: ..."): a worktree, a submodule, or --separate-git-dir.
    yield _named(tree, rel, "file", True)._replace(reason="points git at a git directory")
    target = repos.gitfile_target(tree, rel)
    if target is None:
        return
    spot = land(target, scope.roots, "the git directory a .git file names")
    if spot.tree is None and spot.st is not None and stat.S_ISDIR(spot.st.st_mode):
        # Outside the writable trees (a worktree of a repository elsewhere): what its
        # configs name inside them, relative to this work tree, all the same (review 30)
        yield from repos.config_named(scope, spot.path, worktree)
        return
    if spot.tree is None or spot.st is None:
        return
    if not stat.S_ISDIR(spot.st.st_mode):
        raise _refuse(spot.path, "is not a directory", "a .git file names it as a git directory")
    yield from repos.git_findings(scope, spot.tree, spot.rel, worktree, main=False)


# Folders of the home directory whose entries the host runs or reads as configuration,
# and how many levels of each are looked at: a link there into a writable tree (dotfile
# managers such as stow, rcm, dotbot make them) makes its target the host's own.  stow
# links single files where a folder exists already (~/.config/nvim/init.lua,
# ~/.config/systemd/user/x.service); ssh's config holds ProxyCommand, gpg's pinentry-program.
HOME_FOLDERS = (("", 1), (".config", 3), (".local/bin", 1), (".local/share/applications", 1),
                (".ssh", 1), (".gnupg", 1), ("bin", 1),
                # what shells and editors source at start (review 32: Fedora's .bashrc
                # sources ~/.bashrc.d/*; vim, ~/.vim/plugin/*)
                (".bashrc.d", 1), (".profile.d", 1), (".zshrc.d", 1), (".vim", 3),
                (".emacs.d", 2))
MAX_HOME_ENTRIES = 20_000  # entries of one of those folders looked at, all levels together


def home_links(scope: repos.Scope, home: str) -> list[Finding]:
    """Read-only findings for what the home's start-up files and configuration folders
    link to inside the writable trees (``~/.gitconfig -> ~/dotfiles/gitconfig``).  A link
    to a tree's very top is not followed (the whole project would be read-only)."""
    found: list[Finding] = []
    for folder, depth in HOME_FOLDERS:
        for path in _links_below(os.path.join(home, folder) if folder else home, depth,
                                 dot_only=not folder):
            spot = land(path, scope.roots, "a home file that links into the project")
            if spot.tree is None or not spot.rel:
                continue
            kind = "dir" if spot.st is not None and stat.S_ISDIR(spot.st.st_mode) else "file"
            found += repos.protect(scope, path, f"{path} links to it: the host runs or "
                                   "reads it as the user's own", kind)
    return found


def _links_below(top: str, depth: int, dot_only: bool) -> list[str]:
    """The symbolic links in ``top`` and its folders ``depth`` levels down (folders that are
    links are not entered: they are links), at most MAX_HOME_ENTRIES entries looked at."""
    if os.path.islink(top) or not os.path.isdir(top):
        return []  # a folder that is itself a link is an entry of the level above
    links: list[str] = []
    budget = MAX_HOME_ENTRIES
    level = [top]
    for _ in range(depth):
        below: list[str] = []
        for where in level:
            try:
                with os.scandir(where) as it:
                    for e in itertools.islice(it, budget):
                        budget -= 1
                        if dot_only and not e.name.startswith("."):
                            continue
                        if e.is_symlink():
                            links.append(e.path)
                        elif e.is_dir(follow_symlinks=False):
                            below.append(e.path)
            except OSError:
                continue  # the home is not a payload's: what cannot be read, the host cannot
            if budget <= 0:
                return links
        level = below
    return links


def with_parents(findings: Sequence[Finding], scope: repos.Scope) -> list[Finding]:
    """``findings`` (first of each path and action kept) and a pin for every directory
    between a writable tree's top and each of them, outside read-only ones.  Raises when
    that needs more than MAX_MASKS mounts."""
    out: dict[tuple[str, str], Finding] = {}
    hidden = {f.path for f in findings if f.action == "hide"}
    for f in findings:
        if f.action == "protect" and f.path in hidden:
            continue  # hidden is read-only already; a second bind would undo the mask
        out.setdefault((f.path, f.action), f)
    paths = {f.path for f in out.values()}
    read_only = [f.path for f in out.values() if f.action == "protect" and f.kind == "dir"]
    for f in list(out.values()):
        held = scope.roots.find(f.path)
        if held is None:
            continue
        tree, rel = held
        parts = fsops.split(rel)
        for i in range(1, len(parts)):
            parent = tree.path("/".join(parts[:i]))
            if parent in paths or any(_inside(parent, r) for r in read_only):
                continue
            paths.add(parent)
            out[(parent, "pin")] = Finding(parent, "pin", "dir", PARENT)
    if len(out) > MAX_MASKS:
        raise UsageError(f"the writable trees need {len(out)} protected, hidden or pinned paths",
                         f"corral mounts at most {MAX_MASKS}",
                         "start the agent in a smaller project directory")
    return list(out.values())


def secrets_in(path: str, shown: str | None = None) -> list[Finding]:
    """Secret and credential names beneath the read-only folder ``path`` (outside every
    writable tree), to hide there too.  Fails closed past MAX_EXCEPTION entries.

    ``path`` is resolved (no link on the way); ``shown``, when given, is where the
    sandbox sees it (a ``--ro`` path the user named through a link): the findings are
    named there."""
    found = []
    with fsops.Tree(path) as tree:
        try:
            for here, entries in walk(tree, limit=MAX_EXCEPTION):
                keep = []
                for e in entries:
                    secret = (e.name in SECRET_DIRS
                              or any(fnmatch.fnmatchcase(e.name, g) for g in SECRET_GLOBS)
                              or (e.kind == "file" and any(fnmatch.fnmatchcase(e.name, g)
                                                           for g in CREDENTIAL_GLOBS)))
                    if secret and e.kind in ("dir", "file"):
                        at = join(here, e.name)
                        found.append(Finding(tree.path(at) if shown is None else
                                             os.path.join(shown, at), "hide", e.kind,
                                             "a credential inside a read-only exception"))
                    elif e.kind == "dir":
                        keep.append(e)
                entries[:] = keep
        except OSError as e:
            raise UsageError(f"cannot check {path} for credentials", e.strerror or str(e),
                             "name a smaller folder, or fix its permissions") from None
    return found


def _inside(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def verify_unchanged(tree: fsops.Tree, findings: Sequence[Finding]) -> list[list[object]]:
    """Just before launch: every mount destination beneath ``tree`` is reached through real
    directories only (bwrap 0.8 follows symlinks while setting up, DESIGN fact 7), and is
    still the kind of thing it was.

    Returns ``[path, action, dev, ino]`` for the tree's top and each destination, for
    corral's init to check from inside that every mount landed where it should.
    """
    top = os.fstat(tree.fd)
    expected: list[list[object]] = [[tree.root, "pin", top.st_dev, top.st_ino]]
    for f in findings:
        if f.origin == "planned" or not _inside(f.path, tree.root) or f.path == tree.root:
            continue
        try:
            st = tree.components(os.path.relpath(f.path, tree.root))[-1]
        except FileNotFoundError:
            raise UsageError(f"{f.path} disappeared while corral was starting", "",
                             "start again") from None
        except OSError:
            st = None
        if st is None or stat.S_ISLNK(st.st_mode) or stat.S_ISDIR(st.st_mode) != (
                f.kind == "dir"):
            raise UsageError(f"{f.path} changed while corral was starting",
                             "a path component is now a symlink or another kind of file",
                             "stop whatever is changing the project and start again")
        expected.append([f.path, f.action, st.st_dev, st.st_ino])
    return expected
