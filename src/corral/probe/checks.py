"""What a check is, and the few ways a check is judged.

A :class:`Check` names the attempts the battery makes inside the sandbox, the
launch that makes them, the host state verified right after that launch
(:class:`Watch`: a planted file unchanged, a path still absent, a canary
server never reached, no marked process left running), and a judge that
turns what was seen (:class:`Seen`) into a verdict and an observation.

A check whose attempt never ran fails: a launcher that cannot start the
battery proves nothing, so it cannot pass anything by default.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .canaries import Plant
from .launchers import Outcome

__all__ = [
    "CATEGORIES",
    "Attempt",
    "Check",
    "Seen",
    "Verdict",
    "Watch",
    "attempt",
    "bounded",
    "denied",
    "host_clean",
    "no_canary",
]

CATEGORIES = {"writes": "writes outside", "secrets": "secret reads", "network": "network",
              "privilege": "privilege", "resources": "resource exhaustion",
              "lifecycle": "lifecycle", "launch": "launch policy"}
Verdict = tuple[bool, str]


@dataclass(frozen=True, slots=True)
class Attempt:
    """One operation of the battery, with arguments that may name planted places."""

    op: str
    args: tuple[tuple[str, Any], ...] = ()

    def render(self, ident: str, plant: Plant) -> dict[str, Any]:
        def fill(value: Any) -> Any:
            if isinstance(value, str):
                return plant.fill(value)
            if isinstance(value, tuple):
                return [fill(v) for v in value]
            return value
        return {"id": ident, "op": self.op, **{k: fill(v) for k, v in self.args}}


def attempt(op: str, **args: Any) -> Attempt:
    return Attempt(op, tuple(args.items()))


@dataclass(frozen=True, slots=True)
class Watch:
    """Host state verified right after the check's launch.

    ``unchanged PATH``, ``absent PATH``, ``unreached SERVER`` (a canary server
    saw nobody), ``gone MARKER`` (no process of the run carries the marker),
    ``owner NAME`` (a file the battery made in its working directory is not
    owned by uid 0 on the host) or ``setid NAME`` (nor has a set-id bit).
    """

    kind: str
    target: str


Judge = Callable[["Seen"], Verdict]


@dataclass(frozen=True, slots=True)
class Check:
    id: str
    category: str  # a key of CATEGORIES
    attempted: str
    expected: str
    why: str  # why it matters, for docs/probe.md
    judge: Judge
    launch: str = "main"
    attempts: tuple[Attempt, ...] = ()
    watches: tuple[Watch, ...] = ()

    def attempt_ids(self) -> list[str]:
        if len(self.attempts) == 1:
            return [self.id]
        return [f"{self.id}#{i}" for i in range(len(self.attempts))]


@dataclass(frozen=True, slots=True)
class Seen:
    """Everything known about one check once its launch is over."""

    check: Check
    plant: Plant
    outcome: Outcome | None
    findings: tuple[str, ...]  # host-side: what the watches found changed
    refuses_unsafe: bool  # the launcher promises to refuse unsafe launch directories
    notes: tuple[str, ...] = ()  # host-side observations that are not problems

    def result(self, ident: str | None = None) -> dict[str, Any] | None:
        return None if self.outcome is None else self.outcome.result(ident or self.check.id)

    def missing(self, ident: str | None = None) -> str | None:
        """Why the attempt was not made, or None when it was."""
        o = self.outcome
        if o is None:
            return "not run"
        if not o.started:
            return f"the battery did not start ({o.ending()})"
        r = o.result(ident or self.check.id)
        if r is None:
            return f"not attempted: the battery stopped before it ({o.ending()})"
        if r.get("ok") is None:
            return str(r.get("detail"))
        return None


def _said(r: dict[str, Any]) -> str:
    return str(r.get("detail")) if r.get("ok") else f"refused ({r.get('detail')})"


def host_clean(seen: Seen) -> Verdict:
    """Passes when the attempt was made and the host shows no trace of it."""
    if (why := seen.missing()) is not None:
        return False, why
    inside = _said(seen.result() or {})
    if seen.findings:
        return False, f"{inside}; on the host: {'; '.join(seen.findings)}"
    return True, f"{inside}; " + ("; ".join(seen.notes) or "the host is unchanged")


def no_canary(*names: str) -> Judge:
    """Passes when the attempt was made and found none of the named canary tokens."""
    def judge(seen: Seen) -> Verdict:
        if (why := seen.missing()) is not None:
            return False, why
        r = seen.result() or {}
        tokens = {seen.plant.tokens[n] for n in names}
        if tokens & set(r.get("found", ())):
            return False, f"{r.get('detail')}, holding the canary"
        return True, _said(r) + ("" if not r.get("ok") else ", no canary in it")
    return judge


def planted(note: str, judge: Judge) -> Judge:
    """``judge``, unless the trampoline could not plant this canary on this host at all."""
    def check(seen: Seen) -> Verdict:
        notes = seen.outcome.notes.split() if seen.outcome else []
        missing = [n for n in notes if n.startswith(f"no-{note}:")]
        if missing and seen.outcome and seen.outcome.started:
            return True, f"nothing to find: the host refused the canary ({missing[0]})"
        return judge(seen)
    return check


def denied(seen: Seen) -> Verdict:
    """Passes when the operation failed."""
    if (why := seen.missing()) is not None:
        return False, why
    r = seen.result() or {}
    return not r.get("ok"), _said(r)


def bounded(bound: int, unit: str) -> Judge:
    """Passes when the sandbox stopped the attempt below ``bound``, however it did so."""
    def show(n: int) -> str:
        return f"{n >> 20} MiB" if unit == "bytes" else f"{n} {unit}"

    def judge(seen: Seen) -> Verdict:
        o = seen.outcome
        if o is None or not o.started:
            return False, seen.missing() or "not run"
        if o.killed:
            return False, f"not stopped: {o.ending()}"
        r = o.result(seen.check.id)
        reached = o.progress(seen.check.id) or 0
        if r is None:
            if not o.began(seen.check.id):
                return False, seen.missing() or "not attempted"
            return reached < bound, f"the sandbox ended the run at {show(reached)} ({o.ending()})"
        if r.get("ok") is None:
            return False, str(r.get("detail"))
        count = int(r.get("count", reached))
        return count < bound, f"{r.get('detail')}: reached {show(count)} of {show(bound)}"
    return judge


def _timed_out(seen: Seen, spin: str) -> str | None:
    """Why the spin launch did not end before the spinner's own end; None when it did."""
    o = seen.outcome
    if o is None or not o.started:
        return seen.missing() or "not run"
    if o.killed:
        return f"nothing stopped it: {o.ending()}"
    r = o.result(spin)
    if r is not None:
        return str(r.get("detail"))
    if not o.began(spin):
        return f"the spinner never started ({o.ending()})"
    return None


