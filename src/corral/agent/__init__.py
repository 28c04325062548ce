"""Agent mode: a whole coding agent in its project, and ``corral shell`` commands.

The current directory is the project.  Everything else on the host is
read-only; the home directory, other users' homes, ``/run``, ``/tmp`` and
the like appear empty; the project and the agent's own state paths are
writable; inside those, what the host later executes or trusts (git hooks
and config, editor and agent configuration, shell start-up files) stays
read-only and secret-looking files appear empty.

:func:`agent_mounts` orders the filesystem (pure; see :class:`Layout`):

 1. the host's root, read-only
 2. hidden trees (empty tmpfs) and hidden files (empty), from the deny list
 3. ``/proc``, ``/dev``, sized ``/dev/shm``
 4. read-only exceptions inside hidden trees (``~/.gitconfig``, the agent's program)
 5. writable paths by descriptor, parents before children (state, then the project)
 6. inside writable trees: git directories pinned, protected paths read-only,
    secrets emptied; every destination re-checked just before launch
 7. the hidden trees made read-only (they had to be writable to create mount points),
    and bwrap's ``/dev`` (the payload's own tmpfs, started by a plain user)
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Callable, Iterator, Sequence

from .. import discover, fsops, guard, interp, program, repos, resolve, workspace
from ..bwrap import (
    DEV_SEAL,
    BindFd,
    Data,
    Op,
    PathHandle,
    RemountRo,
    RoBind,
    RoData,
    Sandbox,
    Tmpfs,
    kernel_filesystems,
    mask,
    parents,
)
from ..errors import UsageError
from ..guard import Finding
from ..host import HostFacts
from ..locate import Roots
from ..policy import Policy, passed
from ..reach import can_reach, dir_modes
from ..record import NamedTuple
from . import state

__all__ = ["Entry", "Layout", "agent_mounts", "agent_seal", "identity", "profile_for",
           "resolve_agent", "writable_paths"]

# Emptied for every agent: daemons' sockets live under /run; /tmp holds other programs'
# sockets and files; homes hold credentials; removable and network mounts hold anything.
HIDDEN_TREES = ("/run", "/var/run", "/tmp", "/var/tmp", "/home", "/root", "/mnt", "/media",
                "/var/lib/docker", "/var/lib/containers", "/var/run/secrets", "/etc/ssl/private",
                # daemons whose sockets live outside /run: LXD and Incus (their groups are
                # root on the host), libvirt, mail, snaps' own sockets
                "/var/lib/lxd", "/var/lib/incus", "/var/snap/lxd", "/var/lib/libvirt",
                "/var/spool/postfix", "/var/lib/snapd",
                # every run's cgroup, live: a racing sandbox would see another one start
                "/sys/fs/cgroup")
HIDDEN_FILES = ("/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-",
                "/etc/security/opasswd", "/etc/sudoers")
SCRATCH = ("/tmp", "/var/tmp")  # emptied, sized, and left writable
# git's own settings, never its credential store (~/.config/git/credentials)
BASE_READ_ONLY = ("~/.gitconfig", "~/.config/git/config", "~/.config/git/ignore",
                  "~/.config/git/attributes", "~/.gitignore_global")
BASE_PASS_ENV = ("TERM", "COLORTERM", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "NO_COLOR")
AGENT_PROFILES = {"claude": "claude", "codex": "codex", "pi": "pi", "aider": "aider",
                  "gemini": "gemini"}


class Entry(NamedTuple):
    """One line of the layout: a host path, seen at the same path inside."""

    path: str
    access: str  # rw, ro, hidden, pinned
    kind: str  # dir or file
    reason: str
    source: str = ""  # the host path bound there, when it is not ``path`` itself


class Layout(NamedTuple):
    """Everything :func:`agent_mounts` needs, already checked against the host."""

    project: str
    home: str
    hidden_trees: tuple[str, ...]  # existing directories to empty, outermost first
    hidden_files: tuple[str, ...]  # existing files to empty
    read_only: tuple[Entry, ...]  # exceptions under hidden trees
    writable: tuple[Entry, ...]  # state paths and the project
    findings: tuple[Finding, ...]  # inside writable trees (and secrets in read-only ones)
    tmp_bytes: int
    shm_bytes: int
    notes: tuple[str, ...] = ()  # what preparing the agent's state did or skipped
    modes: tuple[tuple[str, int], ...] = ()  # folders bwrap makes, and their modes inside
    hooks: tuple[str, ...] = ()  # the global config's relative core.hooksPath (the audit's)
    ptys: int = 0  # the sandbox's own devpts holds at most this many (0: no ptys)
    watched: tuple[str, ...] = ()  # missing files git's commands name (the audit's)

    def entries(self) -> list[Entry]:
        """The whole layout, for ``--dry-run``: what is writable, read-only, hidden, and why."""
        rows = [Entry("/", "ro", "dir", "the host system, read-only")]
        rows += [Entry(p, "hidden", "dir", "emptied: " + ("your home directory" if p == self.home
                                                          else "credentials, sockets, scratch"))
                 for p in self.hidden_trees]
        rows += [Entry(p, "hidden", "file", "emptied: system secret") for p in self.hidden_files]
        rows += [*self.read_only, *self.writable]
        access = {"protect": "ro", "hide": "hidden", "pin": "pinned"}
        made = {"planned": " (made at launch)", "placeholder": " (an empty placeholder, "
                "removed after the run)", "": ""}
        rows += [Entry(f.path, access[f.action], f.kind, f.reason + made[f.origin])
                 for f in self.findings]
        return rows


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def agent_mounts(layout: Layout) -> list[Op]:
    """The ordered filesystem operations for ``layout`` (see the module docstring)."""
    made: set[str] = set(layout.hidden_trees) | {"/proc", "/dev"}
    modes = dict(layout.modes)
    ops: list[Op] = [RoBind("/", "/")]
    for tree in layout.hidden_trees:
        size = layout.tmp_bytes if tree in SCRATCH else None
        ops.append(Tmpfs(tree, size, 0o1777 if size else modes.get(tree, 0o755)))
    ops += [RoData(Data(path, b""), path, 0o444) for path in layout.hidden_files]
    ops += kernel_filesystems(layout.shm_bytes, layout.ptys)
    for e in layout.read_only:  # by descriptor: see _read_only
        ops.extend(parents(e.path, made, modes))
        made.add(e.path)
        ops.append(BindFd(PathHandle(e.source or e.path, e.kind == "dir", no_links=True),
                          e.path, writable=False))
    for e in sorted(layout.writable, key=lambda e: e.path.count("/")):
        ops.extend(parents(e.path, made, modes))
        made.add(e.path)
        # A tree the run holds (corral.workspace.held) is opened through its lock's
        # descriptor; anything else (a file, corral's copy of the state) as resolved,
        # without following a link (see _read_only).
        ops.append(BindFd(PathHandle(e.source or e.path, e.kind == "dir", no_links=True),
                          e.path, writable=True))
    ops.extend(_finding_ops(layout.findings))
    return ops


def agent_seal(layout: Layout) -> list[Op]:
    """Step 7: the emptied trees made read-only, once corral's init file is in place, and
    bwrap's /dev (see corral.bwrap.DEV_SEAL)."""
    return [*(RemountRo(tree) for tree in reversed(layout.hidden_trees) if tree not in SCRATCH),
            DEV_SEAL]


