"""Admission: which pending jobs become resident on which device and lane (pure; the daemon
and the simulator both call :func:`place`).

A job fits a lane while Σ persistent + max ephemeral ≤ lane capacity over the lane's jobs
(the Salus condition; on a GPU each job's persistent memory counts its CUDA context too),
the device's resident cap is not reached, and no exclusive job holds the device, nor the
thermal and power guard holds it. Jobs are taken in the policy's order.
A shared job goes where it leaves the most headroom (free memory under the safety
condition), then to the fewest resident jobs, then to the least measured utilization; a job
of k whole devices takes the k empty ones that leave the largest contiguous free set, then
the closest linked ones (NVLink or one PCIe switch, where NVML reports topology). While
another user's job waits, a user takes no more than their part of a device's resident slots
(:mod:`gq.daemon.scheduling.residency`); their later jobs wait behind the one refused so.

EASY backfill: the first job that cannot be placed reserves the devices it will get first,
at the time the jobs on them must have ended (their time limits). A later job may start only
if it leaves those devices alone or its own time limit ends before that reserved start, so
the blocked job never starts later than it would have without backfill. A job without a
time limit is not backfilled onto reserved devices.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gq.daemon.scheduling.residency import SLOTS, Kind, Wanting, within_part

RESOURCES = "Resources"  # squeue's reason: next in line, no room yet
NODE_ROOM = "Resources (the node's host memory or CPUs)"
PRIORITY = "Priority"  # behind a blocked job
NO_LIMIT = "Priority (no --time: not backfilled)"
START_SLACK = 1.0  # seconds a predicted start may lose to bind a job now rather than wait
# The reasons of jobs that wait for room on a device (not the node's, nor the guard's).
WAITS_FOR_ROOM = frozenset({RESOURCES, PRIORITY, SLOTS})


@dataclass(frozen=True)
class Footprint:
    persistent: int = 0
    ephemeral: int = 0


@dataclass
class LaneLoad:
    capacity: int
    footprints: list[Footprint] = field(default_factory=list)
    # Seconds until a job placed here now would get its first iteration, as the policy
    # runs the lane (fifo: once the residents before it have ended; 0 where the policy lets
    # a newcomer in within their idle time or by its turn; infinity: unknown).
    starts_in: float = 0.0
    # Bytes each resident job holds beyond its figure, whatever it does: on a GPU, its
    # process's CUDA context (NVML counts it; PyTorch's allocator does not).
    overhead: int = 0

    def need(self, extra: Footprint | None = None) -> int:
        every = self.footprints + ([extra] if extra is not None else [])
        if not every:
            return 0
        return sum(f.persistent + self.overhead for f in every) + max(f.ephemeral for f in every)

    def fits(self, extra: Footprint) -> bool:
        """Whether ``extra`` fits beside the lane's jobs (one that adds nothing always does:
        a probe's lane, taken whole, still takes a plain process)."""
        if extra.persistent == 0 and extra.ephemeral == 0:
            return True
        return self.need(extra) <= self.capacity

    def fits_alone(self, job: Footprint) -> bool:
        """Whether the job would fit here once the lane's residents have gone."""
        return job.persistent + self.overhead + job.ephemeral <= self.capacity

    def headroom(self, extra: Footprint | None = None) -> int:
        return self.capacity - self.need(extra)


@dataclass
class DeviceLoad:
    name: str
    gpu: bool  # a device jobs ask for by number (a GPU or an emulated one)
    lanes: list[LaneLoad]
    max_resident: int
    index: int = 0
    residents: int = 0
    by_user: dict[str, int] = field(default_factory=dict)  # the residents of each user
    exclusive: bool = False
    free_at: float = 0.0  # when every job on it must have ended (inf: one has no time limit)
    utilization: float = 0.0  # percent busy, as last sampled
    held: str | None = None  # why the thermal and power guard admits no job to it now
    links: tuple[int, ...] = ()  # topology level to each other device by index; lower: closer

    @property
    def empty(self) -> bool:
        return self.residents == 0


