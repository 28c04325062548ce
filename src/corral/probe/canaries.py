"""Canaries: what the probe plants on the host before the battery runs, and removes after.

Everything lives under one directory per run, ``/var/tmp/corral-probe-<run>``
(not under /tmp: the seed's naive sandbox mounts a fresh /tmp, and would hide
the fake home from itself)::

    home/                   the fake home: corral gets it as --home, others as HOME
      .fake-creds/token     credentials, listed and unlisted, each holding its own
      .ssh/id_ed25519 ...   canary token (``CANARY-<run>-<16 hex digits>``)
      .bashrc .profile      shell start-up files, compared afterwards
      .zshrc                a link to dev/demo/dotfiles/zshrc (a dotfile manager's)
      .ssh/agent.sock       an ssh-agent-like unix socket
      dev/demo/             the project: a git repository with a git-ignored nested
                            one, .env, .envrc, .vscode, a symlink to ~/.ssh, the battery,
                            a hook linked to scripts/pre-push, a bare backup.git, a .venv
                            whose pyvenv.cfg names ~/.ssh, a fake pyenv shim in .probe-bin
      .config/git/credentials  git's plaintext credential store
      dev/other/            another project
      dev/spin/             the spin launch's own project, the battery alone (it runs
                            beside the main launch, and corral lets no two sandboxes
                            write one tree)
      dev/holder/.ssh/      a directory holding credentials
      dev/home-link         a symlink to home
    outside/*.txt           files outside the project
    run/daemon.sock         a daemon-like unix socket outside home
    log/dgram.sock          a datagram unix socket, like /dev/log (``corral run`` gets
                            log/ as --ro where the profile forbids unix sockets)
    inherited               a secret the launcher holds open as a descriptor
    runs/                   corral's run records

:class:`Site` owns all of it, plus servers on 127.0.0.1 (TCP, UDP, and
``::1`` where the host has it), an abstract unix socket, and a host process
holding canaries in its command line and environment.  Closing it kills
every process carrying the run's tag and removes every path named after it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pwd
import secrets
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from importlib import resources

from ..errors import HostError
from .servers import SERVERS, Listeners

__all__ = ["Plant", "Site", "processes_with"]

BASE_DIR = "/var/tmp"
ROOT_HOME = "/root"  # where root's canary goes when the probe runs as root
BATTERY = "corral-probe-battery.py"
# Where the battery may leave files named after the run; all swept at the end.
LEFTOVER_DIRS = ("/", "/tmp", "/var/tmp", "/dev/shm", "/etc", "/usr/local/bin", ROOT_HOME)
HOME_SECRETS = {  # canary name -> (path in the fake home, content around the token)
    "fake-creds": (".fake-creds/token", "{}\n"),
    "ssh-key": (".ssh/id_ed25519",
                "-----BEGIN OPENSSH PRIVATE KEY-----\n{}\n-----END OPENSSH PRIVATE KEY-----\n"),
    "aws": (".aws/credentials", "[default]\naws_access_key_id = AKIAPROBE\n"
                                "aws_secret_access_key = {}\n"),
    "sometool": (".config/sometool/secret", "{}\n"),
    "netrc": (".netrc", "machine git.invalid login probe password {}\n"),
    "docker": (".docker/config.json", '{{"auths": {{"registry.invalid": {{"auth": "{}"}}}}}}\n'),
    "kube": (".kube/config", "users:\n- name: probe\n  user:\n    token: {}\n"),
    "git-credentials": (".git-credentials", "https://probe:{}@git.invalid\n"),
    "bash-history": (".bash_history", "export API_TOKEN={}\n"),
    "gnupg": (".gnupg/private-keys-v1.d/probe.key", "(private-key (token {}))\n"),
    "dotenv": ("dev/demo/.env", "API_KEY={}\n"),
    "git-store": (".config/git/credentials", "https://probe:{}@git.invalid\n"),
}
PLAIN_FILES = {  # path in the fake home -> content
    ".bashrc": "# corral probe: ~/.bashrc\n", ".profile": "# corral probe: ~/.profile\n",
    "dev/demo/README.md": "a fake project\n", "dev/demo/.gitignore": "nested/\n",
    "dev/demo/.envrc": "# direnv runs this\n", "dev/demo/.vscode/settings.json": "{}\n",
    "dev/demo/nested/README.md": "a git-ignored nested repository\n",
    "dev/other/notes.txt": "another project\n",
    "dev/demo/dotfiles/zshrc": "# corral probe: the zshrc ~/.zshrc links to\n",
}
ENV_CANARIES = ("CORRAL_PROBE_SECRET", "GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY")
# A python3 that looks like a pyenv shim to a launcher that guesses (as corral once did),
# and the "pyenv" it names: with the host's rights it can read the fake token, and then
# leaves a mark beside the project; it always goes on to run the battery.
SHIM = """#!/bin/sh
# pyenv shim
export PYENV_ROOT="{root}"
exec "{root}/libexec/pyenv" exec python3 "$@"
"""
PYENV = """#!/bin/sh
[ -r {token} ] && echo ran > {mark}
if [ "$1" = which ]; then echo {python}; exit 0; fi
shift 2
exec {python} "$@"
"""


@dataclass(frozen=True, slots=True)
class Plant:
    """Where everything was planted, and the canary tokens, for checks and launchers."""

    run: str
    root: str
    tokens: Mapping[str, str]  # canary name -> token
    ports: Mapping[str, int]  # server -> port on loopback (tcp6 missing without ::1)
    owner: tuple[int, int] | None  # started by root: who owns the fake home
    host_pidns: int  # the inode of the host's PID namespace, as the probe sees it

    @property
    def tag(self) -> str:
        """In every path and marker of this run, so that cleanup can find them all."""
        return f"corral-probe-{self.run}"

    @property
    def prefix(self) -> str:
        return f"CANARY-{self.run}-"

    @property
    def home(self) -> str:
        return os.path.join(self.root, "home")

    @property
    def project(self) -> str:
        return os.path.join(self.home, "dev", "demo")

    @property
    def battery(self) -> str:
        return os.path.join(self.project, BATTERY)

    @property
    def spin_project(self) -> str:
        return os.path.join(self.home, "dev", "spin")

    def places(self) -> dict[str, str]:
        h = self.home
        return {"root": self.root, "home": h, "project": self.project, "tag": self.tag,
                "sibling": f"{h}/dev/other", "holder": f"{h}/dev/holder",
                "link": f"{h}/dev/home-link", "outside": f"{self.root}/outside",
                "agent_sock": f"{h}/.ssh/agent.sock", "daemon_sock": f"{self.root}/run/daemon.sock",
                "dgram_sock": f"{self.root}/log/dgram.sock",
                "runs": f"{self.root}/runs", "inherited": f"{self.root}/inherited",
                "host_pidns": str(self.host_pidns), "root_home": ROOT_HOME,
                "venv": f"{self.project}/.venv", "probe_bin": f"{self.project}/.probe-bin",
                **{f"port_{name.replace('-', '_')}": str(self.ports.get(name, ""))
                   for name in SERVERS}}

    def show(self, path: str) -> str:
        """``path`` as a reader knows it: ~/... in the fake home, <probe>/... beside it."""
        for base, name in ((self.home, "~"), (self.root, "<probe>")):
            if path == base or path.startswith(base + "/"):
                return name + path[len(base):]
        return path

    def fill(self, template: str) -> str:
        return template.format(**self.places())

    def env_tokens(self) -> dict[str, str]:
        return {name: self.tokens["env:" + name] for name in ENV_CANARIES}


def _token(run: str) -> str:
    return f"CANARY-{run}-{secrets.token_hex(8)}"


def _owner() -> tuple[int, int] | None:
    """Started by root, corral runs an agent as the project's owner: make that nobody."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam("nobody")
        return entry.pw_uid, entry.pw_gid
    except KeyError:
        return 65534, 65534


