"""An in-flight limit that finds a participant's capacity from its latency.

A participant declares how many requests it takes at once (``max_in_flight``), but many real memory
systems serve one request at a time whatever they declare: sending them 64 at once only queues 63 at the
server, where every request's latency becomes the queue's (a Search of 37 ms reported as 2,960 ms), and
nothing is gained. :class:`AdaptiveLimit` keeps the number of requests in flight where adding one more
still buys throughput rather than queueing, bounded by the declared ``max_in_flight``.

The rule (a latency gradient with slow start, in the manner of TCP Vegas and Netflix's
concurrency-limits ``Gradient2``):

- Each endpoint (Add, Search) keeps its own *baseline*: a low quantile (:data:`BASELINE_QUANTILE`, the
  10th percentile) of its last ``2 * baseline_samples`` latencies (an Add takes far longer than a Search;
  each is compared with its own kind). A reply's *ratio* is its latency over its endpoint's baseline.
  Not the least latency: on a busy client machine a few replies are read far sooner than the rest (the
  event loop happened to be free), and a baseline at those made every ordinary reply look queued: a
  participant that kept up was held at 5-11 of its declared 16 (measured: docs/benchmarks.md).
- Every ``max(min_window, limit)`` replies (about one round of the limit), the median ratio of the window
  decides: at most ``tolerance``: the participant served them about as fast as unloaded, so the limit
  grows (doubles until the first decrease, then by one a window); above: requests queued at the
  participant, and the limit shrinks to ``limit * tolerance / median`` (at most halved), so that the
  expected latency comes back under ``tolerance`` times the baseline.

A baseline needs some unloaded latencies among the endpoint's own: an endpoint whose requests only ever
ran beside others (a sample's Searches that start while another sample's Adds are in flight, at a limit
already above 1) has a 10th percentile that is itself a queued latency, and every ratio reads about 1
(measured: the limit grew to 8 against a one-at-a-time participant and a 35 ms Search was reported at
294 ms; docs/benchmarks.md). So each endpoint's first request is a *probe* (:meth:`AdaptiveLimit.wants_probe`):
the client sends it once nothing is in flight and sends nothing else until its reply, and every lone reply
(no other request in flight from send to reply) is kept. When the quantile baseline is more than
``tolerance`` times the median of the last :data:`ALONE_SAMPLES` lone latencies, the lone median is the
baseline. A participant that keeps up answers queued requests about as fast as a lone one, so its
quantile baseline stands (client jitter does not turn into a lower baseline).

Only replies of requests sent with the limit filled (as many in flight as it allows, themselves included)
can raise it: the limit grows when at least half of the window's replies are such and their median ratio
is at most ``tolerance``. A request sent below the limit (the client had fewer to send, as with a single
sample's Adds, which go one after another) shows that fewer requests than the limit do not queue, not
that more would not (TCP's congestion-window validation, RFC 7661, keeps an application-limited window
so); its latency still counts towards a decrease. Without this, slow start doubled the limit on one
sample's Adds to 32 with never more than one in flight, and that sample's Searches then went 32 at once
to a participant that serves one request at a time.

A participant that serves one request at a time answers ``n`` requests in flight in about ``n`` times
its service time: at 2 in flight the median ratio is about 2 (> 1.5) and the limit falls to 1; at 1 it
is about 1 and the limit grows to 2, so such a participant has one or two requests in flight. One that
serves all it declares answers at its baseline (plus the client's own jitter) whatever the number in
flight, and its limit climbs to the declared one. Only latency drives it: error statuses (429/503) are
retried by the retry policy and do not move the limit, so a participant's faults never shrink it.

Plain Python, no Ray, no clock: tested directly (``tests/test_adaptive_limit.py``).
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Hashable
from typing import Any

#: Largest ratio of median latency to baseline taken as "not queueing" (see the module docstring).
DEFAULT_TOLERANCE = 1.5
#: Fewest replies a decision reads (a limit of 1 would otherwise decide on every reply).
MIN_WINDOW = 4
#: Half the latencies each endpoint's baseline is taken over (the last ``2 * BASELINE_SAMPLES``).
BASELINE_SAMPLES = 256
#: The quantile of those latencies taken as the endpoint's unloaded latency.
BASELINE_QUANTILE = 0.1
#: Lone latencies (no other request in flight) kept per endpoint; their median checks the quantile baseline.
ALONE_SAMPLES = 8
#: Most limit changes kept in :meth:`AdaptiveLimit.describe`'s trajectory (the first ones, then the last).
TRAJECTORY_KEEP = 200


class _Baseline:
    """An endpoint's unloaded latency (ms), read at each decision.

    The :data:`BASELINE_QUANTILE` of its last ``2 * size`` latencies, unless that is more than the limit's
    ``tolerance`` times the median of its last :data:`ALONE_SAMPLES` *lone* latencies (replies of requests that had no
    other request in flight from sending to reply): then every recent latency was a queued one, and the
    lone median is the unloaded latency.
    """

    __slots__ = ("recent", "alone")

    def __init__(self, size: int):
        self.recent: deque[float] = deque(maxlen=2 * size)
        self.alone: deque[float] = deque(maxlen=ALONE_SAMPLES)

    def add(self, latency_ms: float, alone: bool) -> None:
        self.recent.append(latency_ms)
        if alone:
            self.alone.append(latency_ms)

    def value(self, tolerance: float) -> float:
        ordered = sorted(self.recent)
        low = ordered[int(BASELINE_QUANTILE * (len(ordered) - 1))]
        if self.alone:
            lone = statistics.median(self.alone)
            if low > tolerance * lone:
                return lone
        return low


class AdaptiveLimit:
    """How many requests may be in flight to one participant now: between 1 and ``max_limit``.

    Args:
        max_limit: the declared ``max_in_flight`` (the limit never exceeds it).
        initial: the starting limit (default 1: slow start finds the declared limit in about
            ``log2(max_limit)`` windows when the participant keeps up).
        tolerance: largest median latency / baseline ratio taken as "not queueing" (> 1).
        min_window: fewest replies per decision.
        baseline_samples: half the latencies an endpoint's baseline is taken over (:class:`_Baseline`).
        enabled: False: the limit stays at ``max_limit`` (the declared capacity as a fixed limit).

    Raises:
        ValueError: ``max_limit`` < 1, ``tolerance`` <= 1 or ``min_window`` < 1, naming the argument.
    """

    def __init__(self, max_limit: int, *, initial: int = 1, tolerance: float = DEFAULT_TOLERANCE,
                 min_window: int = MIN_WINDOW, baseline_samples: int = BASELINE_SAMPLES, enabled: bool = True):
        if max_limit < 1:
            raise ValueError(f"max_limit must be >= 1, got {max_limit}")
        if tolerance <= 1:
            raise ValueError(f"tolerance must be > 1 (a latency ratio), got {tolerance}")
        if min_window < 1:
            raise ValueError(f"min_window must be >= 1, got {min_window}")
        self.max_limit, self.tolerance, self.min_window = max_limit, tolerance, min_window
        self.enabled = enabled
        self.limit = float(max_limit if not enabled else max(1, min(initial, max_limit)))
        self._slow_start = True
        self._baseline_samples = baseline_samples
        self._baselines: dict[Hashable, _Baseline] = {}
        # (its endpoint's baseline, latency ms, sent with the limit filled)
        self._window: list[tuple[_Baseline, float, bool]] = []
        self._seen_min = self._seen_max = self.allowed()
        self._decisions = 0
        self._head: list[tuple[int, int]] = [(0, self.allowed())]  # (replies so far, allowed) at each change
        self._tail: list[tuple[int, int]] = []
        self._replies = 0

    def allowed(self) -> int:
        """Requests that may be in flight now: ``floor(limit)``, between 1 and ``max_limit``."""
        return max(1, min(self.max_limit, int(self.limit)))

    def wants_probe(self, key: Hashable) -> bool:
        """True while endpoint ``key`` has no lone reply yet: its next request should be sent alone.

        The caller (:meth:`aml_ray.actors.participant.ParticipantClient._sender`) then waits until nothing
        is in flight, sends it, and sends nothing else until its reply: one lone latency per endpoint, so
        an endpoint whose requests only ever ran beside others (Searches that start while another
        sample's Adds are in flight) still has a true unloaded latency (:class:`_Baseline`).
        """
        if not self.enabled or self.max_limit == 1:
            return False
        baseline = self._baselines.get(key)
        return baseline is None or not baseline.alone

    def seed(self, key: Hashable, latency_ms: float) -> None:
        """Take ``latency_ms`` as a lone reply of endpoint ``key`` measured before this limit's first request
        (the run's pre-flight probe, sent with nothing else in flight: :mod:`aml_ray.run.preflight`).

        It joins the endpoint's baseline, so the endpoint needs no probe of its own (:meth:`wants_probe`);
        it is not one of this limit's replies (no window, no decision, not in :meth:`describe`).
        """
        if not self.enabled:
            return
        baseline = self._baselines.get(key)
        if baseline is None:
            baseline = self._baselines[key] = _Baseline(self._baseline_samples)
        baseline.add(max(latency_ms, 1e-3), alone=True)

    def start_at(self, limit: int) -> None:
        """Raise the limit to ``limit`` (within ``max_limit``) if it has seen no reply yet: another client's
        estimate of the same participant's capacity (the driver's head start at its handover), instead of
        slow start from :attr:`limit` again. A limit that has seen replies keeps its own estimate."""
        if not self.enabled or self._replies:
            return
        self.limit = float(max(self.limit, min(self.max_limit, limit)))
        self._seen_min = self._seen_max = self.allowed()
        self._head = [(0, self.allowed())]

    def record(self, key: Hashable, latency_ms: float, alone: bool = False, at_limit: bool = True) -> None:
        """One reply of endpoint ``key`` took ``latency_ms`` at the participant (sent to reply).

        ``alone``: no other request to this participant was in flight from its sending to its reply.
        ``at_limit``: it was sent with the limit filled (as many in flight as the limit allowed then, itself
        included); only such replies can raise the limit (module docstring). The sender knows it, not this
        object: the limit may have changed between the send and the reply.
        """
        self._replies += 1
        if not self.enabled:
            return
        baseline = self._baselines.get(key)
        if baseline is None:
            baseline = self._baselines[key] = _Baseline(self._baseline_samples)
        latency_ms = max(latency_ms, 1e-3)
        baseline.add(latency_ms, alone)
        self._window.append((baseline, latency_ms, at_limit))
        if len(self._window) >= max(self.min_window, self.allowed()):
            # one sort per endpoint per decision (about one round of the limit), not per reply
            floors = {id(b): b.value(self.tolerance) for b, _, _ in self._window}
            ratios = [(lat / floors[id(b)], filled) for b, lat, filled in self._window]
            filled_ratios = [ratio for ratio, filled in ratios if filled]
            self._decide(statistics.median(ratio for ratio, _ in ratios),
                         statistics.median(filled_ratios) if 2 * len(filled_ratios) >= len(ratios) else None)
            self._window.clear()

    def _decide(self, median_ratio: float, median_at_limit: float | None) -> None:
        """``median_ratio``: the window's median latency ratio; ``median_at_limit``: that of its replies sent with
        the limit filled, None when fewer than half were (then it does not grow)."""
        before = self.allowed()
        self._decisions += 1
        if median_ratio <= self.tolerance:
            if median_at_limit is None or median_at_limit > self.tolerance:
                return  # fewer requests than the limit did not queue: nothing said about more
            grown = self.limit * 2 if self._slow_start else self.limit + 1
            self.limit = min(float(self.max_limit), grown)
        else:
            self._slow_start = False
            self.limit = max(1.0, self.limit * max(0.5, self.tolerance / median_ratio))
        now = self.allowed()
        if now != before:
            self._seen_min, self._seen_max = min(self._seen_min, now), max(self._seen_max, now)
            change = (self._replies, now)
            if len(self._head) < TRAJECTORY_KEEP // 2:
                self._head.append(change)
            else:
                self._tail = [*self._tail[-(TRAJECTORY_KEEP // 2 - 1):], change]

    def unloaded_ms(self) -> dict[Hashable, float]:
        """Each endpoint's unloaded latency now, in ms: its baseline (:class:`_Baseline`), what a reply takes with
        nothing queued ahead of it at the participant, as the decisions read it. Endpoints with no reply yet (and
        every endpoint of a limit that is not ``enabled``: it keeps no baseline) are left out."""
        return {key: baseline.value(self.tolerance) for key, baseline in self._baselines.items()}

    def describe(self) -> dict[str, Any]:
        """The limit's trajectory for run.json.

        Returns:
            ``{"adaptive", "declared", "min", "max", "final", "decisions", "replies", "trajectory"}``:
            ``min``/``max``/``final`` of the allowed in-flight count; ``trajectory`` ``[[replies, allowed],
            ...]``, one entry per change (the first and last :data:`TRAJECTORY_KEEP` / 2 kept).
        """
        return {"adaptive": self.enabled, "declared": self.max_limit, "min": self._seen_min,
                "max": self._seen_max, "final": self.allowed(), "decisions": self._decisions,
                "replies": self._replies, "trajectory": [list(c) for c in self._head + self._tail]}
