"""Resolve: turn a Policy, a command and host facts into a concrete :class:`Sandbox`.

This is where corral looks at the host's files (which interpreter ``python3``
is, where its prefix lives, which ``/etc`` files exist) so that the argv
builder can stay pure.  Nothing here starts a process, except resolving a
pyenv shim when its version cannot be read from files.
"""

from __future__ import annotations

import functools
import os
import pwd
import re
import subprocess
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

from . import seccomp
from .bwrap import Mount, Sandbox, run_mounts
from .errors import HostError, UsageError
from .host import HostFacts
from .inner import FS_TRUNCATE, FS_WRITE_FILE
from .policy import Policy, check_path, passed

__all__ = ["Command", "resolve_command", "resolve_run"]

WORKDIR = "/work"
SYSTEM_PATH = ("/usr/local/bin", "/usr/bin", "/bin")
NOBODY = 65534
ALL_WRITE_RIGHTS = (1 << 32) - 1  # the init masks this down to what its kernel handles

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
INTERPRETER = re.compile(r"(python|pypy|node|nodejs|deno|bun|ruby|perl)[\d.]*\Z")


class Command(NamedTuple):
    """The payload's argv with argv[0] as seen inside, and the prefixes it needs."""

    argv: tuple[str, ...]
    prefixes: tuple[str, ...]  # host directories to mount read-only at the same path


