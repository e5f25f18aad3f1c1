"""Re-send timing for requests to a bot (BRIDGE.md §Deadlines and re-sends).

BR delivers PMs in order and acknowledges them, but a bot may be offline,
restart, or (on the in-memory fabric) lose a PM. The bridge therefore sends
a request again, with the same JSON-RPC content (for ``tools/call`` the same
``brmcp/callKey``, so the bot runs it at most once and replays its outcome),
until a reply arrives or the request's deadline passes.

The wait before each re-send is a retransmission timeout computed from the
round trips the bridge measures, as TCP does (RFC 6298):

* ``SRTT`` and ``RTTVAR`` from measured round trips (§2.2, §2.3; alpha 1/8,
  beta 1/4) and ``RTO = SRTT + 4·RTTVAR`` clamped to ``[minimum, maximum]``;
* a round trip is measured from the moment the copy's last PM left this side
  (its ``PM`` call to brclient returned) to the reply. Every copy is a
  JSON-RPC request of its own id, so a reply names the copy it answers and
  may be measured even after a re-send, as TCP's timestamp option allows
  (§3). A reply later than :data:`SAMPLE_LIMIT` times the RTO its copy was
  sent with is not measured: that silence was an outage (a bot offline, its
  PMs stored at the relay), not the path, and one such sample would keep the
  RTO high for many requests;
* every timer expiry doubles the RTO (§5.5), and the backed-off value is kept
  for the next requests until a reply is measured again (§5 after rule 5.7,
  "collapsing" the RTO; Karn's algorithm): after a re-send the next request
  does not start again from the value that was too small;
* before this bot's first measurement, the first guess is, in order, the
  RTT measured to it in an earlier run (persisted with its snapshot:
  RFC 9002 §6.2.2, a previous connection's smoothed RTT as the initial RTT),
  the RTT measured across every bot reached through the same relay (RFC 9040,
  TCP control block interdependence: ensemble sharing), and
  ``RetryPolicy.initial``.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

__all__ = ["SAMPLE_LIMIT", "RetryPolicy", "RttEstimator", "relay_estimator"]

#: A reply is a round-trip sample only when it came within this many times
#: the RTO its copy was sent with (see the module text).
SAMPLE_LIMIT = 2.0


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Re-send timing in seconds.

    * ``initial``: RTO before anything was measured (no sample of this bot,
      none persisted, none across the relay);
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
    """Smoothed round-trip time of one bot, or of every bot behind one relay
    (RFC 6298 §2; times in seconds).

    ``prior`` is the relay's estimator: it gets every sample this one takes
    and gives the first guess while this one has neither a sample nor a
    seed. :attr:`rto` is always within ``[policy.minimum, policy.maximum]``.
    """

    __slots__ = ("_backoff", "_seed", "policy", "prior", "rttvar", "samples", "srtt")

    def __init__(self, policy: RetryPolicy, *, prior: RttEstimator | None = None) -> None:
        self.policy = policy
        self.prior = prior
        self.srtt: float | None = None
        self.rttvar = 0.0
        #: Round trips measured so far.
        self.samples = 0
        self._seed: tuple[float, float] | None = None
        self._backoff: float | None = None

    def sample(self, rtt: float) -> None:
        """Record one measured round trip (seconds; negative counts as 0):
        RFC 6298 §2.2 for the first, §2.3 after. Ends a backoff (the RTO
        "collapses" to the measured one, §5) and is passed to the prior."""
        rtt = max(rtt, 0.0)
        if self.srtt is None:
            self.srtt = rtt
            self.rttvar = rtt / 2
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - rtt)
            self.srtt = 0.875 * self.srtt + 0.125 * rtt
        self.samples += 1
        self._backoff = None
        if self.prior is not None:
            self.prior.sample(rtt)

    def answered(self, rtt: float, rto: float) -> bool:
        """A reply came ``rtt`` seconds after its copy left, a copy whose
        timer was ``rto`` seconds: recorded as a sample (and True) unless it
        came later than :data:`SAMPLE_LIMIT` times ``rto`` (an outage, not
        the path; the backoff, if any, stays)."""
        if not math.isfinite(rtt) or rtt > SAMPLE_LIMIT * rto:
            return False
        self.sample(rtt)
        return True

    def expired(self, rto: float) -> float:
        """The timer of a copy sent with ``rto`` seconds expired: returns
        the next gap, ``rto`` doubled and clamped (RFC 6298 §5.5), and keeps
        it as this estimator's RTO until the next sample (Karn's algorithm:
        the next request starts from the backed-off value)."""
        gap = self.clamp(rto * 2)
        if self._backoff is None or gap > self._backoff:
            self._backoff = gap
        return gap

    def seed(self, srtt: float, rttvar: float) -> None:
        """Take an earlier measurement (``SRTT`` and ``RTTVAR`` in seconds,
        e.g. persisted by a previous run) as the first guess until the first
        sample, which replaces it (RFC 9002 §6.2.2). Of several seeds the one
        with the larger RTO is kept; ignored once a sample was taken. Raises
        ValueError unless both are finite and >= 0."""
        if not (math.isfinite(srtt) and math.isfinite(rttvar) and srtt >= 0 and rttvar >= 0):
            raise ValueError(f"RttEstimator.seed needs finite values >= 0, got {srtt!r}, {rttvar!r}")
        if self.srtt is not None:
            return
        if self._seed is None or srtt + 4 * rttvar > self._seed[0] + 4 * self._seed[1]:
            self._seed = (srtt, rttvar)

    def record(self) -> tuple[float, float] | None:
        """``(SRTT, RTTVAR)`` in seconds to persist: the measured ones, else
        the seed; None when there is neither."""
        if self.srtt is not None:
            return (self.srtt, self.rttvar)
        return self._seed

    @property
    def measured(self) -> float | None:
        """The RTO from this estimator's own samples (or its seed), without
        a backoff and without the prior; None when it has neither."""
        state = self.record()
        if state is None:
            return None
        return self.clamp(state[0] + 4 * state[1])

    @property
    def backed_off(self) -> float | None:
        """The RTO kept after a timer expiry until the next sample (None: none)."""
        return self._backoff

    @property
    def rto(self) -> float:
        """The wait before the first re-send of a new request (seconds): the
        backed-off RTO, else :attr:`measured`, else the prior's, else
        ``policy.initial``."""
        if self._backoff is not None:
            return self._backoff
        measured = self.measured
        if measured is None and self.prior is not None:
            measured = self.prior.measured
        return self.clamp(self.policy.initial if measured is None else measured)

    def clamp(self, seconds: float) -> float:
        """``seconds`` within ``[policy.minimum, policy.maximum]``."""
        return min(max(seconds, self.policy.minimum), self.policy.maximum)

    def schedule(self, budget: float) -> list[float]:
        """The re-send offsets (seconds after the first copy left) that fit
        in ``budget`` seconds at the current RTO when no reply comes: RTO,
        then doubling gaps (read only: nothing is backed off)."""
        out: list[float] = []
        gap = self.rto
        at = gap
        while at < budget:
            out.append(at)
            gap = self.clamp(gap * 2)
            at += gap
        return out


_RELAYS: weakref.WeakKeyDictionary[object, RttEstimator] = weakref.WeakKeyDictionary()


def relay_estimator(relay: object, policy: RetryPolicy) -> RttEstimator:
    """The estimator shared by every bot link reached through ``relay`` (the
    bridge's router: one brclient, one relay), made on first use with
    ``policy`` and kept while ``relay`` lives. It is the ``prior`` of each
    link's own estimator (RFC 9040, ensemble sharing). An object that
    cannot be weakly referenced (a test's stand-in) gets an estimator of its
    own on every call, shared with nobody."""
    try:
        estimator = _RELAYS.get(relay)
        if estimator is None:
            estimator = _RELAYS[relay] = RttEstimator(policy)
    except TypeError:
        return RttEstimator(policy)
    return estimator
