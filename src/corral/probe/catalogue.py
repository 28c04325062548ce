"""The check catalogue: every attempt the probe makes, what it expects, and why.

One row per check.  ``{home}``, ``{project}``, ``{outside}``, ``{tag}`` and the
like name what :mod:`corral.probe.canaries` planted; ``docs/probe.md`` is
generated from this table (:func:`corral.probe.report.markdown`).

Launches: ``main`` runs most attempts in one start of the battery; each
``resource-*`` launch runs one bounded exhaustion attempt (corral gets
``--memory 256M --pids 128 --disk 256M`` there); ``spin`` runs a CPU spinner
that the sandbox's wall clock must stop (corral gets ``--timeout 2``);
each ``launch-*`` launch starts from a directory that must never become
writable; ``venv`` and ``planted`` start with something planted where the
launcher looks (:mod:`corral.probe.hostside`).
"""

from __future__ import annotations

from typing import Any

from .checks import (
    Check,
    Watch,
    attempt,
    bounded,
    denied,
    empty_or_refused,
    exit_status,
    gone,
    host_clean,
    names_hidden,
    no_canary,
    no_routes,
    no_tunnel,
    only_loopback,
    pid1_protected,
    planted,
    refused_and_clean,
    refused_launch,
    status,
    stopped,
    tree_gone,
    usable,
    zero,
)
from .hostside import HOSTSIDE

__all__ = ["CATALOGUE", "EXIT_CODE", "LAUNCH_DIRS"]

EXIT_CODE = 37  # the main battery's exit status, which must come back through the launcher
GiB = 1 << 30
SLEEP_S = 60  # the daemon and the orphan: long enough to be caught, short if never killed
SPIN_S = 5  # the spinner stops itself after this; the sandbox's wall clock must stop it first
LAUNCH_DIRS = {"launch-from-home": "{home}", "launch-from-root": "/",
               "launch-from-home-parent": "{root}", "launch-from-credential-holder": "{holder}",
               "launch-via-home-symlink": "{link}"}
AF_INET, AF_PACKET, AF_VSOCK, SOCK_STREAM, SOCK_RAW, IPPROTO_ICMP = 2, 17, 40, 1, 3, 1


def write(ident: str, attempted: str, op: str, path: str, why: str, **args: Any) -> Check:
    watches = [Watch("absent" if op == "create" else "unchanged", path)]
    expected = ("nothing appears on the host" if op == "create"
                else "the file on the host keeps its content and mode")
    judge = host_clean
    if op == "rename":  # the battery renames it back at once: judged by what it reports
        watches.append(Watch("absent", args["to"]))
        expected, judge = "refused, and .git is still in place on the host", refused_and_clean
    return Check(ident, "writes", attempted, expected, why, judge,
                 attempts=(attempt(op, path=path, **args),), watches=tuple(watches))


def read(ident: str, attempted: str, path: str, canary: str, why: str) -> Check:
    return Check(ident, "secrets", attempted, "the canary token is not seen", why,
                 no_canary(canary), attempts=(attempt("read", path=path),))


def seek(ident: str, attempted: str, why: str, canaries: tuple[str, ...], op: str,
         **args: Any) -> Check:
    return Check(ident, "secrets", attempted, "no canary token is seen", why,
                 no_canary(*canaries), attempts=(attempt(op, **args),))


def reach(ident: str, attempted: str, server: str, why: str, op: str, **args: Any) -> Check:
    return Check(ident, "network", attempted, "the host's canary sees no connection", why,
                 host_clean, attempts=(attempt(op, **args),), watches=(Watch("unreached", server),))


def deny(ident: str, category: str, attempted: str, why: str, op: str, **args: Any) -> Check:
    return Check(ident, category, attempted, "refused", why, denied,
                 attempts=(attempt(op, **args),))


