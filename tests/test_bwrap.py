"""The argv builder is pure: exact expected lists, no machine involved."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from corral.bwrap import (
    DEV_SEAL,
    ROOT_SEAL,
    Data,
    Mount,
    PathHandle,
    RemountRo,
    Sandbox,
    build_ops,
    command,
    init_config,
    render,
    run_mounts,
)
from corral.host import HostFacts
from corral.launch import Numbering
from corral.record import replace
from corral.resolve import init_shielded

BASE = Sandbox(
    argv=("/usr/bin/python3", "script.py"),
    init_python="/usr/bin/python3.11",
    init_source=b"# init",
    init_config={},
    root_mode=False,
    uid=1000,
    gid=1000,
    disable_userns=True,
    init_shielded=True,
    mounts=tuple(run_mounts(
        usr_links=(("usr/bin", "/bin"), ("usr/lib", "/lib")),
        base=(Mount("/etc/ld.so.cache", "/etc/ld.so.cache", optional=True, copy_perms=0o444),
              Mount("/etc/ssl/certs", "/etc/ssl/certs", optional=True),
              Mount("/opt/py/3.12", "/opt/py/3.12", by_fd=True)),
        writable=(Mount("/runs/1/work", "/work", writable=True, by_fd=True),),
        files=(("/etc/passwd", b"x"),),
        tmp_bytes=1000,
        shm_bytes=500,
    )),
    seal=(DEV_SEAL, ROOT_SEAL),
    env=(("PATH", "/usr/bin"), ("HOME", "/work")),
)


def test_user_mode_argv_is_exact() -> None:
    fds = Numbering(first=10)
    assert render(build_ops(BASE, status_fd=7), fds) == [
        "--unshare-all", "--unshare-user", "--disable-userns", "--cap-drop", "ALL",
        "--new-session", "--hostname", "corral",
        "--ro-bind", "/usr", "/usr",
        "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
        "--proc", "/proc",
        "--perms", "0444", "--ro-bind-data", "10", "/proc/keys",
        "--perms", "0444", "--ro-bind-data", "11", "/proc/key-users",
        "--dev", "/dev",
        "--size", "500", "--perms", "1777", "--tmpfs", "/dev/shm",
        # bwrap's devpts has no max=: covered by an empty, read-only directory (no ptys)
        "--size", "4096", "--perms", "0755", "--tmpfs", "/dev/pts", "--remount-ro", "/dev/pts",
        "--size", "1000", "--perms", "1777", "--tmpfs", "/tmp",
        # /etc: small files copied onto the root tmpfs (no mount each), directories bound
        "--perms", "0755", "--dir", "/etc",
        "--perms", "0444", "--file", "12", "/etc/ld.so.cache",
        "--perms", "0755", "--dir", "/etc/ssl",
        "--ro-bind-try", "/etc/ssl/certs", "/etc/ssl/certs",
        "--perms", "0755", "--dir", "/opt",
        "--perms", "0755", "--dir", "/opt/py",
        # a path the launcher chose (its Python, --ro): by descriptor, no link followed
        "--ro-bind-fd", "13", "/opt/py/3.12",
        "--bind-fd", "14", "/work",
        "--perms", "0444", "--file", "15", "/etc/passwd",
        "--perms", "0755", "--dir", "/run/corral",
        "--perms", "0444", "--ro-bind-data", "16", "/run/corral/init.py",
        "--remount-ro", "/dev",  # bwrap's /dev tmpfs, then
        "--remount-ro", "/",  # the seal: the root tmpfs, copies and all, read-only last
        "--clearenv",  # the payload's variables go to the init's config: init_config()
        "--chdir", "/",
        "--json-status-fd", "7",
    ]


def test_root_mode_keeps_only_what_the_init_needs_to_drop() -> None:
    words = render(build_ops(replace(BASE, root_mode=True, disable_userns=False)), Numbering())
    assert words[:14] == [
        "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
        "--unshare-cgroup-try",
        "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
        "--cap-add", "CAP_SETPCAP", "--new-session",
    ]
    assert "--unshare-user" not in words and "--unshare-all" not in words
    assert "--die-with-parent" not in words  # the init watches the launcher instead


def test_die_with_parent_stays_where_the_payload_can_stop_its_init() -> None:
    """Below Landlock ABI 6 the payload may SIGSTOP its init, which then watches no
    launcher: bwrap's --die-with-parent is the net there (the red team's
    test_a_payload_that_stops_its_init_dies_with_its_launcher)."""
    words = render(build_ops(replace(BASE, init_shielded=False)), Numbering())
    assert words.index("--die-with-parent") < words.index("--new-session")
    host = {abi: cast(HostFacts, SimpleNamespace(landlock_abi=abi)) for abi in (5, 6, 7)}
    scoped = {"landlock": {"rules": [], "scope": True}}
    assert [init_shielded(scoped, host[abi]) for abi in (5, 6, 7)] == [False, True, True]
    assert not init_shielded({"landlock": None}, host[7])  # no Landlock at all
    assert not init_shielded({"landlock": {"rules": [], "scope": False}}, host[7])


def test_no_disable_userns_when_host_cannot() -> None:
    words = render(build_ops(replace(BASE, disable_userns=False)), Numbering())
    assert "--disable-userns" not in words


def test_the_payloads_environment_goes_to_the_init_config_not_to_bwrap() -> None:
    words = render(build_ops(BASE), Numbering())
    assert "--clearenv" in words and "--setenv" not in words
    assert init_config(BASE)["env"] == [["PATH", "/usr/bin"], ["HOME", "/work"]]


def test_writable_mounts_always_go_by_descriptor() -> None:
    mounts = run_mounts((), (), [Mount("/p", "/p", writable=True)], (), 1, 1)
    words = render(mounts, Numbering(first=3))
    assert words[words.index("--bind-fd"):words.index("--bind-fd") + 3] == ["--bind-fd", "5", "/p"]
    assert "--bind" not in words


def test_seccomp_program_is_handed_over_by_descriptor() -> None:
    words = render(build_ops(replace(BASE, seccomp=b"\0" * 8)), Numbering(first=20))
    i = words.index("--seccomp")
    assert words[i + 1].isdigit()


def test_command_runs_the_init_with_its_config_descriptor() -> None:
    assert command(BASE, 9) == ["/usr/bin/python3.11", "-I", "-S", "-B", "/run/corral/init.py",
                                "9", "/usr/bin/python3", "script.py"]


def test_bounded_ptys_come_from_the_devpts_bwraps_child_mounted() -> None:
    """With ``ptys``, /dev/pts is the private namespace's own (bounded) devpts, bound in
    with its devices usable; see corral.mountns."""
    ops = run_mounts((), (), (), (), 1, 1, ptys=16)
    words = render(ops, Numbering())
    i = words.index("--dev")
    assert words[i:i + 2] == ["--dev", "/dev"]
    assert words[words.index("--dev-bind"):][:3] == ["--dev-bind", "/dev/pts", "/dev/pts"]
    assert "/dev/pts" not in words[words.index("--tmpfs"):][:2]


def test_a_generated_etc_file_under_a_callers_mount_is_still_bound_over_it() -> None:
    """``--ro /etc`` (or ``--ro /etc/passwd``) hides the tmpfs: the generated file must
    still cover the host's, so it stays a bind there; elsewhere it is a copy."""
    for ro in ("/etc", "/etc/passwd"):
        ops = run_mounts((), [Mount(ro, ro)], (), [("/etc/passwd", b"x"), ("/opt/f", b"y")],
                         1, 1)
        last = {w[-1]: w[-3] for w in (op.args(Numbering()) for op in ops) if len(w) > 2}
        assert last["/etc/passwd"] == "--ro-bind-data"
        assert last["/opt/f"] == "--ro-bind-data"  # no tmpfs there: always a bind
    words = render(run_mounts((), (), (), [("/etc/passwd", b"x")], 1, 1), Numbering())
    assert words[words.index("/etc/passwd") - 2] == "--file"


