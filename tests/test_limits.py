"""The pure core of resource limits: plans, limit files, counters, verdicts, the disk measure.

cgroup v2 cannot be exercised for real on this kind of machine (its v2 mount
has no controllers), so its plans and parsing are checked here against the
kernel's documented file formats; ``test_resources.py`` runs the real thing
where a host has it.
"""

from __future__ import annotations

import pytest

from corral import cgroups
from corral.errors import HostError, UsageError
from corral.limits import (
    OVERHEAD_PIDS,
    TCP_SHARE_MAX,
    Access,
    Usage,
    cfs_quota,
    doctor_rows,
    image_size,
    mke2fs_argv,
    parse_proc_cgroup,
    plan,
    requested,
    tcp_share,
    usage,
    v2_delegated_base,
    verdict,
)
from corral.policy import Limits

V1 = Access(1, tuple((c, f"/cg/{c}/corral/uid-0") for c in ("memory", "pids", "cpu", "cpuacct")),
            memsw=True)
V2 = Access(2, tuple((c, "/cg2/corral") for c in ("memory", "pids", "cpu", "cpuacct")),
            swap_max=True)
USER_V1 = Access(1, absent=tuple((c, f"cgroup v1 {c} is not delegated to alice")
                                 for c in ("memory", "pids", "cpu", "cpuacct")),
                 fix="as root, once: corral delegate --user alice")
ALL = Limits(memory_bytes=64 << 20, pids=10, cpus=0.5, cpu_s=3.0)


def test_v1_plan_writes_memory_before_memsw_and_counts_corrals_own_pids() -> None:
    p = plan(ALL, V1, allow_unenforced=False)
    assert p.settings == (
        ("memory", "memory.limit_in_bytes", str(64 << 20)),
        ("memory", "memory.memsw.limit_in_bytes", str(64 << 20)),
        ("pids", "pids.max", str(10 + OVERHEAD_PIDS)),
        ("cpu", "cpu.cfs_period_us", "100000"),
        ("cpu", "cpu.cfs_quota_us", "50000"),
    )
    assert p.controllers == ("memory", "pids", "cpuacct", "cpu")
    assert p.dirs("R")["memory"] == "/cg/memory/corral/uid-0/R"


def test_v1_without_swap_accounting_turns_swappiness_off() -> None:
    no_memsw = Access(1, V1.bases, memsw=False)
    assert ("memory", "memory.swappiness", "0") in plan(ALL, no_memsw, False).settings


def test_v2_plan_uses_one_directory_and_the_v2_files() -> None:
    p = plan(ALL, V2, allow_unenforced=False)
    assert p.settings == (
        ("memory", "memory.max", str(64 << 20)),
        ("memory", "memory.swap.max", "0"),
        ("pids", "pids.max", str(10 + OVERHEAD_PIDS)),
        ("cpu", "cpu.max", "50000 100000"),
    )
    assert p.unique_dirs("R") == ["/cg2/corral/R"]


def test_cpu_controller_joined_only_when_cpus_is_asked_for() -> None:
    assert "cpu" not in plan(Limits(memory_bytes=1 << 30), V1, False).controllers
    # One limit asked for: every available controller joined, for metering.
    assert plan(Limits(pids=5), V1, False).controllers == ("memory", "pids", "cpuacct")
    # Nothing asked for: no cgroup at all (and no fork to put bwrap in one).
    assert plan(Limits(), V1, False).bases == ()
    assert plan(Limits(), Access(None), False).bases == ()


def test_unenforceable_limits_are_refused_with_the_fix() -> None:
    with pytest.raises(HostError) as e:
        plan(Limits(memory_bytes=1 << 30, pids=5), USER_V1, allow_unenforced=False)
    text = str(e.value)
    assert "memory, pids" in text and "corral delegate --user alice" in text
    assert "--allow unenforced-limits" in text and "not delegated" in text
    # Negative control: nothing cgroup-backed requested, nothing refused.
    assert plan(Limits(disk_bytes=1 << 20), USER_V1, False).bases == ()


def test_allowed_unenforced_limits_are_listed_not_hidden() -> None:
    p = plan(ALL, USER_V1, allow_unenforced=True)
    assert p.unenforced == ("memory", "pids", "cpus", "cpu") and p.settings == ()


def test_requested_names_the_cgroup_backed_limits() -> None:
    assert requested(Limits()) == []
    assert requested(ALL) == ["memory", "pids", "cpus", "cpu"]


def test_tiny_cpu_bandwidth_is_raised_to_the_kernels_floor() -> None:
    assert cfs_quota(0.001) == 1000 and cfs_quota(2) == 200000


def _reader(files: dict[tuple[str, str], str]):  # type: ignore[no-untyped-def]
    return lambda c, name: files.get((c, name))


