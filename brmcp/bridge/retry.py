"""Re-send timing for requests to a bot (BRIDGE.md §Deadlines and re-sends).

BR delivers PMs in order and acknowledges them, but a bot may be offline,
restart, or (on the in-memory fabric) lose a PM. The bridge therefore sends
a request again, with the same JSON-RPC content (for ``tools/call`` the same
``brmcp/callKey``, so the bot runs it at most once and replays its outcome),
until a reply arrives or the request's deadline passes.

The wait before each re-send is a retransmission timeout computed from the
round trips the bridge measures, as TCP does (RFC 6298): ``SRTT`` and
``RTTVAR`` from replies to first copies only (Karn's rule: a reply after a
re-send cannot be attributed), ``RTO = SRTT + 4·RTTVAR`` clamped to
``[minimum, maximum]``, ``initial`` before any sample, doubled after every
re-send of one request.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RetryPolicy", "RttEstimator"]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Re-send timing in seconds.

    * ``initial``: RTO before any round trip was measured;
    * ``minimum`` / ``maximum``: clamp of the RTO and of every backoff step;
    * ``answer_timeout``: how long an agent waits for a bot that does not
      answer ``initialize`` before it is told so (the bridge keeps trying).

    Raises ValueError unless ``0 < minimum <= initial <= maximum`` and
    ``answer_timeout > 0``.
    """

    initial: float = 3.0
    minimum: float = 0.5
    maximum: float = 60.0
    answer_timeout: float = 30.0

    def __post_init__(self) -> None:
        if not 0 < self.minimum <= self.initial <= self.maximum:
            raise ValueError(
                f"RetryPolicy needs 0 < minimum <= initial <= maximum, got "
                f"{self.minimum!r}, {self.initial!r}, {self.maximum!r}"
            )
        if not self.answer_timeout > 0:
            raise ValueError(f"RetryPolicy.answer_timeout must be > 0, got {self.answer_timeout!r}")


class RttEstimator:
    """Smoothed round-trip time of one bot (RFC 6298 §2, alpha 1/8, beta 1/4)."""

    __slots__ = ("policy", "rttvar", "samples", "srtt")

    def __init__(self, policy: RetryPolicy) -> None:
        self.policy = policy
        self.srtt: float | None = None
        self.rttvar = 0.0
        #: Round trips measured so far.
        self.samples = 0

    def sample(self, rtt: float) -> None:
        """Record one measured round trip (seconds, first copies only)."""
        rtt = max(rtt, 0.0)
        if self.srtt is None:
            self.srtt = rtt
            self.rttvar = rtt / 2
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - rtt)
            self.srtt = 0.875 * self.srtt + 0.125 * rtt
        self.samples += 1

    @property
    def rto(self) -> float:
        """The wait before the first re-send (seconds)."""
        if self.srtt is None:
            return self.policy.initial
        return self.clamp(self.srtt + 4 * self.rttvar)

    def clamp(self, seconds: float) -> float:
        return min(max(seconds, self.policy.minimum), self.policy.maximum)

    def schedule(self, budget: float) -> list[float]:
        """The re-send offsets (seconds after the first send) that fit in
        ``budget`` seconds at the current RTO: RTO, then doubling gaps."""
        out: list[float] = []
        gap = self.rto
        at = gap
        while at < budget:
            out.append(at)
            gap = self.clamp(gap * 2)
            at += gap
        return out