def _finding_ops(findings: Sequence[Finding]) -> Iterator[Op]:
    # Outer paths first, so that every mount lands on top of its parent's (a read-only
    # .git/modules, then a submodule's git directory pinned writable inside it, then its
    # config read-only); at one depth, pins first.  A pinned git directory is a mount
    # point, so rename(2) of it fails with EBUSY: the agent cannot swap in its own .git.
    for f in sorted(findings, key=lambda f: (f.path.count("/"), f.action != "pin", f.path)):
        if f.action == "pin":
            yield BindFd(PathHandle(f.path, no_links=True), f.path, writable=True)
        elif f.action == "protect":
            yield BindFd(PathHandle(f.path, f.kind == "dir", no_links=True), f.path,
                         writable=False)
        else:
            yield from mask(f.path, f.kind)


def profile_for(argv: Sequence[str]) -> str:
    """The shipped profile for an agent command: claude, codex, pi, aider, gemini or generic."""
    return AGENT_PROFILES.get(os.path.basename(argv[0]) if argv else "", "generic")


def identity(project: str, host: HostFacts, policy: Policy) -> tuple[int, int, str, str]:
    """uid, gid, user name and home of the agent.  Started by root: the project's owner."""
    uid, gid, user, home = _who(project, host, policy)
    if policy.home is not None:
        if not os.path.isdir(policy.home):
            raise UsageError(f"home directory {policy.home} does not exist", "",
                             "create it, or drop --home")
        home = os.path.realpath(policy.home)
    return uid, gid, user, home


