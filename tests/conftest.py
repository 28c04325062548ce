"""Shared test set-up: real bwrap, run as root and as an unprivileged test user.

Under CI=true, a test that needs something this kind of machine has (bwrap,
user namespaces, cgroup v1 controllers, Landlock, libseccomp) fails when it
is missing instead of skipping: see :func:`need`.

The unprivileged user runs corral from a world-readable copy of ``src/``
with the system's ``/usr/bin/python3``: CI clones the project under
``/root``, which other users cannot read.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
# Concurrent test sessions on one machine (several checkouts) each name their own user, so
# that one session taking its user's delegation away never disturbs another.
TEST_USER = os.environ.get("CORRAL_TEST_USER", "corral-test")
CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
SYSTEM_PYTHON = "/usr/bin/python3"
IS_ROOT = os.geteuid() == 0
NOBODY = 65534


def need(condition: bool, reason: str) -> None:
    """Skip when ``condition`` is false, or fail under CI, where it must hold."""
    if condition:
        return
    if CI:
        pytest.fail(f"required on CI but missing: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def bwrap() -> str:
    path = shutil.which("bwrap")
    need(path is not None, "bwrap is not installed")
    assert path is not None
    return path


def _ensure_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(TEST_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--create-home", "--home-dir",
                        f"/home/{TEST_USER}", "--shell", "/bin/sh", TEST_USER], check=True)
        return pwd.getpwnam(TEST_USER)


@pytest.fixture(scope="session")
def shared_tmp() -> Iterator[Path]:
    """A temp tree every identity can traverse; each test gets its own subdirectory."""
    base = Path(tempfile.mkdtemp(prefix="corral-tests-", dir="/tmp"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def readable_src(shared_tmp: Path) -> Path:
    """A copy of corral's source that the unprivileged user can read, with the one library
    corral needs (``idna``) beside it."""
    import idna

    dest = shared_tmp / "src"
    shutil.copytree(SRC / "corral", dest / "corral",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(Path(idna.__file__).parent, dest / "idna",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for p in [dest, *dest.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return dest


@dataclass
class Identity:
    """Who runs corral in a test: root, or the unprivileged test user."""

    name: str  # "root" or "user"
    uid: int
    gid: int
    home: Path
    tmp: Path  # a private directory this identity owns
    src: Path | None = None  # readable copy of corral for the user
    env: dict[str, str] = field(default_factory=dict)

    @property
    def is_root(self) -> bool:
        return self.uid == 0

    def prefix(self) -> list[str]:
        if self.uid == os.geteuid():
            return [sys.executable]
        return ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups",
                "--", SYSTEM_PYTHON]

    def environ(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(self.home),
               "LANG": "C.UTF-8", "CORRAL_RUNS_DIR": str(self.tmp / "runs")}
        if self.uid == os.geteuid():
            env["PATH"] = os.environ.get("PATH", env["PATH"])
        if self.src is not None:
            env["PYTHONPATH"] = str(self.src)
        env.update(self.env)
        env.update(extra or {})
        return env

    def corral(self, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
               input: bytes | None = None, timeout: float = 300
               ) -> subprocess.CompletedProcess[str]:
        """Run the real ``corral`` command line as this identity."""
        return subprocess.run([*self.prefix(), "-m", "corral", *args], env=self.environ(env),
                              cwd=cwd or self.tmp, input=input.decode() if input else None,
                              capture_output=True, text=True, timeout=timeout, check=False)

    def run(self, cmd: Sequence[str], cwd: Path | None = None, env: dict[str, str] | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Any command as this identity (for negative controls such as a naive bwrap)."""
        prefix = [] if self.uid == os.geteuid() else [
            "setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups", "--"]
        return subprocess.run([*prefix, *cmd], env=self.environ(env), cwd=cwd or self.tmp,
                              capture_output=True, text=True, timeout=timeout, check=False)

    def corral_json(self, *args: str, **kwargs: Any) -> dict[str, Any]:
        proc = self.corral("run", "--json", *args, **kwargs)
        assert proc.stdout.strip(), f"no JSON on stdout; stderr: {proc.stderr}"
        data: dict[str, Any] = json.loads(proc.stdout)
        data["_rc"] = proc.returncode
        data["_stderr"] = proc.stderr
        return data

    @property
    def owner(self) -> tuple[int, int]:
        """Who owns what the payload writes: root's payloads run as nobody."""
        return (NOBODY, NOBODY) if self.is_root else (self.uid, self.gid)

    def chown(self, path: Path) -> Path:
        """Hand ``path`` (recursively) to :attr:`owner`, as a reused workspace must be."""
        if os.geteuid() == 0:
            for p in [path, *path.rglob("*")]:
                os.lchown(p, *self.owner)
        return path