def test_copies_need_the_root_sealed_last() -> None:
    """A copy lies on the root tmpfs, writable until ROOT_SEAL: without it, no argv."""
    for seal in ((), (ROOT_SEAL, RemountRo("/x"))):
        with pytest.raises(ValueError):
            build_ops(replace(BASE, seal=seal))
    assert "--remount-ro" in render(build_ops(BASE), Numbering())


def test_copies_only_under_etc() -> None:
    """copy_perms elsewhere (or on a writable mount) is ignored: a bind, as before."""
    ops = run_mounts((), [Mount("/opt/f", "/opt/f", copy_perms=0o444)], (), (), 1, 1)
    assert "--file" not in render(ops, Numbering())


def test_each_use_of_a_handle_gets_a_descriptor_of_its_own(tmp_path: Path) -> None:
    """bwrap closes every descriptor a bind, file or data argument hands it: one handle
    bound twice (a profile's read-only ``~/.gitconfig`` that is a link to a protected file
    in the project) made bwrap fail with "Can't stat fd N".  Each use now has its own: a
    path handle's duplicate (the same file as opened once), data's own memfd."""
    from corral.launch import Handles

    (tmp_path / "f").write_text("x")
    handles = Handles()
    try:
        handle = PathHandle(str(tmp_path / "f"), directory=False, no_links=True)
        a, b = handles.fd(handle), handles.fd(handle)
        assert a != b and os.fstat(a).st_ino == os.fstat(b).st_ino
        data = Data("d", b"content")
        c, d = handles.fd(data), handles.fd(data)
        assert c != d and os.read(c, 100) == b"content" and os.read(d, 100) == b"content"
        assert sorted(handles.all()) == sorted([a, b, c, d])
    finally:
        handles.close()
    for fd in (a, b, c, d):
        with pytest.raises(OSError):
            os.fstat(fd)