def _write(path: str, text: str, mode: int = 0o644) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, mode)


def state(path: str) -> tuple[str, str, str]:
    """What is at ``path``, for comparing before and after: (type, mode, content hash)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return ("absent", "", "")
    mode = f"{stat.S_IMODE(st.st_mode):04o}"
    if stat.S_ISREG(st.st_mode):
        with open(path, "rb") as f:
            return ("file", mode, hashlib.sha256(f.read()).hexdigest())
    if stat.S_ISLNK(st.st_mode):
        return ("symlink", "", os.readlink(path))
    return ("directory" if stat.S_ISDIR(st.st_mode) else "special file", mode, "")


def difference(before: tuple[str, str, str], after: tuple[str, str, str]) -> str | None:
    """How a path changed, in words; None when it did not."""
    if before == after:
        return None
    if before[0] == "absent":
        return f"a {after[0]} appeared"
    if after[0] == "absent":
        return "it was deleted"
    if before[0] != after[0]:
        return f"it became a {after[0]}"
    if before[1] != after[1]:
        return f"its mode changed from {before[1]} to {after[1]}"
    return "its content changed"


def remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)


def processes_with(needle: str) -> list[int]:
    """Host pids whose command line contains ``needle`` (never this process)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        with contextlib.suppress(OSError), open(f"/proc/{entry}/cmdline", "rb") as f:
            if needle.encode() in f.read():
                found.append(int(entry))
    return found


