"""What ``corral agent`` settles before its sandbox starts, done once and early.

The bounded devpts's trial (corral.mountns.probe_devpts) is begun in the background at
the start of a run and answered by the child the compiled init's ``--join`` spawned;
the init is chosen once per run (corral.cinit.choice) and handed down.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import textwrap
from dataclasses import replace
from pathlib import Path

from conftest import NOBODY, Identity, need
from corral import agent, cinit, host
from corral.profiles import load_profile

PROBE = textwrap.dedent("""
    import json, os, sys
    from corral import mountns
    own = os.geteuid() != 0
    binary = sys.argv[1] or None
    mountns.probe_devpts(own, binary)
    pending = own in mountns._DEVPTS_PENDING
    answer = mountns.can_mount_devpts(own)
    try:
        os.waitpid(-1, os.WNOHANG)
        left = True
    except ChildProcessError:
        left = False
    again = mountns.can_mount_devpts(own)  # answered from the cache: no second trial
    mounts = mountns.ChildMounts(own_userns=own)
    mounts.bounded_devpts(1)
    forked = mountns._in_child(mounts.step)  # the trial made in a fork of this process
    print(json.dumps({"pending": pending, "answer": answer, "left": left, "again": again,
                      "forked": forked}))
""")


def _probe(who: Identity, binary: str) -> dict[str, bool]:
    r = who.run([who.prefix()[-1], "-c", PROBE, binary])  # its Python, as that user
    assert r.returncode == 0, r
    out: dict[str, bool] = json.loads(r.stdout)
    return out


def test_the_devpts_trial_begun_ahead_answers_as_the_fork_does(who: Identity,
                                                              readable_src: Path) -> None:
    """The background trial (the compiled init's --join, spawned) gives the fork's answer,
    here yes as root and as the user, and leaves no child behind."""
    need(cinit.available(), "corral's compiled init (make setup builds it with cc)")
    binary = str(readable_src / "corral" / "init.bin")  # CI's checkout may be unreadable
    r = _probe(who, binary)
    assert r == {"pending": True, "answer": True, "left": False, "again": True,
                 "forked": True}, r


def test_a_failed_devpts_trial_means_no_ptys(who: Identity) -> None:
    """The answer is the spawned child's exit status: a joiner that fails (here a program
    that always fails, where the fork would succeed) means no bounded devpts, so the run
    gets no ptys, never the host's.  Control: without a binary nothing is begun ahead, and
    the fork answers."""
    failed = _probe(who, "/bin/false")
    assert failed == {"pending": True, "answer": False, "left": False, "again": False,
                      "forked": True}, failed
    forked = _probe(who, "")
    assert forked == {"pending": False, "answer": True, "left": False, "again": True,
                      "forked": True}, forked


def test_resolve_agent_takes_the_runs_init_choice(tmp_path: Path) -> None:
    """The init chosen once per run is the one the sandbox gets: resolve_agent does not
    choose again (CORRAL_INIT is unset here, so its own choice would be the compiled one)."""
    need(cinit.available(), "corral's compiled init (make setup builds it with cc)")
    facts = host.detect()
    base = Path(tempfile.mkdtemp(prefix="corral-agent-start-", dir="/var/tmp"))
    try:
        home = base / "home"
        project = home / "dev" / "proj"
        project.mkdir(parents=True)
        if facts.is_root:  # the agent runs as the project's owner, never as root
            for p in [base, *base.rglob("*")]:
                os.chown(p, NOBODY, NOBODY)
        policy = replace(load_profile("generic"), home=str(home))
        chosen = {init: agent.resolve_agent(policy, ["/bin/true"], facts, str(project),
                                            init=init)[0].init_binary
                  for init in ("python", "c", None)}
    finally:
        shutil.rmtree(base, ignore_errors=True)
    assert chosen == {"python": None, "c": cinit.BINARY, None: cinit.BINARY}, chosen
