"""``corral doctor``: what this host supports, and which protections will hold here.

:func:`assess` is pure (host facts in, report out) so that what doctor says
is tested against made-up hosts; :func:`report` probes the real one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import seccomp
from .host import HostFacts, detect

if TYPE_CHECKING:
    from .limits import Access
    from .policy import Limits

__all__ = ["assess", "render_text", "report"]


def _userns(facts: HostFacts) -> tuple[bool, str]:
    if facts.is_root:
        return True, "not needed: started by root, bwrap mounts as root and the init drops to " \
                     "an unprivileged uid"
    if facts.userns_max == 0:
        return False, "user.max_user_namespaces is 0; fix: sudo sysctl -w " \
                      "user.max_user_namespaces=15000"
    if facts.apparmor_restricts_userns:
        return False, ("AppArmor restricts unprivileged user namespaces "
                       "(kernel.apparmor_restrict_unprivileged_userns=1); fix: add an AppArmor "
                       "profile granting bwrap 'userns', or run corral as root")
    return True, f"available (max {facts.userns_max})"


def _landlock(abi: int) -> str:
    """What the init will hand Landlock on this kernel."""
    if abi < 1:
        return "kernel has no Landlock: runs refuse to start (needs --allow no-landlock)"
    rights = ["write", "remove", "create"] + ["refer"] * (abi >= 2) + ["truncate"] * (abi >= 3)
    return f"Landlock ABI {abi}: {', '.join(rights)} only beneath writable paths"


def _seccomp(facts: HostFacts) -> tuple[bool, str]:
    version = facts.libseccomp
    if version is None:
        return False, "libseccomp.so.2 not found: runs refuse to start (needs --allow no-seccomp)"
    if tuple(int(n) for n in version.split(".")) < seccomp.MIN_VERSION:
        return False, f"libseccomp {version} is older than 2.5: runs refuse to start " \
                      "(needs --allow no-seccomp)"
    return True, f"libseccomp {version}: {seccomp.summary()}"


def assess(facts: HostFacts, access: Access | None = None, defaults: Limits | None = None,
           strict_profiles: tuple[str, ...] = (), image_why: str | None = "not probed",
           bounded_ptys: bool = False) -> dict[str, Any]:
    """Facts and protections as a JSON-ready report.

    ``access`` (from :func:`corral.cgroups.probe`) adds which resource limits
    hold here; ``defaults`` are the shipped profiles' limits; ``strict_profiles``
    are those that forbid unix sockets (their payloads get a second filter);
    ``image_why`` and ``bounded_ptys`` what :func:`report` found about disk images
    and devpts.
    """
    userns_ok, userns_note = _userns(facts)
    has_seccomp, seccomp_note = _seccomp(facts)
    version = ".".join(map(str, facts.bwrap_version)) if facts.bwrap_version else None
    protections = [
        ("namespaces", facts.bwrap is not None and userns_ok,
         "mount, PID, network (loopback only), IPC, UTS and cgroup namespaces via bwrap"),
        ("no-nested-userns",
         has_seccomp if facts.is_root else facts.can_disable_userns,
         "seccomp denies new user namespaces (root mode)" if facts.is_root else
         "bwrap --disable-userns" if facts.can_disable_userns else
         "unavailable: bwrap is setuid or older than 0.8 (needs --allow nested-userns)"),
        ("unprivileged-payload", True,
         "root mode: init drops to an unprivileged uid" if facts.is_root else
         "the payload keeps your uid and no capabilities"),
        ("seccomp", has_seccomp, seccomp_note),
        ("landlock-writes", facts.landlock_abi >= 1, _landlock(facts.landlock_abi)),
        ("landlock-scopes", facts.landlock_abi >= 6,
         "abstract unix sockets and signals scoped to the sandbox" if facts.landlock_abi >= 6
         else "needs Landlock ABI 6"),
        ("tmpfs-caps", True, "private /tmp and /dev/shm with size caps"),
        ("rlimits", True, "RLIMIT_NOFILE, RLIMIT_FSIZE, RLIMIT_CORE=0 set by the init"),
        ("wall-clock", True, "timeout kills the sandbox's PID 1, ending its PID namespace"),
    ]
    if access is not None:
        from .limits import doctor_rows
        from .policy import Limits

        protections += doctor_rows(access, defaults or Limits(), image_why, bounded_ptys)
    return {
        "ready": (facts.bwrap is not None and userns_ok and has_seccomp
                  and facts.landlock_abi >= 1),
        "bwrap": {"path": facts.bwrap, "version": version, "setuid": facts.bwrap_setuid,
                  "disable_userns": facts.can_disable_userns},
        "user": {"euid": facts.euid, "root_mode": facts.is_root},
        "user_namespaces": {"ok": userns_ok, "note": userns_note,
                            "max": facts.userns_max,
                            "apparmor_restricted": facts.apparmor_restricts_userns},
        "cgroups": {"layout": facts.cgroups.layout,
                    "v1_controllers": sorted({c for c, _ in facts.cgroups.v1}),
                    "v2_mount": facts.cgroups.v2_mount,
                    "v2_controllers": list(facts.cgroups.v2_controllers)},
        "landlock_abi": facts.landlock_abi,
        "libseccomp": facts.libseccomp,
        "seccomp": seccomp.describe(strict_profiles),
        "python": {"path": facts.python, "prefix": facts.python_prefix},
        "protections": [{"name": n, "enforced": bool(ok), "how": how}
                        for n, ok, how in protections],
    }


def report() -> dict[str, Any]:
    from .cgroups import probe
    from .diskimage import unavailable
    from .mountns import can_mount_devpts
    from .profiles import builtin_profiles, load_profile

    facts = detect()
    strict = tuple(n for n in builtin_profiles() if not load_profile(n).unix_sockets)
    return assess(facts, probe(facts), load_profile("python").limits, strict,
                  unavailable(facts.is_root), can_mount_devpts(not facts.is_root))


def _filter_line(d: dict[str, Any]) -> str:
    payload = d["payload_filter"]
    fallbacks = ", ".join(f"{n} {name}" for name, n in d["fallbacks"].items())
    return (f"{d['allowed']} calls allowed ({d['narrowed']} in some forms only), "
            f"{fallbacks}, the rest EPERM; {', '.join(payload['profiles']) or 'none'}"
            f" ({payload['when']}) add: {', '.join(payload['denies'])}")


def render_text(data: dict[str, Any]) -> str:
    b = data["bwrap"]
    lines = [
        f"bwrap:            {b['path'] or 'NOT FOUND'} {b['version'] or ''}"
        f"{' (setuid)' if b['setuid'] else ''}",
        f"running as:       uid {data['user']['euid']}"
        f"{' (root mode)' if data['user']['root_mode'] else ''}",
        f"user namespaces:  {data['user_namespaces']['note']}",
        f"cgroups:          {data['cgroups']['layout']}; v1: "
        f"{', '.join(data['cgroups']['v1_controllers']) or '-'}; v2: "
        f"{', '.join(data['cgroups']['v2_controllers']) or '-'}",
        f"Landlock ABI:     {data['landlock_abi'] or 'none'}",
        f"libseccomp:       {data['libseccomp'] or 'not found'}",
        f"seccomp filter:   {_filter_line(data['seccomp'])}",
        f"python (init):    {data['python']['path']}",
        "",
        "protections:",
    ]
    for p in data["protections"]:
        lines.append(f"  [{'yes' if p['enforced'] else ' NO'}] {p['name']:<22} {p['how']}")
    lines.append("")
    lines.append("ready: " + ("yes" if data["ready"] else "NO: see above"))
    return "\n".join(lines)
