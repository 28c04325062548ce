"""Resolve: turn a Policy, a command and host facts into a concrete :class:`Sandbox`.

This is where corral looks at the host's files (which interpreter ``python3``
is, where its prefix lives, which ``/etc`` files exist) so that the argv
builder can stay pure.  Nothing here starts a process (see :mod:`corral.interp`).
"""

from __future__ import annotations

import os
import pwd
import stat

from . import cinit, fsops, interp, seccomp, small
from .bwrap import DEV_SEAL, ROOT_SEAL, Mount, Sandbox, run_mounts
from .errors import HostError, UsageError
from .host import HostFacts
from .interp import check_prefix, is_interpreter, prefix_of, which_command
from .policy import Policy, passed
from .reach import dir_modes
from .record import NamedTuple

TYPE_CHECKING = False  # typing costs ~3 ms at every start (corral.record says why)
if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence
    from typing import Any

__all__ = ["Command", "resolve_command", "resolve_run"]

WORKDIR = "/work"
SYSTEM_PATH = ("/usr/local/bin", "/usr/bin", "/bin")
NOBODY = 65534
ALL_WRITE_RIGHTS = (1 << 32) - 1  # the init masks this down to what its kernel handles
# Landlock's access rights (include/uapi/linux/landlock.h), the same as inner.py's: that
# module is the Python init, and importing it here cost every run ~1.2 ms for two numbers
# (tests/test_startup.py checks that the two agree).
FS_WRITE_FILE = 1 << 1
FS_TRUNCATE = 1 << 14  # ABI 3

# /etc entries programs need: loader cache, alternatives, certificates, time zone,
# name-service and protocol tables.  Never shadow files, never /etc/ssl/private.
ETC = (
    "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives",
    "/etc/ssl/certs", "/etc/ssl/openssl.cnf", "/etc/ca-certificates",
    "/etc/ca-certificates.conf", "/etc/pki/tls/certs", "/etc/pki/ca-trust",
    "/etc/crypto-policies", "/etc/localtime", "/etc/timezone", "/etc/nsswitch.conf",
    "/etc/protocols", "/etc/services", "/etc/mime.types", "/etc/os-release",
)
USR_MERGE = ("bin", "sbin", "lib", "lib64", "lib32", "libx32")


class Command(NamedTuple):
    """The payload's argv with argv[0] as seen inside, and the prefixes it needs."""

    argv: tuple[str, ...]
    prefixes: tuple[str, ...]  # host directories to mount read-only at the same path