def _identity(name: str, shared_tmp: Path, readable_src: Path, request: Any) -> Identity:
    sub = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=shared_tmp))
    if name == "root":
        need(IS_ROOT, "the root variant needs pytest to run as root")
        return Identity("root", 0, 0, Path("/root"), sub)
    if IS_ROOT:
        entry = _ensure_user()
        ident = Identity("user", entry.pw_uid, entry.pw_gid, Path(entry.pw_dir), sub,
                         src=readable_src)
        need(os.access(SYSTEM_PYTHON, os.X_OK), f"{SYSTEM_PYTHON} runs corral as the test user")
        os.chown(sub, entry.pw_uid, entry.pw_gid)
        return ident
    me = pwd.getpwuid(os.getuid())
    return Identity("user", me.pw_uid, me.pw_gid, Path(me.pw_dir), sub)


def _profile_limits_hold() -> str | None:
    """Why the shipped profiles' limits cannot be enforced for this process, or None."""
    from corral import cgroups, host, limits, profiles
    from corral.errors import HostError

    try:
        limits.plan(profiles.load_profile("shell").limits, cgroups.probe(host.detect()), False)
    except HostError as e:
        return str(e)
    return None


@pytest.fixture(scope="session")
def delegation() -> Iterator[None]:
    """Resource limits for the unprivileged user: the documented one-time root step,
    ``corral delegate --user corral-test``, undone at the end if this session made it."""
    if not IS_ROOT:
        why = _profile_limits_hold()
        need(why is None, f"the shipped profiles' limits do not hold for this user: {why}")
        yield
        return
    entry = _ensure_user()
    marker = Path(f"/sys/fs/cgroup/pids/corral/uid-{entry.pw_uid}")
    existed = marker.exists()
    done = subprocess.run([sys.executable, "-m", "corral", "delegate", "--user", TEST_USER],
                          check=False, capture_output=True, text=True)
    need(done.returncode == 0, f"cannot delegate cgroups to {TEST_USER}: {done.stderr.strip()}")
    yield
    if not existed:
        subprocess.run([sys.executable, "-m", "corral", "delegate", "--user", TEST_USER,
                        "--undo"], check=False, capture_output=True)


@pytest.fixture(params=["root", "user"])
def who(request: Any, shared_tmp: Path, readable_src: Path, bwrap: str, delegation: None
        ) -> Iterator[Identity]:
    """Each test that takes ``who`` runs once as root and once as the test user."""
    ident = _identity(request.param, shared_tmp, readable_src, request)
    yield ident
    with contextlib.suppress(OSError):
        shutil.rmtree(ident.tmp)


def raw_bwrap_argv(bwrap: str, args: Sequence[str], cmd: Sequence[str]) -> list[str]:
    """Plain bwrap with a base system and the given extra arguments."""
    base = [bwrap, "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin",
            "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
            "--proc", "/proc", "--dev", "/dev"]
    return [*base, *args, "--", *cmd]


def raw_bwrap(bwrap: str, args: Sequence[str], cmd: Sequence[str], **kwargs: Any
              ) -> subprocess.CompletedProcess[str]:
    """Negative controls: run :func:`raw_bwrap_argv`."""
    return subprocess.run(raw_bwrap_argv(bwrap, args, cmd), capture_output=True, text=True,
                          timeout=120, check=False, **kwargs)


def processes_with(marker: str) -> list[int]:
    """Host pids whose command line contains ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(entry))
        except OSError:
            continue
    return [p for p in found if p != os.getpid()]


@pytest.fixture
def root(shared_tmp: Path, readable_src: Path, bwrap: str) -> Iterator[Identity]:
    """For tests about what corral does when started by root (and only then)."""
    ident = _identity("root", shared_tmp, readable_src, None)
    yield ident
    with contextlib.suppress(OSError):
        shutil.rmtree(ident.tmp)


# The real agents (tests/agents) are their own suite, 'make test-agents': they need the
# agents installed from their registries first (scripts/install-agents).
collect_ignore = [] if os.environ.get("CORRAL_TEST_AGENTS") else ["agents"]

# The agent-mode lab (a fake home and project) and the layers script are fixtures for
# several test files; each is defined beside its helpers and registered here, after
# everything it imports from us.
from agent_lab import lab  # noqa: E402,F401
from layer_tools import layers  # noqa: E402,F401