def _is_under(path: str, roots: Sequence[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _which(name: str, search: str) -> str | None:
    for d in search.split(os.pathsep):
        if not d or not os.path.isabs(d):
            continue
        candidate = os.path.join(d, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def _pyenv_shim(path: str, name: str, search: str) -> str | None:
    """The interpreter a pyenv shim would run, or None when ``path`` is not a shim."""
    try:
        with open(path, "rb") as f:
            head = f.read(2048).decode(errors="replace")
    except OSError:
        return None
    if not head.startswith("#!") or "pyenv" not in head:
        return None
    match = re.search(r'export PYENV_ROOT="([^"]+)"', head)
    root = match.group(1) if match else os.environ.get("PYENV_ROOT", "")
    for version in _pyenv_versions(root):
        if version == "system":
            shims = os.path.dirname(path)
            rest = os.pathsep.join(d for d in search.split(os.pathsep) if d != shims)
            found = _which(name, rest)
        else:
            candidate = os.path.join(root, "versions", version, "bin", name)
            found = candidate if os.access(candidate, os.X_OK) else None
        if found:
            return found
    try:  # unusual set-ups (plugins, aliases): ask pyenv itself
        out = subprocess.run([os.path.join(root, "libexec", "pyenv"), "which", name],
                             capture_output=True, text=True, timeout=30, check=True)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _pyenv_versions(root: str) -> list[str]:
    if os.environ.get("PYENV_VERSION"):
        return os.environ["PYENV_VERSION"].split(":")
    d = os.getcwd()
    while True:
        for name in (os.path.join(d, ".python-version"), ):
            if os.path.isfile(name):
                return _version_file(name)
        if d == "/":
            break
        d = os.path.dirname(d)
    global_file = os.path.join(root, "version")
    return _version_file(global_file) if os.path.isfile(global_file) else ["system"]


def _version_file(path: str) -> list[str]:
    with open(path) as f:
        words = [w for line in f for w in line.split("#")[0].split()]
    return words or ["system"]


def _prefix_of(executable: str) -> str | None:
    """The installation prefix of an interpreter: the parent of its ``bin`` directory."""
    bindir = os.path.dirname(executable)
    if os.path.basename(bindir) != "bin":
        return None
    return os.path.dirname(bindir)


def _check_prefix(prefix: str, what: str) -> str:
    home = os.path.realpath(os.path.expanduser("~"))
    if prefix in ("/", "") or home == prefix or home.startswith(prefix.rstrip("/") + "/"):
        raise UsageError(
            f"{what} lives in {prefix}, which contains the home directory",
            "mounting it would expose every file there to the sandbox",
            "install the interpreter in its own prefix (pyenv, nvm, /opt) or under /usr",
        )
    return prefix


def which_command(argv: Sequence[str], search: str, base_dir: str | None = None) -> str:
    """argv[0] as the sandbox will exec it: found on ``search`` like a shell would,
    pyenv shims resolved to the real interpreter.  A relative path with a slash is
    left relative (run mode: relative to /work) or joined to ``base_dir``.
    """
    if not argv or not argv[0]:
        raise UsageError("no command given", "corral runs the command after --",
                         "write it like: corral run -- python3 script.py")
    if any("\0" in arg for arg in argv):
        raise UsageError("an argument of the command contains a NUL byte",
                         "the kernel cannot pass NUL inside an argument", "remove it")
    name = argv[0]
    check_path(name if name.startswith("/") else "/" + name, "command")
    if "/" in name and not name.startswith("/"):
        return name if base_dir is None else os.path.join(base_dir, name)
    found = name if name.startswith("/") else _which(name, search)
    if found is None or not os.path.exists(found):
        raise UsageError(f"command {name!r} was not found", "it is not on corral's PATH",
                         "give its full path, or copy it in with --input and run ./NAME")
    shim = _pyenv_shim(found, os.path.basename(found), search)
    return found if shim is None else shim


def resolve_command(argv: Sequence[str], visible: Sequence[str], search: str) -> Command:
    """Find argv[0] the way a shell would, and the read-only prefixes it needs inside.

    ``visible`` are the host directories already mounted at the same path.
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
        prefix = _prefix_of(path)
        if prefix is None or not INTERPRETER.match(os.path.basename(path)):
            raise UsageError(
                f"command {name!r} is {path}, outside the sandbox's read-only base",
                "only /usr and known interpreter prefixes are visible inside",
                f"add --ro {os.path.dirname(path)}, or copy it in with --input",
            )
        prefixes.append(_check_prefix(prefix, f"interpreter {path}"))
    return Command((found, *argv[1:]), tuple(prefixes))


def _venv(path: str) -> tuple[str, str | None]:
    """A virtualenv's directory and the prefix of the Python it was made from."""
    check_path(path, "virtualenv")
    real = os.path.realpath(path)
    cfg = os.path.join(real, "pyvenv.cfg")
    if not os.path.isfile(cfg):
        raise UsageError(f"{path} is not a virtualenv", "it has no pyvenv.cfg",
                         "create it with python3 -m venv, or drop --venv")
    home = None
    with open(cfg) as f:
        for line in f:
            key, _, value = line.partition("=")
            if key.strip() == "home":
                home = os.path.realpath(value.strip())
    return real, _prefix_of(os.path.join(home, "python")) if home else None


@functools.cache  # like host.detect(): the host's layout is read once per process
def _usr_links() -> tuple[tuple[str, str], ...]:
    links = []
    for name in USR_MERGE:
        link = "/" + name
        if os.path.islink(link) and os.path.realpath(link) == "/usr/" + name:
            links.append(("usr/" + name, link))
    return tuple(links)


@functools.cache
def _system_mounts() -> tuple[Mount, ...]:
    return tuple(_find_system_mounts())


def _find_system_mounts() -> Iterator[Mount]:
    for name in USR_MERGE:  # hosts without usr-merge: real /bin, /lib directories
        path = "/" + name
        if os.path.isdir(path) and not os.path.islink(path):
            yield Mount(path, path)
    for path in ETC:
        if os.path.lexists(path):
            yield Mount(path, path, optional=True)


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


@functools.cache  # the installed package does not change under a running process
def init_source() -> bytes:
    with open(os.path.join(os.path.dirname(__file__), "inner.py"), "rb") as f:
        return f.read()


def kernel_layers(policy: Policy, host: HostFacts, uid: int, gid: int,
                  writable: Sequence[str]) -> tuple[dict[str, Any], bytes | None]:
    """The init's config (identity, rlimits, Landlock, the payload's own seccomp
    filter) and bwrap's seccomp program.  Fails closed unless ``--allow no-seccomp``."""
    filters = seccomp.for_policy(policy)
    config = init_config(policy, host, uid, gid, writable)
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


def pty_bound(policy: Policy, host: HostFacts) -> int:
    """How many pseudo-terminals the sandbox gets: the policy's ``ptys`` where bwrap's child
    can mount a devpts of that size (root; a plain user who may make a user namespace),
    else none.  Either way one run cannot take the kernel's whole pool."""
    from .mountns import can_mount_devpts  # ctypes: only runs that want ptys pay for it

    wanted = policy.limits.ptys
    return wanted if wanted and can_mount_devpts(not host.is_root) else 0


def resolve_run(policy: Policy, argv: Sequence[str], host: HostFacts, workspace: str,
                uid: int, gid: int, extra_env: Sequence[tuple[str, str]] = ()) -> Sandbox:
    """The sandbox for ``corral run``: ``workspace`` at /work, everything else read-only."""
    disable_userns = check_host(policy, host)
    base = list(_system_mounts())
    usr_links = _usr_links()
    visible = ["/usr", *(link for _, link in usr_links), *(m.dest for m in base), WORKDIR]
    path = list(SYSTEM_PATH)
    prefixes: list[str] = []
    if not _is_under(host.python, visible):
        prefixes.append(_check_prefix(host.python_prefix, "corral's Python"))
    venv = policy.venv or os.environ.get("VIRTUAL_ENV")
    if venv:
        venv_dir, venv_prefix = _venv(venv)
        prefixes.append(venv_dir)
        if venv_prefix and not _is_under(venv_prefix, visible):
            prefixes.append(_check_prefix(venv_prefix, "the virtualenv's Python"))
        path.insert(0, os.path.join(venv_dir, "bin"))
        extra_env = (("VIRTUAL_ENV", venv_dir), *extra_env)
    for ro in policy.read_only:
        if not os.path.exists(ro):
            raise UsageError(f"read-only path {ro} does not exist", "",
                             "create it or drop it from the policy")
        base.append(Mount(os.path.realpath(ro), ro))
    command = resolve_command(argv, [*visible, *prefixes, *policy.read_only],
                              os.environ.get("PATH", os.defpath))
    prefixes.extend(command.prefixes)
    bindir = os.path.dirname(command.argv[0])
    if command.argv[0].startswith("/") and not _is_under(bindir, (WORKDIR,)):
        path.insert(len(path) - len(SYSTEM_PATH), bindir)  # its siblings (pip, npm) come first
    base.extend(Mount(p, p) for p in dict.fromkeys(prefixes))
    config, program = kernel_layers(policy, host, uid, gid, [WORKDIR])
    ptys = pty_bound(policy, host)
    return Sandbox(
        argv=command.argv,
        init_python=host.python,
        init_source=init_source(),
        init_config=config,
        root_mode=host.is_root,
        uid=uid,
        gid=gid,
        disable_userns=disable_userns,
        mounts=tuple(run_mounts(
            usr_links, base, [Mount(workspace, WORKDIR, writable=True, by_fd=True)],
            _identity_files(uid, gid), policy.limits.tmp_bytes, policy.limits.shm_bytes,
            ptys)),
        env=_environment(policy, path, extra_env),
        chdir=WORKDIR,
        seccomp=program,
        ptys=ptys,
    )