@dataclass(frozen=True)
class Request:
    job_id: int
    gpus: int
    footprint: Footprint
    exclusive: bool = False
    time_limit: float | None = None  # seconds
    only: frozenset[str] | None = None  # the devices it may use (a GPU type); None: any
    host_mem: int = 0  # bytes of the node's RAM it reserves (--host-mem, #SBATCH --mem)
    cpus: int = 0  # CPUs it reserves (-c)
    user: str = ""  # whose: a user takes their part of a device's slots while others wait


def has_devices_alone(exclusive: bool, python: bool, gpus: int, on_gpus: bool) -> bool:
    """Whether a job has its devices to itself: it asked (``--exclusive``), or it is no
    Python script run by gq's worker (a shell script, a program) and asks for GPUs
    (``on_gpus``: the node's GPUs, or emulated ones). Such a job's processes use the device
    outside any lane (gq finds no iteration in them), so beside a lane's holder their
    kernels would run at once with its; alone, its memory is the device's, as NVML counts
    it. (A Python job's own children, DataLoader workers, are the worker's business.)"""
    return exclusive or (not python and gpus >= 1 and on_gpus)


@dataclass
class NodeRoom:
    """What the node has left for jobs that reserve host memory or CPUs (as Slurm's
    CR_Core_Memory counts them); jobs that name neither reserve nothing."""

    memory: int
    cpus: int

    def fits(self, request: Request) -> bool:
        return request.host_mem <= self.memory and request.cpus <= self.cpus

    def take(self, request: Request) -> None:
        self.memory -= request.host_mem
        self.cpus -= request.cpus


@dataclass(frozen=True)
class Placement:
    job_id: int
    devices: tuple[str, ...]
    lane: int


@dataclass
class Outcome:
    placements: list[Placement]
    reasons: dict[int, str]  # why each job that was not placed waits
    reserved: tuple[str, ...] = ()  # the devices held for the first blocked job
    reserved_start: float | None = None


def place(
    ordered: Sequence[Request],
    devices: Sequence[DeviceLoad],
    now: float = 0.0,
    backfill: bool = True,
    node: NodeRoom | None = None,
    waits_behind: bool = False,
) -> Outcome:
    """Place the jobs in order (see the module's text). ``waits_behind``: the policy makes
    a newcomer wait for the residents before it (fifo), so a job placed on a lane in this
    pass adds its time limit (unknown: forever) to the wait of the ones placed after it."""
    outcome = Outcome([], {})
    reserved: set[str] = set()
    full = _full(devices)
    reach: dict[Kind, list[DeviceLoad]] = {}

    def candidates_of(gpus: int, only: frozenset[str] | None) -> list[DeviceLoad]:
        """The devices a job may use (alike jobs ask alike: worked out once a pass)."""
        found = reach.get((gpus, only))
        if found is None:
            found = reach[gpus, only] = usable(gpus, only, devices)
        return found

    # Whose jobs wait for a slot where (a user's part: gq.daemon.scheduling.residency).
    wanting = Wanting(
        (
            (r.user, (r.gpus, r.only))
            for r in ordered
            if _shares_a_device(r) and (node is None or node.fits(r))
        ),
        lambda kind: {d.name for d in candidates_of(*kind)},
    )
    held_back: set[str] = set()  # users refused a slot in this pass: their later jobs wait
    for request in ordered:
        if full and outcome.reserved_start is not None:
            # Nothing fits anywhere: what the long tail of a big queue costs a pass.
            outcome.reasons[request.job_id] = (
                NODE_ROOM if node is not None and not node.fits(request) else PRIORITY
            )
            continue
        candidates = candidates_of(request.gpus, request.only)
        if node is not None and not node.fits(request):
            # Its devices are not what it waits for: it reserves none, and delays no one.
            outcome.reasons[request.job_id] = NODE_ROOM
            continue
        if request.user in held_back:
            outcome.reasons[request.job_id] = SLOTS
            continue
        placement = _choose(request, candidates, wanting=wanting)
        if placement is None and _choose(request, candidates) is not None:
            outcome.reasons[request.job_id] = SLOTS  # its user's part is taken: not room
            held_back.add(request.user)
            continue
        if outcome.reserved_start is None:
            if placement is not None:
                _commit(placement, request, devices, now, node, waits_behind)
                outcome.placements.append(placement)
                if _shares_a_device(request):
                    wanting.placed(request.user, (request.gpus, request.only))
                full = _full(devices)
                continue
            outcome.reasons[request.job_id] = _why(RESOURCES, request, candidates)
            start, held = _reservation(request, candidates, now)
            outcome.reserved_start, outcome.reserved = start, tuple(sorted(held))
            reserved = set(held)
            if not backfill:
                reserved = {d.name for d in candidates}
            continue
        # An unknown reserved start (a running job has no limit) admits no job before it.
        ends_in_time = (
            backfill
            and request.time_limit is not None
            and outcome.reserved_start != math.inf
            and now + request.time_limit <= outcome.reserved_start
        )
        if placement is not None and set(placement.devices) & reserved and not ends_in_time:
            # It would delay the blocked job there: only devices it does not wait for.
            placement = _choose(
                request, [d for d in candidates if d.name not in reserved], wanting=wanting
            )
            if placement is None:
                outcome.reasons[request.job_id] = (
                    NO_LIMIT if backfill and request.time_limit is None else PRIORITY
                )
                continue
        if placement is None:
            outcome.reasons[request.job_id] = _why(PRIORITY, request, candidates)
            continue
        _commit(placement, request, devices, now, node, waits_behind)
        outcome.placements.append(placement)
        if _shares_a_device(request):
            wanting.placed(request.user, (request.gpus, request.only))
        full = _full(devices)
    return outcome