def _who(project: str, host: HostFacts, policy: Policy) -> tuple[int, int, str, str]:
    if not host.is_root:
        me = pwd.getpwuid(os.getuid())
        return os.getuid(), os.getgid(), me.pw_name, os.environ.get("HOME") or me.pw_dir
    gid: int | None
    if policy.user is not None:
        uid, gid = resolve.parse_user(policy.user)
    else:
        st = os.stat(project)
        # The agent runs as the owner: no third user's link on the way may choose whose
        # folder, and so whose uid (review 42; corral.workspace.check_way).
        workspace.check_way(project, st.st_uid, f"project {project}", "started by root, "
                            "corral runs the agent as the project's owner", "start corral "
                            "in the folder by a path through its owner's and root's folders "
                            "only, or pass --user")
        if st.st_uid == 0:
            raise UsageError(
                f"project {project} is owned by root",
                "started by root, corral runs the agent as the project's owner, never as root",
                "start corral as a regular user, chown the project, or pass --user",
            )
        uid, gid = st.st_uid, None
    entry: pwd.struct_passwd | None
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        entry = None
    # The owner's own group, never the folder's: a folder's group may be root's (chown
    # user dir leaves it) or one the owner is not even in.
    gid = gid if gid is not None else entry.pw_gid if entry else uid
    if gid == 0:
        raise UsageError(f"the agent would run with group 0 (from {project}'s owner)",
                         "corral never runs an agent with root's group",
                         "give the user another primary group, or pass --user UID:GID")
    if entry is None:
        return uid, gid, f"uid{uid}", "/nonexistent"
    return uid, gid, entry.pw_name, entry.pw_dir


def _expand(path: str, home: str) -> str:
    return os.path.join(home, path[2:]) if path.startswith("~/") else path


def writable_paths(policy: Policy, host: HostFacts, project: str) -> list[str]:
    """Every host path a sandbox of this launch could write, as :func:`resolve_agent` will
    find them (the project, the profile's and ``--rw`` paths with ``~/`` expanded, corral's
    copies of the agent's state and the folders they stand for), resolved; nothing is
    checked or made.  For what must never be read from a place the sandbox can write
    (corral.pending), before the launch's own scan."""
    home = identity(os.path.realpath(project), host, policy)[3]
    paths = [project, *(_expand(p, home).rstrip("/") for p in policy.writable)]
    paths += [p for d in state.plan(policy, home, paths) for p in (d.dest, d.source)]
    return [os.path.realpath(p) for p in paths]


def _same_owner(project: str, uid: int) -> None:
    """The project as held (corral.fsops.open_held) is still the owner's the agent runs as:
    a folder above swapped between the owner's stat and the lock fails here (review 42)."""
    owner = fsops.stat_held(project).st_uid
    if owner != uid:
        raise UsageError(f"project {project} changed while corral started",
                         f"it was uid {uid}'s, the folder now there is uid {owner}'s",
                         "start again, from the folder itself")


def _writable(policy: Policy, home: str, project: str) -> list[Entry]:
    """The project and the paths the profile or ``--rw`` make writable (if they exist)."""
    entries = [Entry(project, "rw", "dir", "the project")]
    for raw in policy.writable:
        path = _expand(raw, home).rstrip("/")
        if not os.path.lexists(path):
            continue
        real = guard.check_writable_root(path, "writable path", home=home) \
            if os.path.isdir(path) else os.path.realpath(path)
        if os.path.islink(path):  # a link a sandbox planted would choose what is writable
            raise UsageError(f"writable path {path} is a symbolic link to {real}",
                             "corral makes the file or folder itself writable, never what a "
                             "link names", f"name {real} instead")
        if os.path.isdir(real):
            entries.append(Entry(path, "rw", "dir", "made writable by the profile or --rw"))
        else:  # bound from where it resolves now, no link followed at the launch
            entries.append(_resolved(Entry(path, "rw", "file",
                                           "made writable by the profile or --rw")))
    return entries