def stopped(spin: str) -> Judge:
    """Passes when the sandbox's wall clock ended the spinner before its own end."""
    def judge(seen: Seen) -> Verdict:
        if (why := _timed_out(seen, spin)) is not None:
            return False, why
        ended = f"the launch ended after {seen.outcome.wall_s:.1f} s " \
                f"({seen.outcome.ending()})" if seen.outcome else ""
        if seen.findings:
            return False, f"{ended}, but the spinner runs on: {'; '.join(seen.findings)}"
        return True, f"{ended}; the spinner is gone"
    return judge


def tree_gone(spin: str) -> Judge:
    """Passes when the timed-out launch left no process behind."""
    def judge(seen: Seen) -> Verdict:
        if (why := _timed_out(seen, spin)) is not None:
            return False, f"the timeout never fired: {why}"
        if seen.findings:
            return False, "; ".join(seen.findings)
        return True, "no process of the timed-out launch is left"
    return judge


def gone(seen: Seen) -> Verdict:
    """Passes when the attempt spawned its process and none is left after the run."""
    if (why := seen.missing()) is not None:
        return False, why
    if seen.findings:
        return False, "; ".join(seen.findings)
    return True, f"{(seen.result() or {}).get('detail')}; gone after the run"


def exit_status(expected: int) -> Judge:
    def judge(seen: Seen) -> Verdict:
        o = seen.outcome
        if o is None or not o.finished:
            return False, seen.missing() or "the battery did not finish"
        return o.exit_code == expected, f"the launcher exited {o.exit_code}"
    return judge


