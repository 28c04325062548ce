"""What ``corral agent`` settles before its sandbox starts, done once and early.

The bounded devpts's trial (corral.mountns.probe_devpts) is begun in the background at
the start of a run and answered by the child the compiled init's ``--join`` spawned;
the init is chosen once per run (corral.cinit.choice) and handed down; the CLI's proxy
process is forked before the run's directory exists (corral.egress.session.prefork)
and handed its log when the run starts, or killed if the run never does.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import textwrap
from pathlib import Path

from agent_lab import Lab
from conftest import NOBODY, Identity, need
from corral import agent, cinit, host
from corral.profiles import load_profile
from corral.record import replace
from egress_util import Origin, write_script

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


FETCH = r"""
import socket, sys, urllib.request as u
print(u.urlopen(f"http://origin.test:{sys.argv[1]}/early", timeout=60).status)
s = socket.create_connection(("127.0.0.1", 3128))
s.sendall(b"CONNECT denied.test:443 HTTP/1.1\r\nHost: denied.test:443\r\n\r\n")
print(s.recv(12).decode())
"""


def test_the_agents_proxy_forked_ahead_serves_and_logs(who: Identity, lab: Lab) -> None:
    """``corral agent`` with a name allowed: the proxy process forked before the run's
    directory existed relays the allowed request, refuses the other, and both decisions
    are in the run's log (its descriptor came by SCM_RIGHTS) and the denial in the record."""
    (lab.project / "fetch.py").write_text(FETCH)
    lab.own(lab.project / "fetch.py")
    with Origin() as origin:
        r = who.corral("agent", "--allow-domain", "origin.test", "--resolve",
                       "origin.test:127.0.0.1", "--", "python3", "fetch.py", str(origin.port),
                       cwd=lab.project)
    assert r.returncode == 0 and r.stdout.split() == ["200", "HTTP/1.1", "403"], r
    (run,) = [d for d in (who.tmp / "runs").iterdir() if (d / "record.json").exists()]
    log = [json.loads(line) for line in (run / "egress.jsonl").read_text().splitlines()]
    assert [(e["host"], e["allowed"]) for e in log] == [("origin.test", True),
                                                         ("denied.test", False)], log
    record = json.loads((run / "record.json").read_text())
    assert record["status"] == "exited" and record["error"] is None, record
    assert [d["host"] for d in record["denials"]] == ["denied.test"], record


EARLY = r"""
import json, os, sys, tempfile, time
import corral.egress
from corral.egress import session as es
from corral.errors import LaunchError
from corral.policy import Network
net = Network(allow=("origin.test",))
out = {"library": es.prefork(net) is None}  # corral.run's caller: never forked
corral.egress.fork_proxies()  # as the CLI does
out["nothing_allowed"] = es.prefork(Network()) is None

def reaped(pid):
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False

def fds(pid):
    found = []
    for n in os.listdir(f"/proc/{pid}/fd"):
        try:
            found.append(os.readlink(f"/proc/{pid}/fd/{n}"))
        except OSError:  # the listing's own descriptor
            pass
    return sorted(found)

s = es.prefork(net)  # a run that ends before it starts: the child killed and reaped
pid = s.child.pid
out["alive"] = not reaped(pid)
s.discard()
out["discarded"] = reaped(pid)

s = es.prefork(net)  # a log that cannot be made: the run stops, the child is reaped
pid = s.child.pid
try:
    s.begin("/nonexistent/run")
    out["bad_log"] = "started"
except LaunchError as e:
    out["bad_log"] = str(e)
out["bad_log_reaped"] = reaped(pid)

s = es.prefork(net)  # handed to a run of other rules: never that run's proxy
pid = s.child.pid
other = es.open_session(Network(allow=("other.test",)), None, early=s)
out["other_rules"] = [other is not s, reaped(pid),
                      other.rules == es.compile_rules(Network(allow=("other.test",)))]
other.close()
s = es.prefork(net)  # the control: the same rules take the early process
same = es.open_session(net, None, early=s)
out["same_rules"] = same is s
same.close()

s = es.prefork(net)  # begun: the child serves with the log it was handed
pid = s.child.pid
run = tempfile.mkdtemp()
s.begin(run)
s.discard()  # nothing, once begun
deadline = time.monotonic() + 60
while not any(f.endswith("/egress.jsonl") for f in fds(pid)) and time.monotonic() < deadline:
    time.sleep(0.02)
out["child_fds"] = fds(pid)
out["parent_has_log"] = any(f.endswith("/egress.jsonl") for f in fds(os.getpid()))
s.close()
out["closed"] = [reaped(pid), s.error]
print(json.dumps(out))
"""


def test_the_early_proxy_process_is_handed_its_log_or_killed(who: Identity) -> None:
    """prefork's endings: discarded (the run failed before it started: killed and
    reaped), a log that cannot be made (LaunchError before the launch, reaped), begun (the
    child holds the log, the launcher does not, and it ends with no failure), handed to a run
    of other rules (discarded; that run gets a proxy of its own rules).  Controls: a
    library caller, and a policy that allows nothing, get no early process."""
    script = write_script(who, "early.py", EARLY)
    proc = who.run([who.prefix()[-1], str(script)])
    assert proc.returncode == 0, proc
    out = json.loads(proc.stdout)
    assert out["library"] and out["nothing_allowed"], out
    assert out["alive"] and out["discarded"], out
    assert out["bad_log"].startswith("cannot start the egress proxy"), out
    assert out["bad_log_reaped"], out
    assert out["other_rules"] == [True, True, True] and out["same_rules"], out
    odd = [t for t in out["child_fds"] if not (t in ("/dev/null", "anon_inode:[eventpoll]")
                                               or t.startswith(("socket:", "pipe:"))
                                               or t.endswith("/egress.jsonl"))]
    assert odd == [] and any(t.endswith("/egress.jsonl") for t in out["child_fds"]), out
    assert not out["parent_has_log"], out
    assert out["closed"] == [True, None], out