def _check_state_alone(dirs: Sequence[state.StateDir], others: Sequence[str]) -> None:
    """Nothing may be mounted inside corral's copy of the agent's state: bwrap would make
    its mount point there, by path, in a tree the sandbox writes (DESIGN fact 7)."""
    for d in dirs:
        for path in others:
            if _under(path, d.dest):
                raise UsageError(
                    f"{path} is inside {d.dest}, where corral mounts its private copy of "
                    "the agent's state", "nothing is mounted inside that copy",
                    f"run from another directory, drop that path, or use the real folder "
                    f"on purpose with --rw {d.dest}")


def _state_entries(dirs: Sequence[state.StateDir]) -> list[Entry]:
    return [Entry(d.dest, "rw", "dir", f"the agent's state: corral's private copy, {d.source}",
                  os.path.realpath(d.source)) for d in dirs]


def _listed_read_only(policy: Policy, home: str, writable: Sequence[Entry]) -> list[Finding]:
    """Read-only paths the profile lists inside writable trees (an agent's own settings,
    whose hooks and commands run later, outside corral): re-mounted after the trees."""
    found = []
    for raw in (*BASE_READ_ONLY, *policy.read_only):  # git's own files too (~/.config)
        path = _expand(raw, home)
        inside = any(_under(path, e.path) and path != e.path for e in writable)
        if inside and os.path.lexists(path):
            if os.path.islink(path):
                raise UsageError(f"{path} is a symbolic link, so corral cannot keep it "
                                 "read-only", "the profile lists it as read-only",
                                 "replace the link with the file it points at")
            kind = "dir" if os.path.isdir(path) else "file"
            found.append(Finding(path, "protect", kind, "listed read-only by the profile"))
    return found


def _read_only(policy: Policy, home: str, program: Sequence[tuple[str, str]],
               host: HostFacts, hidden: Sequence[str], writable: Sequence[Entry]
               ) -> list[Entry]:
    """Read-only paths outside the writable trees, each with the path it resolves to now
    (``source``, when it differs): the launcher opens that from / without following a
    link, so a link another process swaps in on the way afterwards fails the launch
    instead of choosing what the sandbox sees (a dotfile that is a link still works)."""
    entries = []
    for raw in (*BASE_READ_ONLY, *policy.read_only):
        path = _expand(raw, home)
        if any(_under(path, e.path) for e in writable):
            continue  # inside a writable tree: a finding, mounted after it
        if os.path.lexists(path):
            entries.append(_resolved(Entry(path, "ro", "dir" if os.path.isdir(path) else
                                           "file", "listed read-only by the profile or a flag")))
    entries += [_resolved(Entry(p, "ro", kind, "the agent's program")) for p, kind in program]
    if any(_under(host.python, t) for t in hidden):
        entries.append(_resolved(Entry(host.python_prefix, "ro", "dir",
                                       "corral's Python, for its init")))
    return [e for e in entries if not _shown_as_a_link(e, entries, hidden)]


def _shown_as_a_link(e: Entry, entries: Sequence[Entry], hidden: Sequence[str]) -> bool:
    """A link (``node_modules/.bin/claude``) the sandbox already shows as the link it is,
    inside another read-only folder or outside every emptied tree: nothing to bind (its
    target is an entry of its own).  Bound by descriptor onto that link, bwrap found the
    link, not the file, where it had mounted, and refused ("Race condition binding
    dirfd")."""
    if not e.source or not os.path.islink(e.path):
        return False
    inside = any(o.kind == "dir" and o.path != e.path and _under(e.path, o.path)
                 for o in entries)
    return inside or not any(_under(e.path, t) for t in hidden)


def _resolved(e: Entry) -> Entry:
    real = os.path.realpath(e.path)
    return e if real == e.path else e._replace(source=real)