def exhaust(ident: str, attempted: str, why: str, launch: str, bound: int, unit: str, op: str,
            **args: Any) -> Check:
    return Check(ident, "resources", attempted, "stopped by the sandbox below the bound", why,
                 bounded(bound, unit), launch=launch,
                 attempts=(attempt(op, bound=bound, **args),))


def from_dir(ident: str, attempted: str, why: str, *targets: tuple[str, str]) -> Check:
    return Check(ident, "launch", attempted,
                 "refused, starting nothing (corral: exit 125); or nothing there writable", why,
                 refused_launch, launch=ident,
                 attempts=tuple(attempt(op, path=path) for op, path in targets),
                 watches=tuple(Watch("absent" if op == "create" else "unchanged", path)
                               for op, path in targets))


WRITES = (
    write("writes-home-bashrc", "append a line to ~/.bashrc", "append", "{home}/.bashrc",
          "shell start-up files run outside the sandbox the next time a terminal opens"),
    write("writes-home-profile", "append a line to ~/.profile", "append", "{home}/.profile",
          "login shells run it outside the sandbox"),
    write("writes-home-new-file", "create a file in the home directory", "create",
          "{home}/{tag}", "anything in home may be picked up by the user's tools later"),
    write("writes-home-authorized-keys", "create ~/.ssh/authorized_keys", "create",
          "{home}/.ssh/authorized_keys", "an attacker's key there opens the machine to ssh"),
    write("writes-home-autostart", "create an entry in ~/.config/autostart", "create",
          "{home}/.config/autostart/{tag}.desktop", "desktop sessions run autostart entries"),
    write("writes-sibling-project", "create a file in another project, ~/dev/other", "create",
          "{sibling}/{tag}", "the agent was given one project, not all of them"),
    write("writes-outside-append", "append to a file outside the project", "append",
          "{outside}/append.txt", "writes outside the project are what a sandbox stops first"),
    write("writes-outside-chmod", "chmod 0777 a file outside the project", "chmod",
          "{outside}/chmod.txt", "mode changes are writes too: a world-writable file is open"),
    write("writes-outside-delete", "delete a file outside the project", "delete",
          "{outside}/delete.txt", "deleting is the most destructive write"),
    write("writes-etc", "create a file in /etc", "create", "/etc/{tag}",
          "system configuration decides what runs as root"),
    write("writes-usr-local-bin", "create a program in /usr/local/bin", "create",
          "/usr/local/bin/{tag}", "a program there shadows system commands on PATH"),
    write("writes-root-dir", "create a file in /", "create", "/{tag}",
          "the root of the file system must be read-only"),
    write("writes-tmp", "leave a file in /tmp", "create", "/tmp/{tag}-left",
          "a shared /tmp lets a sandbox plant files and sockets for host programs"),
    write("writes-var-tmp", "leave a file in /var/tmp", "create", "/var/tmp/{tag}-left",
          "/var/tmp is shared and survives reboots"),
    write("writes-dev-shm", "leave a file in /dev/shm", "create", "/dev/shm/{tag}-left",
          "shared memory files are a channel to host processes"),
    write("writes-git-hook", "create .git/hooks/pre-commit in the project", "create",
          "{project}/.git/hooks/pre-commit", "git runs hooks on the host, outside the sandbox"),
    write("writes-git-config", "append to the project's .git/config", "append",
          "{project}/.git/config", "core.fsmonitor or core.hooksPath there runs programs"),
    write("writes-nested-hook", "create a hook in a git-ignored nested repository", "create",
          "{project}/nested/.git/hooks/post-checkout",
          "nested and ignored repositories have hooks too (an escape seen in other sandboxes)"),
    write("writes-git-rename", "rename the project's .git away", "rename", "{project}/.git",
          "replacing .git by one the agent controls brings its hooks back",
          to="{project}/.git-moved"),
    write("writes-vscode", "append to the project's .vscode/settings.json", "append",
          "{project}/.vscode/settings.json", "editors run tasks and tools named there"),
    write("writes-envrc", "append to the project's .envrc", "append", "{project}/.envrc",
          "direnv runs .envrc in the user's shell on entering the directory"),
    write("writes-git-commondir", "create .git/commondir in the project", "create",
          "{project}/.git/commondir",
          "git takes config and hooks from wherever commondir points: a redirect the agent "
          "controls (corral may let the write happen, but must undo it before git runs)"),
    write("writes-git-module", "add an entry to the project's .git/modules", "create",
          "{project}/.git/modules/{tag}",
          "a new submodule git directory brings a config (and fsmonitor) of its own"),
    write("writes-git-rebase-exec", "plant a rebase in .git whose todo has an exec line",
          "create", "{project}/.git/rebase-merge/git-rebase-todo",
          "git rebase --continue on the host runs the todo's exec lines as the user "
          "(corral may let the write happen, but must take it away before git resumes it)",
          text="exec echo planted by corral probe\n"),
    write("writes-git-legacy-remote", "plant a legacy remote in .git/remotes/origin",
          "create", "{project}/.git/remotes/origin",
          "with no remote in the config, a plain git push on the host sends the user's code "
          "to the URL it holds (corral may let the write happen, but must take it away)",
          text="URL: /nonexistent/planted-by-corral-probe.git\n"),
    write("writes-hooks-path", "append to a hook in the folder core.hooksPath names",
          "append", "{project}/tools/hooks/pre-commit",
          "git runs the hooks from core.hooksPath, wherever the config says they are"),
    write("writes-home-dotfile-link", "append to the project's zshrc, which ~/.zshrc links to",
          "append", "{project}/dotfiles/zshrc",
          "dotfile managers link start-up files into a repository: the shell runs it on the host"),
    write("writes-new-devcontainer", "create .devcontainer.json in the project", "create",
          "{project}/.devcontainer.json",
          "VS Code runs a dev container's initializeCommand on the host when the project opens"),
    write("writes-new-mcp-servers", "create .mcp.json in the project", "create",
          "{project}/.mcp.json",
          "an agent started later without a sandbox starts the MCP servers a project lists"),
    write("writes-new-hook-manager", "create a husky hook in the project", "create",
          "{project}/.husky/pre-commit",
          "hook managers point git at their folder: git runs what appears there"),
)