def test_v1_counters() -> None:
    got = usage(1, _reader({
        ("cpuacct", "cpuacct.usage"): "1500000000\n",
        ("memory", "memory.max_usage_in_bytes"): "67108864\n",
        ("memory", "memory.oom_control"): "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
        ("pids", "pids.peak"): "13\n",
        ("pids", "pids.events"): "max 40\n",
    }))
    assert got == Usage(cpu_s=1.5, peak_memory_bytes=64 << 20, oom_kills=2, pids_peak=13,
                        pids_refused=40)


def test_v2_counters() -> None:
    got = usage(2, _reader({
        ("cpuacct", "cpu.stat"): "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n",
        ("memory", "memory.peak"): "1048576\n",
        ("memory", "memory.events"): "low 0\nhigh 0\nmax 7\noom 1\noom_kill 1\n",
        ("pids", "pids.peak"): "4\n",
        ("pids", "pids.events"): "max 0\n",
    }))
    assert got == Usage(cpu_s=2.5, peak_memory_bytes=1 << 20, oom_kills=1, pids_peak=4)


def test_missing_counters_are_none_not_zero() -> None:
    assert usage(1, _reader({})) == Usage()
    assert usage(None, _reader({})).cpu_s is None


@pytest.mark.parametrize(("status", "code", "kills", "expected"), [
    ("signaled", 137, 1, "oom"),
    ("exited", 137, 1, "oom"),        # a shell whose child was killed
    ("exited", 0, 1, "exited"),       # survived the loss of a child and succeeded
    ("signaled", 137, 0, "signaled"),
    ("timeout", 124, 1, "timeout"),   # corral's own reason stays
    ("disk-limit", 137, 1, "disk-limit"),
])
def test_verdict(status: str, code: int, kills: int, expected: str) -> None:
    assert verdict(status, code, Usage(oom_kills=kills)) == expected
    assert verdict(status, code, None) == status


def test_proc_cgroup_parsing() -> None:
    text = "4:memory:/corral/uid-0/R\n2:cpu,cpuacct:/x\n0::/user.slice/s.scope\n"
    assert parse_proc_cgroup(text) == {"memory": "/corral/uid-0/R", "cpu": "/x",
                                       "cpuacct": "/x", "": "/user.slice/s.scope"}


def test_v2_base_is_the_highest_subtree_the_user_owns() -> None:
    mount = "/sys/fs/cgroup"
    user = f"{mount}/user.slice/user-1000.slice/user@1000.service"
    owned = {user, f"{user}/cgroup.procs", f"{user}/app.slice", f"{user}/app.slice/cgroup.procs",
             f"{user}/app.slice/t.scope", f"{user}/app.slice/t.scope/cgroup.procs"}

    def owner(path: str) -> int | None:
        return 1000 if path in owned else 0

    own = "/user.slice/user-1000.slice/user@1000.service/app.slice/t.scope"
    assert v2_delegated_base(own, mount, owner, 1000) == f"{user}/corral"
    # A login session's scope belongs to root: nothing is delegated.
    assert v2_delegated_base("/user.slice/user-1000.slice/session-2.scope", mount, owner,
                             1000) is None


def test_doctor_rows_say_what_is_missing_and_the_fix() -> None:
    rows = {name: (ok, how) for name, ok, how in doctor_rows(USER_V1, Limits(memory_bytes=1))}
    assert rows["memory-limit"][0] is False and "corral delegate" in rows["memory-limit"][1]
    assert rows["disk-limit"][0] is True
    assert rows["profile-defaults"][0] is False
    ok = {name: ok for name, ok, _ in doctor_rows(V2, Limits(memory_bytes=1))}
    assert ok["memory-limit"] and ok["profile-defaults"] and ok["cpu-time-limit"]


def test_dry_run_lines_name_the_cgroup_and_what_is_written() -> None:
    from corral.limits import describe

    lines = describe(plan(Limits(pids=5), V1, False), "R")
    assert "# cgroup v1: /cg/pids/corral/uid-0/R" in lines
    assert "#   /cg/pids/corral/uid-0/R/pids.max <- 8" in lines
    assert describe(plan(Limits(), V1, False))[0].startswith("# cgroup: none")


# -- one budget for memory and v1's separately counted socket buffers ---------------------


def test_v1_splits_one_budget_between_memory_and_socket_buffers() -> None:
    with_tcp = Access(1, V1.bases, memsw=True, tcp=True)
    settings = dict(((c, f), v) for c, f, v in plan(ALL, with_tcp, False).settings)
    memory, tcp = (int(settings["memory", f]) for f in ("memory.limit_in_bytes",
                                                        "memory.kmem.tcp.limit_in_bytes"))
    assert memory + tcp == 64 << 20 and tcp == 16 << 20  # a quarter of a small budget
    assert int(settings["memory", "memory.memsw.limit_in_bytes"]) == memory
    assert tcp_share(8 << 30) == TCP_SHARE_MAX  # at most 64 MiB of a big one
    # Control: without kmem.tcp accounting nothing is split (and nothing is charged).
    assert ("memory", "memory.limit_in_bytes", str(64 << 20)) in plan(ALL, V1, False).settings