def _hidden_trees(home: str, policy: Policy, project: str) -> tuple[str, ...]:
    trees = [t for t in (*HIDDEN_TREES, *(_expand(h, home) for h in policy.hidden))
             if os.path.isdir(t) and not os.path.islink(t)]
    if os.path.isdir(home) and not any(_under(home, t) for t in trees):
        trees.append(home)
    # Outermost only: a tree inside another is already empty.  The project may sit inside
    # a hidden tree (~/dev/demo); agent_mounts binds it back afterwards.
    trees = [t for t in trees if not any(_under(t, o) and t != o for o in trees)]
    return tuple(sorted(dict.fromkeys(trees), key=lambda t: t.count("/")))


def _environment(policy: Policy, home: str, user: str, path: str,
                 extra: Sequence[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    env = {"PATH": path, "HOME": home, "USER": user, "LOGNAME": user, "TMPDIR": "/tmp",
           "SHELL": "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh"}
    env.update(passed((*BASE_PASS_ENV, *policy.pass_env), os.environ))
    # A profile's ~/ values name the agent's home (CLAUDE_CONFIG_DIR = "~/.claude").
    env.update((k, _expand(v, home)) for k, v in policy.env)
    env.update(extra)
    return tuple(env.items())


def resolve_agent(policy: Policy, argv: Sequence[str], host: HostFacts, project: str,
                  extra_env: Sequence[tuple[str, str]] = (), *, prepare: bool = False,
                  import_state: bool = False, init: str | None = None,
                  hold: Callable[[Sequence[str], Sequence[str]], object] | None = None
                  ) -> tuple[Sandbox, Layout]:
    """The sandbox for ``corral agent`` or ``corral shell`` in ``project``.

    With ``prepare``, corral's copy of the agent's state is made (and imported into on
    first use or with ``import_state``) and its credentials refreshed; without, nothing
    is created (``--dry-run``).  ``init``: the run's corral.cinit.choice(), when the
    caller made it already.  ``hold`` is given the user's trees the sandbox will write,
    once they are checked and before anything in them is scanned or made, and the paths
    it shows read-only (the caller holds them against other runs: corral.workspace.held).
    """
    disable_userns = resolve.check_host(policy, host)
    # The launcher's own home first, then (started by root) the agent's.
    guard.check_writable_root(project, "project", home=os.path.expanduser("~"))
    uid, gid, user, home = identity(os.path.realpath(project), host, policy)
    project = guard.check_writable_root(project, "project", home=home)
    if host.is_root and not can_reach(project, uid, gid):
        raise UsageError(f"project {project} is in a folder its owner (uid {uid}) cannot reach "
                         "on the host", "the agent runs as that user, and corral gives it no "
                         "more than the host does", "move the project, or open the folders "
                         "above it to that user")
    hidden = _hidden_trees(home, policy, project)
    search = os.environ.get("PATH", os.defpath)
    found = interp.which_command(argv, search, base_dir=project)
    writable = _writable(policy, home, project)
    if hold is not None:  # a writable file is held as a read is: no sandbox writes its folder
        hold([e.path for e in writable if e.kind == "dir"],  # as given: links on the way too
             [*(_expand(p, home) for p in (*BASE_READ_ONLY, *policy.read_only)),
              *(e.path for e in writable if e.kind == "file")])
        if host.is_root and policy.user is None:
            _same_owner(project, uid)
    state.check_apart(home, [e.path for e in writable])
    dirs = state.plan(policy, home, [e.path for e in writable])
    _check_state_alone(dirs, [*(e.path for e in writable),
                              *(_expand(p, home) for p in (*BASE_READ_ONLY, *policy.read_only))])
    if host.is_root:  # bound writable for uid: reached through its and root's folders only
        for d in dirs:
            workspace.check_way(d.source, uid, f"corral's copy of the agent's state "
                                f"{d.source}", "started by root, corral binds it writable "
                                "for the agent's user", "remove the link on the way")
    notes = state.prepare(policy, home, (uid, gid) if host.is_root else None, dirs,
                          import_state) if prepare else []
    # Only the user's own trees are scanned: nothing in corral's copy of the agent's state
    # runs outside corral, and nothing is mounted inside it (no mount point to create).
    owner = (uid, gid) if host.is_root else None
    findings, expected, hooks, watched = _protections(policy, home, writable, owner,
                                                      dry_run=not prepare)
    needs, installs = program.needed(found, hidden, home, uid, gid)
    read_only = _read_only(policy, home, needs, host, hidden, writable)
    for e in read_only:  # an interpreter's installation holds its library, nobody's secrets
        if e.kind == "dir" and e.path not in (*installs, host.python_prefix):
            findings += discover.secrets_in(e.source or e.path, shown=e.path)
    findings = list({(f.path, f.action): f for f in findings}.values())
    all_writable = (*writable, *_state_entries(dirs))
    # Search (not listing) on the way to what the launcher itself chose: corral's Python,
    # which its init runs on, the agent's interpreter, and --ro paths; every other folder
    # bwrap makes is no wider than the agent's user finds it on the host.
    init_prefix = [host.python_prefix] if any(_under(host.python, t) for t in hidden) else []
    modes = dir_modes([*hidden, *(e.path for e in (*read_only, *all_writable))], uid, gid,
                      traverse=[*init_prefix, *installs, *(p for p in policy.read_only
                                                           if not p.startswith("~/"))])
    layout = Layout(
        project=project, home=home, hidden_trees=hidden,
        hidden_files=tuple(f for f in HIDDEN_FILES if os.path.exists(f)),
        read_only=tuple(read_only), writable=all_writable, findings=tuple(findings),
        tmp_bytes=policy.limits.tmp_bytes, shm_bytes=policy.limits.shm_bytes,
        notes=tuple(notes), modes=tuple(modes.items()), hooks=hooks, watched=watched,
        ptys=resolve.pty_bound(policy, host))
    config, seccomp_program = resolve.kernel_layers(policy, host, uid, gid,
                                                    [*(e.path for e in layout.writable),
                                                     "/var/tmp"])
    config["expect_mounts"] = expected
    return Sandbox(
        argv=(found, *argv[1:]),
        init_python=host.python,
        init_source=resolve.init_source(),
        init_binary=resolve.compiled_init(init),
        init_config=config, init_shielded=resolve.init_shielded(config, host),
        root_mode=host.is_root, uid=uid, gid=gid, disable_userns=disable_userns,
        mounts=tuple(agent_mounts(layout)),
        seal=tuple(agent_seal(layout)),
        env=_environment(policy, home, user, search, extra_env),
        chdir=project,
        seccomp=seccomp_program,
        ptys=layout.ptys,
    ), layout


def _protections(policy: Policy, home: str, writable: Sequence[Entry],
                 owner: tuple[int, int] | None, dry_run: bool
                 ) -> tuple[list[Finding], list[list[object]], tuple[str, ...],
                            tuple[str, ...]]:
    """What stays read-only, hidden or pinned inside the writable trees, and what the
    init checks of it from inside (see :mod:`corral.discover`)."""
    roots = Roots([fsops.Tree(e.path, owner) for e in writable if e.kind == "dir"])
    try:
        scope = repos.Scope(roots, home, create=not dry_run)
        with fsops.acting_as(owner):  # the user's files with the user's rights (review 31)
            # global_named: even where no repository is (review 30)
            scope, findings = repos.global_findings(scope)
        for tree in roots.trees:
            findings += discover.scan(tree, scope, policy.allow_secrets, policy.protect)
        # What each hg repository reads and runs names (its hooks run on `hg status`)
        for hgdir in sorted({os.path.dirname(f.path) for f in findings
                             if f.path.endswith("/.hg/hgrc")}):
            findings += repos.hg_repository(scope, hgdir)
        findings += _listed_read_only(policy, home, writable)
        with fsops.acting_as(owner):
            findings += discover.home_links(scope, home)
        # A missing file a command git runs names: nothing to mount, the audit's to watch
        watched = tuple(f.path for f in findings if f.action == "watch")
        findings = discover.with_parents([f for f in findings if f.action != "watch"], scope)
        expected = []
        for tree in roots.trees:  # each finding is checked from its nearest tree
            mine = [f for f in findings if (held := roots.find(f.path)) and held[0] is tree]
            expected += discover.verify_unchanged(tree, mine)
        return findings, expected, repos.hook_folders(scope.inherited), watched
    finally:
        roots.close()


def note_environment(sb: Sandbox) -> str:
    """What ``corral agent`` says on stderr: the names it passed, never their values."""
    names = sorted(name for name, _ in sb.env)
    return "corral: environment for the agent: " + ", ".join(names)