def refused_launch(seen: Seen) -> Verdict:
    """Launched from a directory that must never become writable: refused, or harmless."""
    o = seen.outcome
    if o is None:
        return False, "not run"
    if seen.findings:
        return False, "it started, and on the host: " + "; ".join(seen.findings)
    if seen.refuses_unsafe:
        if o.started or o.exit_code != 125:
            began = "started" if o.started else "did not start"
            return False, f"not refused: the battery {began}; the launcher ended with {o.ending()}"
        return True, f"refused: {o.ending()}"
    if not o.started:
        return True, f"nothing started ({o.ending()})"
    said = [_said(r) for i in seen.check.attempt_ids() if (r := o.result(i)) is not None]
    return True, "started; " + "; ".join(said or ["made no attempt"]) + "; the host is unchanged"


# --- judges for single checks -----------------------------------------------------------

def status(check: Callable[[dict[str, str]], bool], describe: str) -> Judge:
    """A judge over /proc/self/status fields (and the host uid) reported by the battery."""
    def judge(seen: Seen) -> Verdict:
        if (why := seen.missing()) is not None:
            return False, why
        r = seen.result() or {}
        return bool(check(r["fields"])), describe.format(**r["fields"])
    return judge


def refused_or(judge: Judge) -> Judge:
    """``judge``; or a pass when the launcher refused to start (exit 125, the battery never
    ran) and the host is unchanged: for launches set up to be refused."""
    def check(seen: Seen) -> Verdict:
        o = seen.outcome
        if o is not None and not o.started and o.exit_code == 125 and not seen.findings:
            return True, f"refused: {o.ending()}"
        return judge(seen)
    return check


def refused_and_clean(seen: Seen) -> Verdict:
    passed, said = host_clean(seen)
    return passed and not (seen.result() or {}).get("ok"), said


def empty_or_refused(seen: Seen) -> Verdict:
    if (why := seen.missing()) is not None:
        return False, why
    r = seen.result() or {}
    if not r.get("ok"):
        return True, f"refused ({r.get('detail')})"
    size = r.get("count", r.get("bytes", 0))
    return size == 0, f"{r.get('detail')}" + (" (empty)" if size == 0 else "")


def names_hidden(seen: Seen) -> Verdict:
    if (why := seen.missing()) is not None:
        return False, why
    r = seen.result() or {}
    shown = r.get("names", [])
    if shown:
        return False, f"{r.get('detail')}, including {', '.join(shown)}"
    return True, f"refused ({r.get('detail')})" if not r.get("ok") else \
        f"{r.get('detail')}, none of them planted credentials"


def only_loopback(seen: Seen) -> Verdict:
    if (why := seen.missing()) is not None:
        return False, why
    r = seen.result() or {}
    return set(r.get("names", [])) <= {"lo"}, str(r.get("detail"))


def no_routes(seen: Seen) -> Verdict:
    if (why := seen.missing()) is not None:
        return False, why
    r = seen.result() or {}
    return r.get("count") == 0, str(r.get("detail"))


def no_tunnel(seen: Seen) -> Verdict:
    verdict, said = host_clean(seen)
    r = seen.result() or {}
    return verdict and not r.get("ok"), said


def pid1_protected(seen: Seen) -> Verdict:
    verdict, said = denied(seen)
    return verdict and not (seen.result() or {}).get("shared"), said


def usable(seen: Seen) -> Verdict:
    if (why := seen.missing()) is not None:
        return False, why
    r = seen.result() or {}
    if r.get("ok"):
        return True, "the project is writable"
    return False, f"the project is not writable ({r.get('detail')})"


def zero(fields: dict[str, str], *names: str) -> bool:
    return all(int(fields.get(n, "1"), 16) == 0 for n in names)
