"""One run's account with the proxy: the CPU time and the buffered bytes it may cost the host.

The proxy runs in corral's process, outside the run's cgroup, so nothing the
kernel enforces on the run bounds the work a payload makes the proxy do.
This is the bound, kept per run (one :class:`Account` per run, beside its
rules and its log) so that one proxy could serve several runs:

* CPU: a token bucket.  The run's share accrues at ``cpu_share`` CPU-seconds
  per second (the run's own ``--cpus``), up to a burst; the proxy charges the
  CPU time it spent, and when the balance is negative it pauses this run's
  work until the balance is back to zero.  Without a share there is no
  bound beyond the proxy's one thread.
* Bytes: each tunnel asks for its socket buffers and relay window.  While the
  run's budget lasts a tunnel gets full-size buffers (fast downloads); past it,
  the minimum, so a run's stalled tunnels hold at most the budget plus the
  minimum per connection, never the kernel's autotuned megabytes each.
* Requests being read: what the proxy has read of a request it cannot act on
  yet (an unfinished head, the bytes a client sent along with it while the
  upstream connection is made) is held in corral's memory, up to 64 KiB a
  connection.  The run's connections together may hold ``HOLD_BUDGET``; a
  read past it refuses that request, so a thousand half-sent heads cost
  megabytes, not a hundred of them.

Pure arithmetic: the proxy measures and sleeps, this decides.
"""

from __future__ import annotations

__all__ = ["FULL_BUFFER", "HOLD_BUDGET", "MIN_BUFFER", "Account"]

CPU_BURST_S = 0.5  # CPU-seconds a run may use at once before the share applies
MAX_PAUSE_S = 1.0  # one pause at most; the next tick pauses again if still in debt
FULL_BUFFER = 256 * 1024  # SO_RCVBUF/SO_SNDBUF asked for a tunnel within the budget
MIN_BUFFER = 8 * 1024  # the same, past the budget (the kernel doubles both)
BYTE_BUDGET = 8 * 1024 * 1024  # per run: full-size tunnels' buffers, counted as below
HOLD_BUDGET = 4 * 1024 * 1024  # per run: request bytes read but not yet relayed


def buffer_cost(size: int) -> int:
    """What a tunnel with ``size`` buffers can hold: the kernel's doubled receive and send
    buffers upstream, plus one relay window each way."""
    return 2 * 2 * size + 2 * size


class Account:
    """A run's CPU balance and byte budget (see the module docstring)."""

    def __init__(self, cpu_share: float | None = None, byte_budget: int | None = BYTE_BUDGET,
                 hold_budget: int = HOLD_BUDGET) -> None:
        self.cpu_share = cpu_share
        self.balance = CPU_BURST_S
        self.cpu_used = 0.0  # CPU-seconds charged in all
        self.paused = 0.0  # seconds paused in all
        self.bytes_left = byte_budget
        self.hold_left = hold_budget

    def charge_cpu(self, used_s: float, wall_s: float) -> float:
        """Charge ``used_s`` CPU spent over ``wall_s`` seconds; the pause owed now, in seconds."""
        self.cpu_used += used_s
        if self.cpu_share is None:
            return 0.0
        self.balance = min(CPU_BURST_S, self.balance + wall_s * self.cpu_share) - used_s
        if self.balance >= 0:
            return 0.0
        return min(MAX_PAUSE_S, -self.balance / self.cpu_share)

    def grant_buffer(self) -> int | None:
        """The buffer size for a new tunnel, taken from the budget (None: no budget, the
        kernel's defaults); give it back with :meth:`release_buffer`."""
        if self.bytes_left is None:
            return None
        if self.bytes_left >= buffer_cost(FULL_BUFFER):
            self.bytes_left -= buffer_cost(FULL_BUFFER)
            return FULL_BUFFER
        return MIN_BUFFER

    def release_buffer(self, size: int | None) -> None:
        if size == FULL_BUFFER and self.bytes_left is not None:
            self.bytes_left += buffer_cost(FULL_BUFFER)

    def hold(self, size: int) -> bool:
        """Take ``size`` bytes of a request the proxy keeps while it reads or connects;
        False (and nothing taken) when the run's connections already hold the budget."""
        if size > self.hold_left:
            return False
        self.hold_left -= size
        return True

    def unhold(self, size: int) -> None:
        self.hold_left += size