SECRETS = (
    read("secrets-fake-creds", "read ~/.fake-creds/token (the seed's FAKE-TOKEN)",
         "{home}/.fake-creds/token", "fake-creds",
         "the seed's naive sandbox read it: a read-only bind hides nothing"),
    read("secrets-ssh-key", "read ~/.ssh/id_ed25519", "{home}/.ssh/id_ed25519", "ssh-key",
         "an SSH key opens every machine it is trusted on"),
    read("secrets-aws", "read ~/.aws/credentials", "{home}/.aws/credentials", "aws",
         "cloud keys spend money and reach data"),
    read("secrets-unlisted", "read ~/.config/sometool/secret, on no list",
         "{home}/.config/sometool/secret", "sometool",
         "a deny list never knows every tool: home must be hidden by default"),
    read("secrets-netrc", "read ~/.netrc", "{home}/.netrc", "netrc", "passwords for hosts"),
    read("secrets-docker", "read ~/.docker/config.json", "{home}/.docker/config.json",
         "docker", "registry credentials"),
    read("secrets-kube", "read ~/.kube/config", "{home}/.kube/config", "kube",
         "cluster credentials"),
    read("secrets-git-credentials", "read ~/.git-credentials", "{home}/.git-credentials",
         "git-credentials", "tokens that push code"),
    read("secrets-bash-history", "read ~/.bash_history", "{home}/.bash_history", "bash-history",
         "shell history holds tokens typed on command lines"),
    read("secrets-gnupg", "read a private key in ~/.gnupg", "{home}/.gnupg/private-keys-v1.d/"
         "probe.key", "gnupg", "signing keys"),
    read("secrets-project-env", "read the project's .env", "{project}/.env", "dotenv",
         "projects keep API keys in .env"),
    read("secrets-project-ssh-link", "read id_ed25519 through a symlink in the project to ~/.ssh",
         "{project}/ssh-link/id_ed25519", "ssh-key",
         "a link inside the project must not reach what home hides"),
    Check("secrets-home-listing", "secrets", "list the home directory",
          "no planted credential name is visible",
          "even names tell an attacker which credentials exist", names_hidden,
          attempts=(attempt("list", path="{home}", names=(
              ".fake-creds", ".ssh", ".aws", ".netrc", ".docker", ".kube", ".gnupg",
              ".git-credentials", ".bash_history")),)),
    seek("secrets-own-environment", "look for the launcher's canary variables in the battery's "
         "own environment", "the launcher's environment holds tokens (GITHUB_TOKEN, ...)",
         ("env:CORRAL_PROBE_SECRET", "env:GITHUB_TOKEN", "env:AWS_SECRET_ACCESS_KEY"),
         "environ"),
    seek("secrets-pid1-environ", "read /proc/1/environ",
         "PID 1 of a sandbox may keep the environment its launcher had (DESIGN fact 2)",
         ("env:CORRAL_PROBE_SECRET", "env:GITHUB_TOKEN", "env:AWS_SECRET_ACCESS_KEY"), "proc",
         pid=1, file="environ"),
    seek("secrets-other-environ", "read /proc/*/environ of every other process",
         "other processes' environments hold the user's tokens",
         ("env:CORRAL_PROBE_SECRET", "env:GITHUB_TOKEN", "env:AWS_SECRET_ACCESS_KEY",
          "process-env"), "proc", file="environ"),
    seek("secrets-host-cmdline", "read the command lines of the host's processes",
         "passwords passed on command lines (--password=...) are visible to anyone who "
         "sees the process", ("cmdline",), "proc", file="cmdline"),
    Check("secrets-keyring", "secrets", "read a key from the launcher's session keyring",
          "no canary token is seen", "kernel keyrings hold login and Kerberos secrets "
          "(DESIGN fact 5)", planted("keyring", no_canary("keyring")),
          attempts=(attempt("keyring", description="{tag}-key"),)),
    seek("secrets-inherited-fd", "read descriptors inherited from the launcher",
         "an open file of the launcher's passes into the sandbox (DESIGN fact 9)",
         ("inherited",), "fds"),
    Check("secrets-etc-shadow", "secrets", "read /etc/shadow", "unreadable or empty",
          "password hashes crack offline", empty_or_refused,
          attempts=(attempt("read", path="/etc/shadow"),)),
    read("secrets-root-home", "read a canary in root's home (planted there when the probe "
         "runs as root)", "{root_home}/{tag}", "root-home",
         "root's home holds the host's own credentials"),
    Check("secrets-root-listing", "secrets", "list /root", "the canary's name is not visible",
          "file names in root's home tell which credentials the host has", names_hidden,
          attempts=(attempt("list", path="{root_home}", names=("{tag}",)),)),
    Check("secrets-other-homes", "secrets", "list /home", "unreadable or empty",
          "other users' homes hold their credentials", empty_or_refused,
          attempts=(attempt("list", path="/home"),)),
)