def test_v1_peak_is_memory_and_socket_buffers_added_up() -> None:
    got = usage(1, _reader({("memory", "memory.max_usage_in_bytes"): "100\n",
                            ("memory", "memory.kmem.tcp.max_usage_in_bytes"): "20\n"}))
    assert got.peak_memory_bytes == 120
    assert usage(1, _reader({("memory", "memory.max_usage_in_bytes"): "100\n"})
                 ).peak_memory_bytes == 100


# -- open files per run --------------------------------------------------------------------


def test_open_files_per_process_shrink_so_that_the_run_stays_within_its_budget() -> None:
    lim = Limits(pids=512, files=131072)
    assert lim.process_nofile == 131072 // (512 + OVERHEAD_PIDS) == 254
    assert (lim.pids + OVERHEAD_PIDS) * lim.process_nofile <= lim.files
    assert Limits(pids=8, files=131072).process_nofile == 1024  # nofile itself caps it
    # Control: no pids limit, nothing to share out (and nothing bounds the processes).
    assert Limits(files=64).process_nofile == 1024


def test_a_budget_too_small_for_the_processes_is_refused() -> None:
    with pytest.raises(UsageError) as e:
        Limits(pids=4096, files=262144)
    assert "4096 processes leave 63 open files" in str(e.value) and "--pids" in str(e.value)


@pytest.mark.parametrize("bad", [-1, 257, True])
def test_pty_counts_are_checked(bad: int) -> None:
    with pytest.raises(UsageError):
        Limits(ptys=bad)
    assert Limits(ptys=0).ptys == 0  # control: none is a valid count


# -- the disk cap: an image per fresh workspace ------------------------------------------


@pytest.mark.parametrize("capacity", [1, 1 << 20, 16 << 20, 2 << 30])
def test_image_leaves_room_for_ext4s_metadata(capacity: int) -> None:
    size = image_size(capacity)
    assert size % 4096 == 0 and size >= capacity + capacity // 8 + (1 << 20)


def test_mke2fs_argv_is_exact() -> None:
    assert mke2fs_argv("/usr/sbin/mke2fs", "/r/work.img", (65534, 65534)) == [
        "/usr/sbin/mke2fs", "-q", "-F", "-t", "ext4", "-b", "4096", "-I", "256",
        "-i", "4096", "-m", "0", "-O", "^has_journal,^resize_inode",
        "-E", "lazy_itable_init=1,nodiscard,root_owner=65534:65534", "/r/work.img"]


def test_doctor_rows_name_the_disk_bound_and_why_not_a_file_system() -> None:
    capped = dict((n, how) for n, _, how in doctor_rows(V1, Limits(), None, True))
    assert capped["disk-limit"].startswith("file system cap") and "max=" in capped["ptys"]
    watched = dict((n, how) for n, _, how in doctor_rows(V1, Limits(), "no loop devices", False))
    assert watched["disk-limit"].startswith("measured, not capped (no loop devices)")
    assert watched["ptys"].startswith("no pseudo-terminals")


def test_the_cpu_cap_binds_a_payload_cgroup_and_corrals_own_stay_out() -> None:
    """--cpus: the quota is written to the run's cpu cgroup's child 'payload', which the
    init moves the payload into; v2 puts bwrap and the init in a sibling 'init' (a cgroup
    with children holds no processes there).  Without --cpus: no child at all."""
    v1 = plan(Limits(memory_bytes=1 << 30, cpus=0.5), V1, False)
    assert v1.payload_dirs("r") == ["/cg/cpu/corral/uid-0/r/payload"]
    assert v1.init_dir("r") is None  # v1: the init stays in the run's cgroup itself
    assert v1.setting_path("r", "cpu", "cpu.cfs_quota_us") == \
        "/cg/cpu/corral/uid-0/r/payload/cpu.cfs_quota_us"
    assert v1.setting_path("r", "memory", "memory.limit_in_bytes") == \
        "/cg/memory/corral/uid-0/r/memory.limit_in_bytes"
    v2 = plan(Limits(memory_bytes=1 << 30, cpus=0.5), V2, False)
    assert (v2.payload_dirs("r"), v2.init_dir("r")) == (["/cg2/corral/r/payload"],
                                                         "/cg2/corral/r/init")
    assert v2.setting_path("r", "cpu", "cpu.max") == "/cg2/corral/r/payload/cpu.max"
    run = cgroups.RunCgroup(v2, "r")
    assert (run.join_files(), run.payload_files()) == (
        ["/cg2/corral/r/init/cgroup.procs"], ["/cg2/corral/r/payload/cgroup.procs"])
    for access in (V1, V2):  # control: no CPU cap, no child
        plain = plan(Limits(memory_bytes=1 << 30), access, False)
        assert plain.payload_dirs("r") == [] and plain.init_dir("r") is None
        assert cgroups.RunCgroup(plain, "r").payload_files() == []