def _shares_a_device(request: Request) -> bool:
    """Whether a job takes one slot of a device it shares (not devices of its own)."""
    return not (request.exclusive or request.gpus > 1)


def usable(
    gpus: int, only: frozenset[str] | None, devices: Sequence[DeviceLoad]
) -> list[DeviceLoad]:
    """The devices a job of ``gpus`` devices may use at all: the GPUs (or emulated ones)
    for -G 1 and more, the ``cpu`` device for -G 0 (or a whole device to share, where the
    node has nothing else), of its type and named devices (``only``)."""
    has_whole = any(d.gpu for d in devices)
    candidates = [d for d in devices if d.gpu == (has_whole and gpus > 0)] or list(devices)
    return candidates if only is None else [d for d in candidates if d.name in only]


def _full(devices: Sequence[DeviceLoad]) -> bool:
    """Whether no job of any kind could become resident on any device now."""
    return not any(d.empty or _takes_shared(d) for d in devices)


@dataclass(frozen=True)
class Unstarted:
    """A resident job that has run no iteration yet (so nothing of it is lost if it moves):
    where it is, and when it is predicted to get its first iteration there."""

    job_id: int
    device: str
    footprint: Footprint
    starts_in: float
    gpus: int  # as its request: the devices it may move to are those it may use at all
    only: frozenset[str] | None


def move(waiting: Sequence[Unstarted], devices: Sequence[DeviceLoad], margin: float) -> int | None:
    """The job to move (one per pass: the one that gains most), where another device it
    may use, with room, would start it sooner by more than ``margin`` seconds; None if none
    would."""
    best_gain, chosen = margin, None
    for job in waiting:
        elsewhere = [
            lane.starts_in
            for device in usable(job.gpus, job.only, devices)
            if device.name != job.device and _takes_shared(device) and device.held is None
            for lane in device.lanes
            if lane.fits(job.footprint)
        ]
        gain = job.starts_in - min(elsewhere, default=math.inf)
        if gain > best_gain:
            best_gain, chosen = gain, job.job_id
    return chosen


def _reservation(
    request: Request, candidates: list[DeviceLoad], now: float
) -> tuple[float, set[str]]:
    """When, and on which devices, the blocked job will start at the latest."""
    count = max(1, request.gpus) if (request.exclusive or request.gpus > 1) else 1
    soonest = sorted(candidates, key=lambda d: (max(d.free_at, now), d.index))[:count]
    start = max((max(d.free_at, now) for d in soonest), default=math.inf)
    return start, {d.name for d in soonest}


def _why(reason: str, request: Request, candidates: list[DeviceLoad]) -> str:
    """``reason``, with the guard's words where it holds the devices the job would fit on."""
    if not any(d.held for d in candidates) or _choose(request, candidates, guarded=False) is None:
        return reason
    return f"{reason} ({'; '.join(d.held for d in candidates if d.held)})"