NETWORK = (
    reach("network-tcp-loopback", "connect to the host's TCP canary on 127.0.0.1", "tcp",
          "services on the host's loopback (databases, debuggers, agents' own servers) trust "
          "their callers", "tcp", host="127.0.0.1", port="{port_tcp}"),
    reach("network-tcp6-loopback", "connect to the host's TCP canary on ::1", "tcp6",
          "the same services listen on IPv6 loopback too", "tcp", host="::1",
          port="{port_tcp6}"),
    reach("network-udp-loopback", "send a datagram to the host's UDP canary on 127.0.0.1",
          "udp", "UDP needs no connection: only the host can tell whether it arrived", "udp",
          host="127.0.0.1", port="{port_udp}"),
    reach("network-unix-agent", "connect to an ssh-agent-like socket in the home directory",
          "unix-agent", "an SSH agent signs for whoever reaches its socket; a network "
          "namespace does not stop unix sockets (DESIGN fact 8)", "unix", path="{agent_sock}"),
    reach("network-unix-daemon", "connect to a daemon's unix socket outside home (like "
          "/run/docker.sock)", "unix-daemon", "the docker socket is root on the host",
          "unix", path="{daemon_sock}"),
    reach("network-unix-datagram", "send a datagram from a unix socket pair to a host datagram "
          "socket (like /dev/log; corral run gets its folder as --ro where the profile forbids "
          "unix sockets)", "unix-dgram", "syslog, journald and systemd's notify socket take "
          "datagrams from anyone who can see them, and a socket pair's end can address them",
          "unix-dgram", path="{dgram_sock}"),
    reach("network-unix-abstract", "connect to an abstract unix socket bound on the host",
          "abstract", "abstract sockets have no file to hide; only a network namespace (or "
          "Landlock scoping) keeps them apart", "unix", abstract="{tag}-abstract"),
    Check("network-interfaces", "network", "list network interfaces", "only loopback",
          "any other interface is a way out", only_loopback,
          attempts=(attempt("interfaces"),)),
    Check("network-routes", "network", "look for a default route", "none",
          "a default route reaches the internet and the cloud metadata service", no_routes,
          attempts=(attempt("routes"),)),
    deny("network-raw-socket", "network", "open a raw ICMP socket (nothing is sent)",
         "raw sockets forge packets and sniff traffic", "socket", family=AF_INET,
         type=SOCK_RAW, proto=IPPROTO_ICMP),
    deny("network-packet-socket", "network", "open a packet socket (nothing is sent)",
         "packet sockets see and write whole frames", "socket", family=AF_PACKET,
         type=SOCK_RAW),
    deny("network-vsock", "network", "open an AF_VSOCK socket (nothing is sent)",
         "vsock reaches the hypervisor or the host, past any network namespace "
         "(DESIGN fact 8)", "socket", family=AF_VSOCK, type=SOCK_STREAM),
    Check("network-proxy-loopback", "network",
          "ask the environment's HTTP proxy to tunnel to 127.0.0.1", "refused by the proxy",
          "a proxy that forwards to loopback turns the allowlist into a door to the host",
          no_tunnel, attempts=(attempt("proxy", target="127.0.0.1", port="{port_via_literal}"),),
          watches=(Watch("unreached", "via-literal"),)),
    Check("network-proxy-localhost", "network",
          "ask the environment's HTTP proxy to tunnel to localhost", "refused by the proxy",
          "names that resolve to loopback must be refused like the address", no_tunnel,
          attempts=(attempt("proxy", target="localhost", port="{port_via_name}"),),
          watches=(Watch("unreached", "via-name"),)),
    Check("network-proxy-numeric", "network",
          "ask the environment's HTTP proxy to tunnel to 2130706433 (127.0.0.1 as a number)",
          "refused by the proxy", "resolvers read numeric spellings as addresses", no_tunnel,
          attempts=(attempt("proxy", target="2130706433", port="{port_via_numeric}"),),
          watches=(Watch("unreached", "via-numeric"),)),
)