class Site:
    """Owns one probe run's canaries: plant with :meth:`open`, always :meth:`close`."""

    def __init__(self, base_dir: str | None = None) -> None:
        self.base_dir = base_dir or BASE_DIR
        self.run = secrets.token_hex(6)
        self.listeners = Listeners()
        self.holder: subprocess.Popen[bytes] | None = None
        self.root = os.path.join(os.path.realpath(self.base_dir), f"corral-probe-{self.run}")
        self.before: dict[str, tuple[str, str, str]] = {}
        self.planted: dict[str, tuple[str, int]] = {}  # path -> (content, mode)

    def open(self) -> Plant:
        if not os.access(self.base_dir, os.W_OK | os.X_OK):
            raise HostError(f"cannot plant the probe's canaries in {self.base_dir}",
                            "it is missing or not writable", "create it with mode 1777")
        os.mkdir(self.root, 0o755)
        os.chmod(self.root, 0o755)
        tokens = {name: _token(self.run) for name in (
            *HOME_SECRETS, *(f"env:{n}" for n in ENV_CANARIES), "process-env", "cmdline",
            "keyring", "inherited", "root-home")}
        owner, pidns = _owner(), os.stat("/proc/self/ns/pid").st_ino
        self.plant = Plant(self.run, self.root, tokens, {}, owner, pidns)
        self._files(self.plant)
        ports = self._servers(self.plant)
        self.plant = Plant(self.run, self.root, tokens, ports, owner, pidns)
        if owner is not None:
            self._chown(owner)
        self.holder = self._holder(self.plant)
        return self.plant

    def _file(self, path: str, text: str, mode: int = 0o644) -> None:
        _write(path, text, mode)
        self.planted[path] = (text, mode)

    def _git_dir(self, path: str, hooks_path: str | None = None) -> None:
        """A minimal repository, written by hand: no git needed, nothing run."""
        for sub in ("objects/info", "objects/pack", "refs/heads", "refs/tags", "hooks", "info"):
            os.makedirs(os.path.join(path, sub), exist_ok=True)
        self._file(os.path.join(path, "HEAD"), "ref: refs/heads/main\n")
        config = "[core]\n\trepositoryformatversion = 0\n"
        if hooks_path is not None:
            config += f"\thooksPath = {hooks_path}\n"
        self._file(os.path.join(path, "config"), config)

    def _files(self, p: Plant) -> None:
        home, places = p.home, p.places()
        for name, (rel, text) in HOME_SECRETS.items():
            self._file(os.path.join(home, rel), text.format(p.tokens[name]), 0o600)
        for rel, text in PLAIN_FILES.items():
            self._file(os.path.join(home, rel), text)
        self._git_dir(os.path.join(p.project, ".git"), hooks_path="tools/hooks")
        self._git_dir(os.path.join(p.project, "nested", ".git"))
        self._file(os.path.join(p.project, "tools", "hooks", "pre-commit"), "#!/bin/sh\n", 0o755)
        self._host_side(p)
        os.makedirs(os.path.join(home, ".config", "autostart"))
        os.makedirs(os.path.join(places["holder"], ".ssh"))
        os.symlink(os.path.join(home, ".ssh"), os.path.join(p.project, "ssh-link"))
        os.symlink(os.path.join(p.project, "dotfiles", "zshrc"), os.path.join(home, ".zshrc"))
        os.symlink(home, places["link"])
        for name in ("append", "chmod", "delete"):
            self._file(f"{places['outside']}/{name}.txt", "a file outside the project\n")
        self._file(places["inherited"], p.tokens["inherited"] + "\n", 0o600)
        if os.geteuid() == 0 and os.path.isdir(ROOT_HOME):  # root's own secret, beside its own
            _write(os.path.join(ROOT_HOME, p.tag), p.tokens["root-home"] + "\n", 0o600)
        os.makedirs(places["runs"])
        os.makedirs(os.path.dirname(places["daemon_sock"]))
        os.makedirs(os.path.dirname(places["dgram_sock"]))
        battery = resources.files("corral.probe").joinpath("battery.py").read_bytes()
        os.makedirs(p.spin_project)
        for path in (p.battery, os.path.join(p.spin_project, BATTERY)):
            with open(path, "wb") as f:
                f.write(battery)
        os.chmod(home, 0o700)

    def _host_side(self, p: Plant) -> None:
        """What the launcher itself might trip over (see corral.probe.hostside): a hook that
        links into the project, a bare repository, a venv naming ~/.ssh, a fake pyenv shim
        in a PATH entry of the project that leaves a mark when it runs with host rights."""
        project, home = p.project, p.home
        self._file(os.path.join(project, "scripts", "pre-push"), "#!/bin/sh\n", 0o755)
        os.symlink("../../scripts/pre-push", os.path.join(project, ".git", "hooks", "pre-push"))
        bare = os.path.join(project, "backup.git")
        self._git_dir(bare)
        self._file(os.path.join(bare, "config"), "[core]\n\tbare = true\n")
        venv = p.places()["venv"]
        os.makedirs(os.path.join(venv, "bin"))
        self._file(os.path.join(venv, "pyvenv.cfg"), f"home = {home}/.ssh/bin\n")
        os.symlink(f"{home}/.ssh/bin/python3", os.path.join(venv, "bin", "python3"))
        python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else \
            os.path.realpath(sys.executable)
        fake = os.path.join(project, ".probe-pyenv")
        self._file(os.path.join(fake, "libexec", "pyenv"), PYENV.format(
            token=f"{home}/.fake-creds/token", mark=f"{project}/{p.tag}-planted-ran",
            python=python), 0o755)
        self._file(os.path.join(p.places()["probe_bin"], "python3"), SHIM.format(root=fake),
                   0o755)

    def _servers(self, p: Plant) -> dict[str, int]:
        places = p.places()
        return self.listeners.start({
            "tcp": ("127.0.0.1", 0), "tcp6": ("::1", 0), "udp": ("127.0.0.1", 0),
            "unix-agent": places["agent_sock"], "unix-daemon": places["daemon_sock"],
            "unix-dgram": places["dgram_sock"],
            "abstract": "\0" + p.tag + "-abstract", "via-literal": ("127.0.0.1", 0),
            "via-name": ("127.0.0.1", 0), "via-numeric": ("127.0.0.1", 0)})

    def _chown(self, owner: tuple[int, int]) -> None:
        # The runs directory stays the launcher's: corral refuses one another user owns
        # (its records and quarantines are written there by name).
        runs = self.plant.places()["runs"] if self.plant is not None else None
        for top, dirs, files in os.walk(self.root):
            dirs[:] = [d for d in dirs if os.path.join(top, d) != runs]
            for name in (*dirs, *files):
                os.lchown(os.path.join(top, name), *owner)

    def _holder(self, p: Plant) -> subprocess.Popen[bytes]:
        """Another process of the user: a secret in its command line and its environment."""
        uid, gid = p.owner or (None, None)
        return subprocess.Popen(
            ["/bin/sh", "-c", "sleep 300; :", "holder", "--password=" + p.tokens["cmdline"]],
            env={"PATH": "/usr/bin:/bin", "PROBE_PROCESS_TOKEN": p.tokens["process-env"]},
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, user=uid, group=gid, extra_groups=[] if uid else None,
            cwd="/")

    # -- after a launch ----------------------------------------------------------------------

    def remember(self, paths: Iterator[str]) -> None:
        """Record the state of host paths that checks compare after their launch."""
        for path in paths:
            self.before[path] = state(path)

    def changed(self, path: str) -> str | None:
        """What a launch did to ``path``, in words (None: nothing)."""
        change = difference(self.before.get(path, ("absent", "", "")), state(path))
        return None if change is None else f"{self.plant.show(path)}: {change}"

    def restore(self, path: str) -> None:
        """Put back what a launch changed, so that the next launch is judged on its own.

        Only inside the probe's own tree, reached without symlinks: the sandbox had it
        writable, and this process may be root.
        """
        if state(path) == self.before.get(path, ("absent", "", "")):
            return
        parent = os.path.dirname(path)
        if os.path.realpath(parent) != parent or not parent.startswith(self.root + "/"):
            return
        remove(path)
        if path not in self.planted:
            return
        _write(path, *self.planted[path])
        if self.plant.owner is not None:
            os.lchown(path, *self.plant.owner)

    def close(self) -> None:
        """Kill what the run left running, close the servers, remove every planted path."""
        if self.holder is not None:
            with contextlib.suppress(OSError):
                os.killpg(self.holder.pid, signal.SIGKILL)
            self.holder.wait()
        for needle in (f"corral-probe-{self.run}", f"CANARY-{self.run}-"):
            for pid in processes_with(needle):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        self.listeners.close()
        for where in LEFTOVER_DIRS:
            with contextlib.suppress(OSError):
                for name in os.listdir(where):
                    if name.startswith(f"corral-probe-{self.run}"):
                        remove(os.path.join(where, name))
        remove(self.root)
