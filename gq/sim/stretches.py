"""Stretches on the simulated node: who runs next on each free lane (the policy's pick, as
the execution host asks it) and for how many iterations, the turns that sharing jobs take
settled as one window, a stretch cut short when the pick may change, and each one settled as
it ends (the job's progress, the timeline, the busy time).

Part of the simulation (:class:`gq.sim.simulator._Simulation`), whose event loop sets up the
state declared here."""

from __future__ import annotations

import math
from collections.abc import Callable

from gq.exec.lane import rule as lane_rule
from gq.policies import JobView, Policy
from gq.policies.base import TakesTurns, anticipation_window, run_length
from gq.sim import side, turns
from gq.sim.events import READY, STRETCH_END, EventQueue
from gq.sim.node import EPSILON, MEASURED_AFTER, JobRun, Lane, SharedWindow, Stretch
from gq.sim.results import Slice


class Stretches(EventQueue):
    """Dispatching, cutting and settling stretches on the simulated node's lanes."""

    policy: Policy
    turn_taker: TakesTurns | None  # the policy, where it takes turns (asked once: it is slow)
    lanes_per_device: int
    lanes: list[Lane]
    runs: dict[int, JobRun]
    switch_cost: float
    step_by_step: bool
    share_slice: float
    slices: list[Slice]
    busy: float
    stretches: int  # scheduled so far
    _ended: Callable[[JobRun], None]  # the event loop's: a job has ended

    def _cut(self, lane: Lane, now: float) -> None:
        """The lane's pick may change: end its stretch at the next iteration boundary."""
        stretch = lane.stretch
        if stretch is None or stretch.end <= now or isinstance(stretch, SharedWindow):
            return
        done, end = stretch.boundary_after(now)
        if done >= stretch.count:
            return
        stretch.count, stretch.end = done, end
        stretch.version = self.sequence
        self._push(end, STRETCH_END, (lane.index, stretch.version))

    def _end_stretch(self, payload: tuple[int, int], now: float) -> bool:
        """Settle a stretch; True if its job ended (and left room)."""
        index, version = payload
        lane = self.lanes[index]
        stretch = lane.stretch
        if stretch is None or stretch.version != version:
            return False  # cut short and re-dated
        if isinstance(stretch, SharedWindow):
            self._settle_window(lane, stretch, now)
            return False
        run = stretch.run
        self._record(lane, stretch)
        run.finish_iterations(stretch.count, stretch.released_at)
        run.held += stretch.released_at - stretch.begin
        run.timed |= len(lane.residents) > 1 and run.done >= MEASURED_AFTER
        for other in run.lanes:
            self.lanes[other].stretch = None
            self.lanes[other].owner = None
        if run.done >= run.job.iterations:
            # Its process sleeps through its last gap, then exits (taking its teardown):
            # resident until then, and never ready again.
            run.end = run.ready_at = run.ready_at + run.job.teardown
            self._ended(run)
            if run.end <= now:
                self._leave(run)
                return True
        if run.ready_at > now:
            self._push(run.ready_at, READY, run.job.id)
        return False

    def _leave(self, run: JobRun) -> None:
        for index in run.lanes:
            self.lanes[index].residents.remove(run)

    def _settle_window(self, lane: Lane, window: SharedWindow, now: float) -> None:
        """Credit each job its turns (none ends inside a window); on the timeline each job's
        turns are drawn as one piece, in turn order of their first grant."""
        begin = window.begin
        for run, count in window.counts:
            run.finish_iterations(count, now)
            run.timed |= run.done >= MEASURED_AFTER  # (a window's jobs take turns)
            length = count * run.job.iteration_time
            run.held += length
            self.slices.append(self._slice(lane, run, begin, begin + length))
            self.busy += length * run.job.busy
            begin += length
        lane.stretch = None
        lane.last_job = None

    def _record_under_way(self) -> None:
        """Record the stretches under way as their ends would, where a run ends before they
        settle (what began before a job's end shares its lane's basis). A window of turns
        forms only while every resident of its lane is ready, so none begins before the end
        of a job there."""
        for lane in self.lanes:
            if isinstance(lane.stretch, Stretch) and lane.owner is None:
                self._record(lane, lane.stretch)

    def _record(self, lane: Lane, stretch: Stretch) -> None:
        run = stretch.run
        end = stretch.released_at
        # (the device time it kept busy: its share of its iterations at its speed alone)
        self.busy += stretch.count * run.job.iteration_time * run.job.busy * len(run.lanes)
        previous = self.slices[-1] if self.slices else None
        if previous and (previous.device, previous.lane, previous.job, previous.end) == (
            lane.device,
            lane.index % self.lanes_per_device,
            run.job.id,
            stretch.begin,
        ):
            self.slices[-1] = self._slice(lane, run, previous.start, end)
        else:
            self.slices.append(self._slice(lane, run, stretch.begin, end))

    def _slice(self, lane: Lane, run: JobRun, start: float, end: float) -> Slice:
        return Slice(lane.device, run.job.id, start, end, lane.index % self.lanes_per_device)

    def _dispatch(self, now: float) -> None:
        for lane in self.lanes:
            if lane.stretch is not None or lane.owner is not None:
                continue
            ready, ready_views, resident_views, in_gaps = self._candidates(lane, now)
            if not ready:
                continue
            decision = lane_rule.next_step(self.policy, ready_views, resident_views, in_gaps, now)
            if not isinstance(decision, lane_rule.Grant):
                continue
            chosen_view = decision.job
            run = self.runs[chosen_view.id]
            if any(self.lanes[i].stretch is not None for i in run.lanes):
                continue
            window = self._shared_window(lane, ready, ready_views, now)
            if window is not None:
                lane.stretch = window
                self.stretches += 1
                self._push(window.end, STRETCH_END, (lane.index, window.version))
                continue
            switch = self.switch_cost if lane.last_job not in (None, run.job.id) else 0.0
            begin = now + switch
            run.slow = self._slowdown(lane, run)
            count = self._length(lane, run, chosen_view, ready_views, resident_views, begin)
            stretch = Stretch(run, begin, count, run.release_after(begin, count), self.sequence)
            for index in run.lanes:
                self.lanes[index].stretch = stretch
                self.lanes[index].last_job = run.job.id
                if index != lane.index:
                    self.lanes[index].owner = run
            self.stretches += 1
            self._push(stretch.end, STRETCH_END, (lane.index, stretch.version))

    def _candidates(
        self, lane: Lane, now: float
    ) -> tuple[list[JobRun], list[JobView], list[JobView], list[lane_rule.Awaited]]:
        """The lane's residents ready now (those it leads), their views, every resident's
        view, and the ones in a gap the lane may be kept for: in one pass, since a
        simulation asks at every iteration of every job."""
        ready: list[JobRun] = []
        ready_views: list[JobView] = []
        resident_views: list[JobView] = []
        in_gaps: list[lane_rule.Awaited] = []
        for run in lane.residents:
            view = run.view()
            resident_views.append(view)
            if run.ready_at <= now:
                if run.lanes[0] == lane.index:
                    ready.append(run)
                    ready_views.append(view)
            elif run.released_at is not None:
                awaited = lane_rule.awaited(view, run.released_at, self._measured_gap(run))
                if awaited is not None:
                    in_gaps.append(awaited)
        return ready, ready_views, resident_views, in_gaps

    def _running_beside(self, lane: Lane) -> list[float]:
        """The busy shares of the jobs running now on the other lanes of the lane's device:
        a window's turns, the largest of its jobs'; a stretch that holds its lane through
        its job's gaps, that job's share over its iterations and gaps (on average: a stretch
        is not cut at each gap)."""
        per = self.lanes_per_device
        shares = []
        for other in self.lanes[lane.device * per : (lane.device + 1) * per]:
            held = other.stretch
            if other is lane or held is None:
                continue
            if isinstance(held, SharedWindow):
                shares.append(max(r.job.busy for r, _ in held.counts))
                continue
            run = held.run
            alone = run.job.iteration_time * run.slow
            through = held.count > 1 and run.job.gap > 0
            shares.append(run.job.busy * (alone / run.period if through else 1.0))
        return shares

    def _slowdown(self, lane: Lane, run: JobRun) -> float:
        """How much slower than alone ``run`` goes on ``lane`` beside what runs there now
        (a job on several devices has them to itself)."""
        if self.lanes_per_device < 2 or len(run.lanes) > 1:
            return 1.0
        return side.slowdown([run.job.busy, *self._running_beside(lane)])

    def _beside_resident(self, lane: Lane) -> bool:
        """Whether another lane of the lane's device has jobs."""
        per = self.lanes_per_device
        device = self.lanes[lane.device * per : (lane.device + 1) * per]
        return any(other.residents for other in device if other is not lane)

    def _reslow(self, now: float) -> None:
        """Stretches whose device's jobs at once changed: one not begun yet is re-dated at
        the speed it has now; one under way ends at its next iteration boundary, to go on
        at that speed (an iteration runs at the speed it began at)."""
        if self.lanes_per_device < 2:
            return
        for lane in self.lanes:
            stretch = lane.stretch
            if not isinstance(stretch, Stretch) or stretch.end <= now or lane.owner is not None:
                continue
            run = stretch.run
            slow = self._slowdown(lane, run)
            if abs(slow - run.slow) <= EPSILON * slow:
                continue
            if stretch.begin >= now:
                run.slow = slow
                stretch.end = run.release_after(stretch.begin, stretch.count)
                stretch.version = self.sequence
                self._push(stretch.end, STRETCH_END, (lane.index, stretch.version))
            else:
                self._cut(lane, now)

    @staticmethod
    def _measured_gap(run: JobRun) -> float | None:
        """The job's gap as its host knows it: measured once it has run a few iterations."""
        return run.job.gap if run.job.gap > 0 and run.done >= MEASURED_AFTER else None

    @classmethod
    def _anticipated(cls, run: JobRun) -> bool:
        """Whether the host would keep the lane for the job in its gaps, if preferred."""
        return anticipation_window(cls._measured_gap(run)) is not None

    def _shared_window(
        self, lane: Lane, ready: list[JobRun], ready_views: list[JobView], now: float
    ) -> SharedWindow | None:
        """The turns the policy's sharers take before the next event, settled at once
        (:mod:`gq.sim.turns`); None where ordinary stretches are due: some resident job is
        not ready, a switch has a cost, or there is not room for two turns each."""
        policy = self.turn_taker
        if (
            policy is None
            or self.step_by_step
            or self.switch_cost
            or self.share_slice
            or len(ready) != len(lane.residents)
            # (turns settled at once keep one speed: none while other lanes run beside)
            or (self.lanes_per_device > 1 and self._beside_resident(lane))
        ):
            return None
        views = policy.sharers(ready_views)
        group = [self.runs[view.id] for view in views]
        if len(group) < 2 or any(r.gpus > 1 or r.job.gap for r in group):
            return None
        budget = self.events[0][0] - now if self.events else math.inf
        if budget < 2 * sum(r.job.iteration_time for r in group):
            return None
        service = policy.service
        counts = turns.settle(
            policy,
            [
                turns.Sharer(
                    view,
                    run.job.iteration_time,
                    service(run.projected(1, None)) - service(view),
                    run.job.iterations - run.done - 1,
                )
                for view, run in zip(views, group)
            ],
            budget,
        )
        if counts is None or sum(counts) < 2 * len(group):
            return None
        order = sorted(
            zip(group, counts),
            key=lambda pair: (pair[0].attained, pair[0].job.submit_time, pair[0].job.id),
        )
        length = sum(n * r.job.iteration_time for r, n in order)
        for run in group:
            run.slow = 1.0
        return SharedWindow([(r, n) for r, n in order if n], now, now + length, self.sequence)

    def _length(
        self,
        lane: Lane,
        run: JobRun,
        chosen: JobView,
        ready: list[JobView],
        resident: list[JobView],
        begin: float,
    ) -> int:
        """How many iterations the chosen job runs before the policy is asked again. A job
        with gaps runs one, unless nothing else could take the lane in its gaps: it is alone
        on the lane, or the host anticipates it."""
        left = run.job.iterations - run.done
        if self.step_by_step:
            return 1
        if run.job.gap and len(resident) > 1 and not self._anticipated(run):
            return 1
        if run.done < MEASURED_AFTER:  # its view changes in kind once its pace is known
            left = min(left, MEASURED_AFTER - run.done)
        waking = [r.ready_at for r in lane.residents if r.ready_at > begin]
        if waking:
            # A job becoming ready cuts the stretch after the iteration running then; asking
            # beyond it could even mislead: gapfit's pick returns once a gap has overrun.
            left = min(left, max(1, math.ceil((min(waking) - begin) / run.period - EPSILON)))
        if len(resident) == 1:
            return left
        period = run.period
        count = run_length(
            self.policy,
            chosen,
            ready,
            resident,
            lambda k: (run.projected(k, run.release_after(begin, k)), begin + k * period),
            left,
        )
        if self.share_slice and count < left:
            count = min(left, max(count, math.ceil(self.share_slice * run.job.iterations)))
        return count