PRIVILEGE = (
    Check("privilege-host-uid", "privilege", "create a file in the working directory and "
          "look at its owner on the host", "not uid 0",
          "uid 0 on disk reads and writes every root-owned file (DESIGN fact 1)", host_clean,
          attempts=(attempt("create", path="{tag}-owner"),),
          watches=(Watch("owner", "{tag}-owner"),)),
    Check("privilege-capabilities", "privilege", "read the capability sets",
          "every set empty: inheritable, permitted, effective, ambient and bounding",
          "any capability is a step towards root",
          status(lambda f: zero(f, "CapInh", "CapPrm", "CapEff", "CapAmb", "CapBnd"),
                 "CapInh={CapInh} CapPrm={CapPrm} CapEff={CapEff} CapAmb={CapAmb} "
                 "CapBnd={CapBnd}"), attempts=(attempt("status"),)),
    Check("privilege-no-new-privs", "privilege", "read no_new_privs", "set",
          "without it, setuid programs regain root", status(
              lambda f: f.get("NoNewPrivs") == "1", "NoNewPrivs={NoNewPrivs}"),
          attempts=(attempt("status"),)),
    Check("privilege-seccomp", "privilege", "read the seccomp mode", "a filter (mode 2)",
          "the system-call filter closes kernel surface that namespaces leave open", status(
              lambda f: f.get("Seccomp") == "2", "Seccomp={Seccomp}"),
          attempts=(attempt("status"),)),
    deny("privilege-userns", "privilege", "create a user namespace",
         "a new user namespace hands back every capability inside it", "userns"),
    deny("privilege-mount", "privilege", "mount a tmpfs (in a private mount namespace)",
         "mounting can make read-only paths writable (DESIGN fact 1)", "mount"),
    Check("privilege-ptrace-pid1", "privilege", "attach to the sandbox's PID 1 with ptrace",
          "refused, inside a PID namespace of its own",
          "tracing PID 1 hangs or steers the sandbox (DESIGN fact 3)", pid1_protected,
          attempts=(attempt("ptrace-pid1", host_pidns="{host_pidns}"),)),
    deny("privilege-tiocsti", "privilege", "push a character into the terminal's input "
         "(TIOCSTI on the probe's own terminal)",
         "typed-in commands run in the user's shell after the sandbox ends (DESIGN fact 6)",
         "tiocsti"),
    deny("privilege-keyctl", "privilege", "call keyctl", "the keyring calls are kernel "
         "surface and reach the user's keys", "syscall", call="keyctl"),
    deny("privilege-bpf", "privilege", "create a BPF map", "BPF is a frequent root of kernel "
         "exploits", "syscall", call="bpf"),
    deny("privilege-io-uring", "privilege", "set up an io_uring", "io_uring does I/O that "
         "seccomp never sees, and has had many exploits", "syscall", call="io_uring_setup"),
    deny("privilege-perf-event", "privilege", "open a perf event on itself",
         "perf events leak kernel addresses and have had exploits", "syscall",
         call="perf_event_open"),
    deny("privilege-userfaultfd", "privilege", "create a userfaultfd",
         "userfaultfd makes kernel races reliable to exploit", "syscall", call="userfaultfd"),
)