def _is_under(path: str, roots: Sequence[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def resolve_command(argv: Sequence[str], visible: Sequence[str], search: str,
                    writable: Sequence[str] = ()) -> Command:
    """Find argv[0] the way a shell would, and the read-only prefixes it needs inside.

    ``visible`` are the host directories already mounted at the same path; ``writable``
    the trees the payload can write, where no interpreter is ever taken from.
    """
    name = argv[0] if argv else ""
    if name.startswith(WORKDIR + "/"):
        which_command(["/bin/true", *argv[1:]], search)  # the same argument checks
        return Command(tuple(argv), ())
    found = which_command(argv, search)
    if not found.startswith("/"):
        return Command(tuple(argv), ())  # relative to /work, the workspace
    real = os.path.realpath(found)
    prefixes: list[str] = []
    for path in dict.fromkeys((found, real)):
        if _is_under(path, visible) or _is_under(path, prefixes):
            continue
        prefix = prefix_of(path)
        if prefix is None or not is_interpreter(os.path.basename(path)):
            raise UsageError(
                f"command {name!r} is {path}, outside the sandbox's read-only base",
                "only /usr and known interpreter prefixes are visible inside",
                f"add --ro {os.path.dirname(path)}, or copy it in with --input",
            )
        prefixes.append(check_prefix(prefix, f"interpreter {path}", writable,
                                     exe=os.path.basename(path)))
    return Command((found, *argv[1:]), tuple(prefixes))


@small.cache  # like host.detect(): the host's layout is read once per process
def _usr_links() -> tuple[tuple[str, str], ...]:
    links = []
    for name in USR_MERGE:
        link = "/" + name
        if os.path.islink(link) and os.path.realpath(link) == "/usr/" + name:
            links.append(("usr/" + name, link))
    return tuple(links)


@small.cache
def _system_mounts() -> tuple[Mount, ...]:
    return tuple(_find_system_mounts())


def _find_system_mounts() -> Iterator[Mount]:
    for name in USR_MERGE:  # hosts without usr-merge: real /bin, /lib directories
        path = "/" + name
        if os.path.isdir(path) and not os.path.islink(path):
            yield Mount(path, path)
    for path in ETC:
        if os.path.lexists(path):
            yield Mount(path, path, optional=True, copy_perms=_copyable(path))


def _copyable(path: str) -> int | None:
    """The permission bits a copy of ``path`` gets, when it may be copied instead of bound:
    a regular file (after links, as a bind follows them), root's, world-readable, small.
    Anything else is bound, so that no copy shows more than the file does."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    ok = (stat.S_ISREG(st.st_mode) and st.st_uid == 0 and st.st_mode & 0o004
          and st.st_size <= fsops.HOST_FILE_CAP)
    return stat.S_IMODE(st.st_mode) & 0o555 if ok else None


def sandbox_identity(policy: Policy, host: HostFacts, owner: int | None) -> tuple[int, int]:
    """Who the payload runs as.  Started by root: never uid 0 (DESIGN fact 1)."""
    if not host.is_root:
        return os.getuid(), os.getgid()
    if policy.user is not None:
        return parse_user(policy.user)
    if owner is not None and owner != 0:
        entry = _pwd(owner)
        return owner, entry.pw_gid if entry else owner
    try:
        entry = pwd.getpwnam("nobody")
        return entry.pw_uid, entry.pw_gid
    except KeyError:
        return NOBODY, NOBODY


def _pwd(uid: int) -> pwd.struct_passwd | None:
    try:
        return pwd.getpwuid(uid)
    except KeyError:
        return None


def parse_user(text: str) -> tuple[int, int]:
    """``NAME``, ``UID`` or ``UID:GID``; uid 0 is refused."""
    uid_text, _, gid_text = text.partition(":")
    try:
        if uid_text.isdigit():
            uid = int(uid_text)
            entry = _pwd(uid)
            gid = int(gid_text) if gid_text else (entry.pw_gid if entry else uid)
        else:
            entry = pwd.getpwnam(uid_text)
            uid = entry.pw_uid
            gid = int(gid_text) if gid_text else entry.pw_gid
    except (KeyError, ValueError):
        raise UsageError(f"user {text!r} is not known", "it is neither a user name nor UID[:GID]",
                         "give an existing user name or a number like 1000:1000") from None
    if uid == 0 or gid == 0:
        raise UsageError(f"user {text!r} is root", "the payload never runs as uid or gid 0",
                         "pick an unprivileged user") from None
    return uid, gid


def _identity_files(uid: int, gid: int) -> tuple[tuple[str, bytes], ...]:
    passwd = ["root:x:0:0:root:/root:/usr/sbin/nologin",
              f"sandbox:x:{uid}:{gid}:corral sandbox:{WORKDIR}:/bin/sh"]
    group = ["root:x:0:", f"sandbox:x:{gid}:"]
    if uid != NOBODY:
        passwd.append(f"nobody:x:{NOBODY}:{NOBODY}:nobody:/nonexistent:/usr/sbin/nologin")
    if gid != NOBODY:
        group.append(f"nogroup:x:{NOBODY}:")
    hosts = "127.0.0.1\tlocalhost corral\n::1\tlocalhost ip6-localhost ip6-loopback\n"
    return (("/etc/passwd", ("\n".join(passwd) + "\n").encode()),
            ("/etc/group", ("\n".join(group) + "\n").encode()),
            ("/etc/hosts", hosts.encode()),
            ("/etc/hostname", b"corral\n"))


def _environment(policy: Policy, path: list[str], extra: Sequence[tuple[str, str]]
                 ) -> tuple[tuple[str, str], ...]:
    env = {"PATH": ":".join(dict.fromkeys(path)), "HOME": WORKDIR, "LANG": "C.UTF-8",
           "TMPDIR": "/tmp", "PYTHONDONTWRITEBYTECODE": "1"}
    env.update(policy.env)
    env.update(passed(policy.pass_env, os.environ))
    env.update(extra)
    return tuple(env.items())


def check_host(policy: Policy, host: HostFacts) -> bool:
    """Whether bwrap will get --disable-userns; raises when nested userns cannot be stopped."""
    host.require_bwrap()
    if host.is_root:
        # Root mode has no user namespace of its own; seccomp denies new ones.
        if policy.allow.no_seccomp and not policy.allow.nested_userns:
            raise HostError(
                "without seccomp, nothing stops the payload from creating user namespaces",
                "started by root, corral relies on seccomp to deny them",
                "keep seccomp on, or also pass --allow nested-userns",
            )
        return False
    if host.can_disable_userns:
        return True
    if policy.allow.nested_userns:
        return False
    why = ("bwrap is setuid" if host.bwrap_setuid else
           f"bwrap {'.'.join(map(str, host.bwrap_version or ()))} is older than 0.8")
    raise HostError("bwrap cannot stop the payload from creating user namespaces",
                    f"{why}, so --disable-userns is unavailable",
                    "install bubblewrap 0.8 or newer without the setuid bit, or pass "
                    "--allow nested-userns")


@small.cache  # the installed package does not change under a running process
def init_source() -> bytes:
    with open(os.path.join(os.path.dirname(__file__), "inner.py"), "rb") as f:
        return f.read()


def compiled_init(init: str | None = None) -> str | None:
    """The compiled init's path when this run gets it: ``init``, the run's
    corral.cinit.choice() when the caller made it already, else that choice made now."""
    return cinit.BINARY if (init or cinit.choice()) == "c" else None


def init_shielded(config: Mapping[str, Any], host: HostFacts) -> bool:
    """Whether the payload cannot signal (stop, kill) its init: the init applies Landlock's
    signal scope only at ABI 6 and up (inner.py, init.c), and only with Landlock on."""
    landlock = config.get("landlock")
    if not isinstance(landlock, dict):  # none: the init applies no Landlock at all
        return False
    return bool(landlock.get("scope", True)) and host.landlock_abi >= 6


def kernel_layers(policy: Policy, host: HostFacts, uid: int, gid: int,
                  writable: Sequence[str]) -> tuple[dict[str, Any], bytes | None]:
    """The init's config (identity, rlimits, Landlock, the payload's own seccomp
    filter) and bwrap's seccomp program.  Fails closed unless ``--allow no-seccomp``."""
    filters = seccomp.for_policy(policy)
    config = init_config(policy, host, uid, gid, writable)
    if filters is not None:
        config["pid"] = filters.init_pid  # the init checks it: the filter protects this PID
    if filters is not None and filters.payload is not None:
        config["payload_seccomp"] = filters.payload.hex()
    return config, filters.sandbox if filters is not None else None


def init_config(policy: Policy, host: HostFacts, uid: int, gid: int,
                writable: Sequence[str]) -> dict[str, Any]:
    """The JSON the in-sandbox init reads (the launcher adds descriptor numbers)."""
    lim = policy.limits
    nofile = lim.process_nofile  # processes x nofile stays within the run's file budget
    rlimits: dict[str, list[int]] = {"nofile": [nofile, nofile], "core": [0, 0]}
    # The disk limit caps any single file too: the watcher need not catch one big file.
    fsize = min((v for v in (lim.fsize_bytes, lim.disk_bytes) if v is not None), default=None)
    if fsize is not None:
        rlimits["fsize"] = [fsize, fsize]
    if lim.cpu_s is not None:
        seconds = max(1, int(lim.cpu_s + 0.999))
        rlimits["cpu"] = [seconds, seconds + 1]
    rules = [[p, ALL_WRITE_RIGHTS] for p in (*writable, "/tmp", "/dev/shm")]
    rules.append(["/dev", FS_WRITE_FILE | FS_TRUNCATE])
    return {
        "uid": uid if host.is_root else None,
        "gid": gid if host.is_root else None,
        "rlimits": rlimits,
        "landlock": {"rules": rules, "min_abi": 1, "best_effort": policy.allow.no_landlock,
                     "scope": True},
    }


def probe_ptys(policy: Policy, host: HostFacts, init: str | None = None) -> None:
    """Begin learning :func:`pty_bound`'s answer in the background, where the run wants
    ptys (corral.mountns.probe_devpts); ``init`` as for :func:`compiled_init`."""
    if policy.limits.ptys:
        from .mountns import probe_devpts

        probe_devpts(not host.is_root, compiled_init(init))


def pty_bound(policy: Policy, host: HostFacts) -> int:
    """How many pseudo-terminals the sandbox gets: the policy's ``ptys`` where bwrap's child
    can mount a devpts of that size (root; a plain user who may make a user namespace),
    else none.  Either way one run cannot take the kernel's whole pool."""
    from .mountns import can_mount_devpts  # ctypes: only runs that want ptys pay for it

    wanted = policy.limits.ptys
    return wanted if wanted and can_mount_devpts(not host.is_root) else 0


def resolve_run(policy: Policy, argv: Sequence[str], host: HostFacts, workspace: str,
                uid: int, gid: int, extra_env: Sequence[tuple[str, str]] = (),
                init: str | None = None) -> Sandbox:
    """The sandbox for ``corral run``: ``workspace`` at /work, everything else read-only.

    ``init``: the run's corral.cinit.choice(), when the caller made it already."""
    disable_userns = check_host(policy, host)
    base = list(_system_mounts())
    usr_links = _usr_links()
    visible = ["/usr", *(link for _, link in usr_links), *(m.dest for m in base), WORKDIR]
    path = list(SYSTEM_PATH)
    prefixes: list[str] = []
    if not _is_under(host.python, visible):
        prefixes.append(check_prefix(host.python_prefix, "corral's Python",
                                     trusted=[host.python_prefix]))
    venv = policy.venv or os.environ.get("VIRTUAL_ENV")
    if venv:
        venv_dir, venv_prefix = interp.venv(venv, [workspace], [host.python_prefix])
        prefixes.append(venv_dir)
        if venv_prefix and not _is_under(venv_prefix, visible):
            prefixes.append(venv_prefix)
        path.insert(0, os.path.join(venv_dir, "bin"))
        extra_env = (("VIRTUAL_ENV", venv_dir), *extra_env)
    masks: list[tuple[str, str]] = []
    for ro in policy.read_only:
        if not os.path.exists(ro):
            raise UsageError(f"read-only path {ro} does not exist", "",
                             "create it or drop it from the policy")
        real = os.path.realpath(ro)
        base.append(Mount(real, ro, by_fd=True))
        if os.path.isdir(real):
            from . import discover  # the secrets scan: only for a --ro directory

            masks += [(f.path, f.kind) for f in discover.secrets_in(real, shown=ro)]
    command = resolve_command(argv, [*visible, *prefixes, *policy.read_only],
                              os.environ.get("PATH", os.defpath), [workspace])
    prefixes.extend(command.prefixes)
    bindir = os.path.dirname(command.argv[0])
    if command.argv[0].startswith("/") and not _is_under(bindir, (WORKDIR,)):
        path.insert(len(path) - len(SYSTEM_PATH), bindir)  # its siblings (pip, npm) come first
    base.extend(Mount(os.path.realpath(p), p, by_fd=True) for p in dict.fromkeys(prefixes))
    # The launcher chose these (its own Python, the interpreter on its PATH, its --venv
    # and --ro paths): the payload may search (not list) the folders above them, even
    # where its user could not on the host.  Every other folder is no wider than there.
    modes = dir_modes([m.dest for m in base], uid, gid,
                      traverse=[*prefixes, *policy.read_only])
    config, program = kernel_layers(policy, host, uid, gid, [WORKDIR])
    ptys = pty_bound(policy, host)
    return Sandbox(
        argv=command.argv,
        init_python=host.python,
        init_source=init_source(),
        init_binary=compiled_init(init),
        init_config=config,
        init_shielded=init_shielded(config, host),
        root_mode=host.is_root,
        uid=uid,
        gid=gid,
        disable_userns=disable_userns,
        mounts=tuple(run_mounts(
            usr_links, base, [Mount(workspace, WORKDIR, writable=True, by_fd=True)],
            _identity_files(uid, gid), policy.limits.tmp_bytes, policy.limits.shm_bytes,
            modes, masks, ptys)),
        env=_environment(policy, path, extra_env),
        seal=(DEV_SEAL, ROOT_SEAL),
        chdir=WORKDIR,
        seccomp=program,
        ptys=ptys,
    )