def _choose(
    request: Request,
    devices: list[DeviceLoad],
    guarded: bool = True,
    wanting: Wanting | None = None,
) -> Placement | None:
    """Where the job would go now, without taking the room yet (``guarded``: not onto a
    device the thermal and power guard holds; ``wanting``: whose jobs wait for a slot
    where, whom its user leaves their part of each device's slots)."""
    if guarded:
        devices = [d for d in devices if d.held is None]
    if request.exclusive or request.gpus > 1:
        count = max(1, request.gpus)
        empty = [d for d in devices if d.empty]
        if len(empty) < count:
            return None
        chosen = _least_fragmenting(empty, count)
        return Placement(request.job_id, tuple(d.name for d in chosen), 0)
    options = []
    for device in devices:
        if not _takes_shared(device) or (
            wanting is not None
            and not within_part(
                device.by_user,
                device.max_resident,
                request.user,
                wanting.others(device.name, request.user),
            )
        ):
            continue
        for index, lane in enumerate(device.lanes):
            if lane.fits(request.footprint):
                # to the millisecond: predictions that differ by rounding are a tie
                options.append(
                    (
                        round(lane.starts_in, 3),
                        -lane.headroom(request.footprint),
                        device.residents,
                        device.utilization,
                        len(lane.footprints),
                        device.index,
                        device.name,
                        index,
                    )
                )
    if not options:
        return None
    best = min(options)
    # Bound now behind residents that end later than those of a device it cannot enter
    # yet, it would wait longer than in the queue: it waits there, free to go either way.
    if best[0] > _soonest_start(request, devices) + START_SLACK:
        return None
    return Placement(request.job_id, (best[-2],), best[-1])


def _takes_shared(device: DeviceLoad) -> bool:
    """Whether a job sharing a device may become resident there now (a lane permitting)."""
    return not device.exclusive and device.residents < device.max_resident


def _soonest_start(request: Request, devices: list[DeviceLoad]) -> float:
    """When the job could get its first iteration at the soonest on any of the devices, full
    ones included (once what is resident there before it has ended)."""
    return min(
        (
            lane.starts_in
            for device in devices
            for lane in device.lanes
            if lane.fits_alone(request.footprint)
        ),
        default=math.inf,
    )


def _least_fragmenting(empty: list[DeviceLoad], count: int) -> list[DeviceLoad]:
    """The ``count`` empty devices that leave the largest contiguous run of empty ones, then
    the closest linked, then the least spread."""
    if len(empty) > 12:  # too many to try every set: the first ones
        return sorted(empty, key=lambda d: d.index)[:count]

    def distance(chosen: Iterable[DeviceLoad]) -> int:
        return sum(
            first.links[second.index]
            for first, second in itertools.combinations(chosen, 2)
            if second.index < len(first.links)
        )

    def score(chosen: Iterable[DeviceLoad]) -> tuple[int, ...]:  # (a tuple of count)
        left = sorted(d.index for d in empty if d not in chosen)
        longest = run = 0
        for previous, index in zip([None, *left], left):
            run = run + 1 if previous is not None and index == previous + 1 else 1
            longest = max(longest, run)
        indices = sorted(d.index for d in chosen)
        spread = indices[-1] - indices[0]
        return (-longest, distance(chosen), spread, *indices)  # all sets of ``count``

    return list(min(itertools.combinations(empty, count), key=score))


def _commit(
    placement: Placement,
    request: Request,
    devices: Sequence[DeviceLoad],
    now: float,
    node: NodeRoom | None = None,
    waits_behind: bool = False,
) -> None:
    """Take the room: later jobs of the same pass see the job there, and until when."""
    if node is not None:
        node.take(request)
    by_name = {d.name: d for d in devices}
    whole = request.exclusive or request.gpus > 1
    ends = now + request.time_limit if request.time_limit is not None else math.inf
    holds = request.time_limit if request.time_limit else math.inf
    for name in placement.devices:
        device = by_name[name]
        device.residents += 1
        device.by_user[request.user] = device.by_user.get(request.user, 0) + 1
        device.free_at = max(device.free_at, ends)
        if whole:
            device.exclusive = True
            if waits_behind:  # every lane of its devices waits for it
                for lane in device.lanes:
                    lane.starts_in += holds
        else:
            lane = device.lanes[placement.lane]
            lane.footprints.append(request.footprint)
            if waits_behind:
                lane.starts_in += holds