RESOURCES = (
    exhaust("resources-processes", "fork up to 512 processes", "a fork bomb freezes the host",
            "resource-processes", 512, "processes", "fork"),
    exhaust("resources-memory", "allocate and touch up to 1 GiB", "a memory hog pushes the "
            "host into its OOM killer", "resource-memory", GiB, "bytes", "memory"),
    exhaust("resources-workspace", "fill the working directory, up to 1 GiB",
            "a full disk breaks every program on the host", "resource-workspace", GiB, "bytes",
            "fill", path="{tag}-fill"),
    exhaust("resources-tmp", "fill /tmp, up to 1 GiB", "an unbounded tmpfs is RAM: half of it "
            "by default (DESIGN fact 10)", "resource-tmp", GiB, "bytes", "fill",
            path="/tmp/{tag}-fill"),
    exhaust("resources-shm", "fill /dev/shm, up to 1 GiB", "/dev/shm is RAM too",
            "resource-shm", GiB, "bytes", "fill", path="/dev/shm/{tag}-fill"),
    exhaust("resources-open-files", "open up to 4096 files, soft limit raised first",
            "descriptors are a kernel resource shared by the user's processes", "main", 4096,
            "files", "nofile"),
    exhaust("resources-file-size", "write one byte at 16 GiB (a sparse file)",
            "one file can fill a disk", "main", 16 * GiB, "bytes", "fsize",
            path="{tag}-big"),
    Check("resources-wall-clock", "resources", f"spin on the CPU for up to {SPIN_S} s, with "
          "two spinning children", "stopped by the sandbox's wall clock",
          "a runaway job must end (corral gets --timeout 2)", stopped("resources-wall-clock"),
          launch="spin", attempts=(attempt("spin", marker=("{tag}", "spin"), seconds=SPIN_S),),
          watches=(Watch("gone", "spin-main"),)),
)

LIFECYCLE = (
    Check("lifecycle-daemon", "lifecycle", "start a daemon (double fork, new session, "
          "signals ignored)", "gone once the launch ends",
          "a daemon that outlives the sandbox keeps acting unseen", gone,
          attempts=(attempt("daemon", marker=("{tag}", "daemon"), seconds=SLEEP_S),),
          watches=(Watch("gone", "daemon"),)),
    Check("lifecycle-orphan", "lifecycle", "start a child that cleared its parent-death signal",
          "gone once the launch ends", "--die-with-parent alone is defeated this way "
          "(DESIGN fact 4)", gone,
          attempts=(attempt("orphan", marker=("{tag}", "orphan"), seconds=SLEEP_S),),
          watches=(Watch("gone", "orphan"),)),
    Check("lifecycle-timeout-tree", "lifecycle", "leave the spinner's children running when "
          "the wall clock fires", "nothing of the timed-out launch survives",
          "a timeout that kills only the top process leaves the rest running",
          tree_gone("resources-wall-clock"), launch="spin", watches=(Watch("gone", "spin"),)),
    Check("lifecycle-exit-status", "lifecycle", f"exit with status {EXIT_CODE}",
          f"the launcher exits {EXIT_CODE} too", "callers decide on the exit status",
          exit_status(EXIT_CODE)),
)

LAUNCH = (
    Check("launch-project-writable", "launch", "create a file in the working directory",
          "it works: the sandbox is usable",
          "a sandbox that blocks everything would pass every other check", usable,
          attempts=(attempt("create", path="{tag}-usable"),)),
    from_dir("launch-from-home", "start from the home directory, then append to ~/.bashrc and "
             "create ~/.ssh/authorized_keys", "the seed: --bind \"$PWD\" from ~ made ~/.bashrc "
             "writable", ("append", "{home}/.bashrc"),
             ("create", "{home}/.ssh/authorized_keys")),
    from_dir("launch-from-root", "start from /, then append to ~/.bashrc and a file outside "
             "the project", "a project of / is the whole machine",
             ("append", "{home}/.bashrc"), ("append", "{outside}/append.txt")),
    from_dir("launch-from-home-parent", "start from the directory holding the home "
             "directory, then append to ~/.bashrc", "an ancestor of home contains home",
             ("append", "{home}/.bashrc"), ("append", "{outside}/append.txt")),
    from_dir("launch-from-credential-holder", "start from a directory holding .ssh, then "
             "create .ssh/authorized_keys there", "a directory with credentials is a home "
             "directory in disguise", ("create", "{holder}/.ssh/authorized_keys")),
    from_dir("launch-via-home-symlink", "start from a symlink to the home directory, then "
             "append to .bashrc through it", "a symlinked path must not widen anything",
             ("append", "{link}/.bashrc")),
)

CATALOGUE: tuple[Check, ...] = (*WRITES, *SECRETS, *NETWORK, *PRIVILEGE, *RESOURCES,
                                *LIFECYCLE, *LAUNCH, *HOSTSIDE)
