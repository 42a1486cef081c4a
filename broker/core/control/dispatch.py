"""The dispatch pass: free slots pull work, idle paid slots copy the tail, running work is kept.

``dispatch``: each free slot takes the largest pending task that ends before the slot's
release (never one that would be killed or buy an unplanned unit); with nothing pending,
``replicate`` copies the running task expected to end last onto an idle paid slot.
``keep_running_work`` lengthens an instance whose running task would be killed at its release.
"""

from __future__ import annotations

import heapq
import math
from typing import TYPE_CHECKING

from .actions import Assign, Launch, Replicate, ScheduleRelease, SlotRef
from .baselines import BASELINES
from .budget import affordable_extension, budget_of, private_until_s
from .causes import Policy, ReleaseCause, WorkCause
from .queue_ahead import queue_ahead
from .scratch import Scratch
from .snapshot import Memory, NodeView, Snapshot
from .straggler import keepers, move_stragglers

if TYPE_CHECKING:
    from .controller import Controller


def keep_running_work(ctl: Controller, snap: Snapshot, now: float, size_ref_s: float | None, s: Scratch,
                      cause: ReleaseCause) -> None:
    """Keep an instance whose running task would outlive its release to the billing
    boundary after the task's expected end (``size_ref_s`` for tasks without an
    estimate; None: the next boundary at least a tick away), while the budget allows.
    Work killed at a release is work paid for twice."""
    cfg = ctl.config
    # A task with copies on several machines needs only the one kept longest (a private
    # node: forever); the others may go at their releases.
    # (Under a deadline: the copy expected to end first, ``straggler.keepers``.)
    keeper = keepers(ctl, snap, now, size_ref_s, s)
    rerun = RerunSlots(ctl, snap, now, size_ref_s, s) if len(snap.pending) == 0 and size_ref_s is not None else None
    for n in sorted(snap.nodes, key=lambda n: (s.release_of(n) or math.inf, n.id)):
        if n.is_private or not n.running or n.launched_at_s is None:
            continue
        rel = s.release_of(n)
        if rel is None or rel - now > cfg.tick_s + cfg.margin_s:
            continue
        mine = [r for r in n.running if keeper[r.task_id][1] == n.id]
        if not mine:
            continue
        if rerun is not None and rerun.take_all(n, mine, now, size_ref_s):
            continue  # its tasks are re-run on paid slots that stand idle by then: no unit bought
        need = rel + cfg.tick_s + cfg.margin_s
        if size_ref_s is not None:
            ends = [r.started_at_s + (r.estimate_ref_s or size_ref_s) / n.speed for r in mine]
            # A task still running past its expected end is not about to end: nothing
            # says when it will, and its work so far is lost at the release. Keep it.
            if max(ends) <= rel and min(ends) > now:
                continue
            need = max(need, max(ends) + cfg.margin_s)
        t = snap.types[n.type_name]
        # per-second billing has a boundary every second: go at least a tick further
        target = t.billing.paid_until(n.launched_at_s, need) - cfg.margin_s
        if target > rel and affordable_extension(ctl, snap, s, n, t, target, now):
            s.actions.append(ScheduleRelease(n.id, target, cause))
            s.release[n.id] = target


class RerunSlots:
    """Rule "a paid slot re-runs a task rather than a whole billing unit keeping it".

    With nothing pending, the slots of nodes kept longer (private nodes, and instances released
    later) can run again, from the start, the tasks of an instance about to be released: each
    slot, once free (now, or when its running task is expected to end), runs one such task that
    ends (its size at the slot's speed) before the slot's release and before the deadline. What
    it buys: no whole unit bought for the last minutes of a task (thesis LM20 without estimates
    at FirstFit's 3.39 h: 14 instances kept another hour at 2 h for tasks that 13 c1.xlarge,
    paid for that hour already, re-ran in minutes once free).

    A private node has no release: its slots re-run a task only if it ends by the last release
    of the paid instances that stay (the end the fleet is paid to) or by the task's own expected
    end where it runs, whichever is later, so a re-run does not lengthen the run. Bounded by the
    deadline alone, a heavy tail's tasks, killed on a fast instance after 2.4 reference-hours,
    were re-run from scratch at 2.4x less speed on the private node: lognormal sigma 1.5 seed 3
    ended at 14.4 h instead of 8.5 h, seeds 14 and 20 past the 16.5 h deadline (met in 90% of 20
    seeds, not 100%), the first promise's makespan interval holding in 65%
    (``bench/promises.py``).
    """

    def __init__(self, ctl: Controller, snap: Snapshot, now: float, size_ref_s: float, s: Scratch):
        deadline = snap.started_at_s + float(ctl.goal.value) if ctl.goal.kind == "deadline" else math.inf
        soon = now + ctl.config.tick_s + ctl.config.margin_s  # the instances released by then are the ones kept or not
        later = now + ctl.config.tick_s  # a killed task is dispatched again at a later decision
        self.paid_end = max((math.inf if s.release_of(n) is None else s.release_of(n)
                             for n in snap.nodes if not n.is_private and not n.lost), default=-math.inf)
        self.slots = []  # (free from, end by, speed, private) of each slot that stays
        for n in snap.nodes:
            until = math.inf if n.is_private else (s.release_of(n) if s.release_of(n) is not None else math.inf)
            if n.lost or until <= soon:
                continue
            start = max(later, n.ready_at_s or later)
            ends = [max(later, r.started_at_s + (r.estimate_ref_s or size_ref_s) / n.speed) for r in n.running]
            ends += [start] * (n.slots - len(n.running))
            self.slots += [(e, min(until, deadline), n.speed, n.is_private) for e in ends]

    def take_all(self, n: NodeView, tasks, now: float, size_ref_s: float) -> bool:
        """``take`` for the tasks ``n`` runs, each at least as long as it has run so far; a task
        without an estimate that has outrun the size it was given is taken as twice what it has
        run (a long tail: the longer a task has run, the longer it is likely to run on)."""
        sizes = []
        for r in tasks:
            ran = (now - r.started_at_s) * n.speed
            if r.estimate_ref_s is None and ran >= size_ref_s:
                sizes.append(2 * ran)
            else:
                sizes.append(max(r.estimate_ref_s or size_ref_s, ran))
        return self.take(sizes, [r.started_at_s + x / n.speed for r, x in zip(tasks, sizes)])

    def take(self, sizes_ref_s: list[float], own_ends_s: list[float] | None = None) -> bool:
        """Reserve a slot for each task (the one that ends it first); False (nothing reserved) if
        one has none. ``own_ends_s``: when each task would end where it runs (a private slot's
        re-run ends by then or by the paid fleet's end; None: by the paid fleet's end)."""
        free = list(self.slots)
        own = own_ends_s if own_ends_s is not None else [-math.inf] * len(sizes_ref_s)
        for size, own_end in sorted(zip(sizes_ref_s, own), reverse=True):
            fits = [(start + size / speed, k) for k, (start, end, speed, private) in enumerate(free)
                    if start + size / speed <= (min(end, max(self.paid_end, own_end)) if private else end)]
            if not fits:
                return False
            free.pop(min(fits)[1])
        self.slots = free
        return True


def dispatch(ctl: Controller, snap: Snapshot, memory: Memory, now: float, mean_and_fit: tuple[float, float], rng,
             s: Scratch) -> None:
    mean, fit_size = mean_and_fit
    if ctl.config.policy == Policy.BROKER and len(snap.pending) == 0 and (
            not ctl.config.replicate or not _copy_may_win(snap, now)):
        return  # the tail: nothing to hand out, and no copy could end sooner anywhere
    fit_rule = ctl.config.policy == Policy.BROKER or BASELINES[ctl.config.policy].fit_rule
    least = snap.pending.smallest_size(fit_size)  # fit_rule: the broker's pool size of unknown tasks
    ready, slowest = _ready_nodes(ctl, snap, now, least, s)
    fastest = 0.0  # the straggler rule's fastest speed: 0 while no ready slot is near the deadline
    tail = memory.tail_size_ref_s
    if ctl.goal.kind == "deadline" and tail is not None and ready:
        left = snap.started_at_s + float(ctl.goal.value) - now
        if left * slowest < tail:  # the slowest ready slot is in the deadline's last window
            fastest = max(n.speed for n in snap.nodes if not n.lost)
    # Under a budget, private time is paid up to ``private_until_s``: a private slot takes only
    # a task that ends before it (as an instance's before its release), none once it is spent.
    private_until = now if memory.private_stopped else (
        private_until_s(ctl, snap, s, now) if any(n.is_private for n in ready) else math.inf)
    spot = SpotSlots(snap, ready, s.actions)
    idle_slots = _fill(ctl, snap, memory, now, ready, (mean, fit_size, least, fastest, private_until), rng, s, spot)
    queue_ahead(ctl, snap, now, mean, fit_size, private_until, s, spot)  # short tasks, plenty pending: off by default
    if (idle_slots and fit_rule and budget_of(ctl, snap) is None and snap.count_running() == 0
            and not s.taken and len(snap.pending)):
        # Nothing runs and nothing fits: rather than wait for a plan that thinks the
        # fleet suffices, start the smallest task where most paid time is left (the
        # tick then keeps that instance to the task's end). Not under a budget: there,
        # a task that cannot finish in paid time waits (BaTS semantics).
        node, slot, _ = max(idle_slots, key=lambda x: (x[2], x[0].id))
        pick = snap.pending.smallest(mean, spot.excluded(node, s.taken))
        if pick is not None:
            s.taken.add(pick[0])
            s.actions.append(Assign(pick[0], SlotRef(node.id, slot), 1, WorkCause.NOTHING_FITS_ANYWHERE))
            idle_slots = [x for x in idle_slots if (x[0].id, x[1]) != (node.id, slot)]
    if (ctl.config.replicate and ctl.config.policy == Policy.BROKER and len(snap.pending) - len(s.taken) <= 0
            and idle_slots and _copy_may_win(snap, now)):  # the idle slots are free nodes' of the snapshot
        replicate(snap, now, mean, idle_slots, s)
        move_stragglers(ctl, snap, now, idle_slots, s)


def _copy_may_win(snap: Snapshot, now: float) -> bool:
    """False when no idle slot can end a copy of a running task sooner, known in O(speeds).

    A copy of a task of size x >= 0 started at s <= now on a node of speed u ends on a slot of
    speed v at now + x / v, before the original's s + x / u only if v > u (its expected end
    is s + x / u for overdue tasks too: their size is stretched, :class:`_Tail`). So when no
    free node is faster than the slowest node running a task, ``replicate`` copies nothing:
    at 1,000 identical nodes its scan of every running task and every idle slot cost 3 ms
    a decision, for the whole tail of the bag. Unknown (a snapshot without the ledger's
    counts, or a start after ``now``): True, and the scan decides."""
    slowest, latest = snap.slowest_running_speed, snap.latest_start_s
    if slowest is None or latest is None or latest > now:
        return True
    index = snap.free_index
    if index is not None and snap.free_index_version == index.version:
        fastest = index.fastest()
    else:
        fastest = max((n.speed for n in snap.nodes_with_free_slots()), default=None)
    return fastest is not None and fastest > slowest


FEW_FREE_NODES = 16  # up to this many free nodes, looking at each costs less than asking the index


def _ready_nodes(ctl: Controller, snap: Snapshot, now: float, least: float, s: Scratch) -> tuple[list[NodeView], float]:
    """The ready nodes with a free slot the dispatch visits, fastest first (ties by id), and
    the lowest speed among all such nodes.

    All of them, or, when the snapshot carries a valid :class:`~.free_index.FreeIndex`, only
    those that may take a pending task (their paid time fits the smallest): the others would
    only be listed as idle, and the idle list is read only when nothing runs or too few tasks
    are pending for the visited slots (then every node is visited, as before)."""
    index = snap.free_index
    if (ctl.config.policy == Policy.BROKER and index is not None and len(index) > FEW_FREE_NODES
            and index.version == snap.free_index_version and ctl.config.fit_safety > 0
            and snap.count_running() > 0 and math.isfinite(least)):
        cands = index.candidates(now, least * ctl.config.fit_safety)
        cands.extend(v for v in map(index.view, s.release) if v is not None)
        ready = sorted({n.id: n for n in cands if n.ready(now)}.values(), key=lambda n: (-n.speed, n.id))
        free = sum(n.slots - len(n.running) for n in ready)
        if not ctl.config.replicate or len(snap.pending) - len(s.taken) > free:
            slowest = index.slowest_ready_speed(now) if ready else 0.0
            return ready, slowest
    ready = sorted((n for n in snap.nodes_with_free_slots() if n.ready(now)), key=lambda n: (-n.speed, n.id))
    return ready, (ready[-1].speed if ready else 0.0)


def _fill(ctl: Controller, snap: Snapshot, memory: Memory, now: float, ready: list[NodeView], sizes, rng,
          s: Scratch, spot: "SpotSlots") -> list[tuple[NodeView, int, float]]:
    """Each free slot of ``ready`` takes the largest pending task that fits (a spot slot: as
    :class:`SpotSlots` says); returns the slots left idle, each with the largest size it
    could have taken."""
    mean, fit_size, least, fastest, private_until = sizes
    fit_rule = ctl.config.policy == Policy.BROKER or BASELINES[ctl.config.policy].fit_rule
    baseline = ctl.config.policy != Policy.BROKER
    idle_slots: list[tuple[NodeView, int, float]] = []
    for node in ready:
        release = s.release_of(node) if not node.is_private else (
            None if math.isinf(private_until) else private_until)
        slots = node.free_slots()
        if s.used_slots:
            slots = [slot for slot in slots if (node.id, slot) not in s.used_slots]
        if not slots or (release is not None and release <= now):
            continue
        # What a slot may take depends on its node only: the limit is worked out once a node.
        limit_ref = math.inf
        if (fit_rule or node.is_private) and release is not None:
            limit_ref = (release - now) * node.speed / ctl.config.fit_safety
        if not baseline and limit_ref < least:  # nothing pending is that small
            idle_slots.extend((node, slot, limit_ref) for slot in slots)
            continue
        if fit_rule:
            limit_ref = min(limit_ref, tail_limit_ref(ctl, snap, memory, node, now, fit_size, fastest))
        if not baseline and not spot.applies(node):  # the shared rule alone: the same picks, fewer calls
            _fill_node(snap.pending, node, slots, limit_ref, fit_size, s, idle_slots)
            continue
        for k, slot in enumerate(slots):
            pick = _baseline_pick(ctl, snap, memory, node, rng, s) if baseline else None
            taken = spot.excluded(node, s.taken)
            if pick is not None and pick[0] in taken:
                pick = None  # a task barred from spot
            if pick is None:
                pick = spot.short_pick(snap, node, limit_ref, fit_size if fit_rule else mean, taken)
            if pick is None:
                pick = snap.pending.largest_fitting(limit_ref, fit_size if fit_rule else mean, taken)
            if pick is None and not fit_rule:
                pick = snap.pending.smallest(mean, taken)
            if pick is None:
                idle_slots.append((node, slot, limit_ref))
                if not baseline:  # the node's other slots would find nothing either
                    idle_slots.extend((node, other, limit_ref) for other in slots[k + 1:])
                    break
                continue
            s.taken.add(pick[0])
            s.actions.append(Assign(pick[0], SlotRef(node.id, slot), 1, WorkCause.DISPATCH))
    return idle_slots


def _fill_node(pending, node: NodeView, slots: list[int], limit_ref: float, size_ref: float, s: Scratch,
               idle_slots: list) -> None:  # noqa: ANN001
    """``_fill``'s loop for one node of the broker's policy where no spot rule applies: each
    slot takes the largest pending task that fits; the first that finds none leaves the
    node's other slots idle too (they would find none either)."""
    picks = pending.take_largest(limit_ref, size_ref, s.taken, len(slots))
    actions, node_id = s.actions, node.id
    for slot, (task_id, _) in zip(slots, picks):
        actions.append(Assign(task_id, SlotRef(node_id, slot), 1, WorkCause.DISPATCH))
    if len(picks) < len(slots):
        idle_slots.extend((node, other, limit_ref) for other in slots[len(picks):])


class SpotSlots:
    """Rules "short tasks on spot" and "a task interrupted ``max_spot_attempts`` times runs
    off spot" (issue 21; the ledger keeps the count, ``ledger/spot.py``).

    Both hold only while the fleet has an on-demand or private node that takes work: with
    spot alone there is nowhere else to run, and a barred task left pending would stall the
    run (the plan's on-demand fallback is the planner's, ``plan/spot.py``). Then:

    - a spot slot never takes a task in ``snap.spot_barred``;
    - when the bag has estimates, a spot slot takes the smallest pending task that fits (the
      work an interruption throws away grows with the task's length: of a task of size x
      on a node interrupted at rate lambda, about lambda x^2 / 2 is lost on average), while
      on-demand and private slots keep taking the largest first, so the long tasks run
      where nothing interrupts them.
    """

    def __init__(self, snap: Snapshot, ready, actions=()) -> None:
        types = snap.types

        def is_spot(n: NodeView) -> bool:
            t = None if n.type_name is None else types.get(n.type_name)
            return t is not None and t.is_spot

        spot_types = [name for name, t in types.items() if t.is_spot]
        self.spot = {n.id for n in ready if n.type_name in spot_types} if spot_types else set()
        # (an on-demand launch of this decision counts: ``spotfallback.py`` launches for them)
        fallback = bool(self.spot) and (any(not n.lost and not is_spot(n) for n in snap.nodes) or any(
            isinstance(a, Launch) and not getattr(types.get(a.type_name), "is_spot", True) for a in actions))
        self.barred = snap.spot_barred if fallback else frozenset()
        self.short_first = fallback and bool(snap.pending.smallest_estimates_ref_s(1))

    def applies(self, node: NodeView) -> bool:
        """Whether a rule of spot changes what a slot of ``node`` takes."""
        return (bool(self.barred) or self.short_first) and node.id in self.spot

    def excluded(self, node: NodeView, taken: set[str]) -> set[str]:
        """What ``node`` may not take: the tasks taken by this pass (and, on spot, the barred)."""
        if self.barred and node.id in self.spot:
            return taken | self.barred
        return taken

    def short_pick(self, snap: Snapshot, node: NodeView, limit_ref: float, size_ref: float, taken):
        """The smallest pending task for a spot slot (None: not a spot slot, or none fits)."""
        if not self.short_first or node.id not in self.spot:
            return None
        pick = snap.pending.smallest(size_ref, taken)
        return pick if pick is not None and pick[1] <= limit_ref else None


def _baseline_pick(ctl: Controller, snap: Snapshot, memory: Memory, node: NodeView, rng, s: Scratch):
    """A baseline's own choice of task for a free slot of ``node`` (None: the shared rule).
    PANDA runs the largest task assigned to the machine; List_eta with ``list_order`` random
    takes any pending task (the thesis's Random priority)."""
    policy = ctl.config.policy
    if policy == Policy.BROKER:
        return None
    if policy == Policy.LIST and ctl.config.list_order == "random" and rng is not None:
        tid = snap.pending.draw(rng, s.taken)
        return None if tid is None else (tid, snap.pending.estimate(tid))
    hook = getattr(BASELINES[policy], "pick", None)
    if hook is None:
        return None
    tid = hook(ctl, snap, memory, node, s)
    return None if tid is None else (tid, snap.pending.estimate(tid))
def tail_limit_ref(ctl: Controller, snap: Snapshot, memory: Memory, node: NodeView, now: float, fit_size: float,
                   fastest: float) -> float:
    """Near a deadline, the long tasks go to the fast slots (a rule of issue 16: stragglers).

    A task without an estimate is taken by a slot only if its high quantile
    (``memory.tail_size_ref_s``, set with the promise) still ends there by the user's
    deadline: ``now + tail / speed <= deadline``. A 6-hour task started two hours before
    the deadline on a slot of speed 1 decides the makespan; on a slot 2.5 times as fast it
    does not. Expressed as a limit in the pool's terms (unknown tasks count as
    ``fit_size``). The fastest slots of the fleet take work regardless: something must
    (``fastest`` 0: no slot is near the deadline, no limit)."""
    tail = memory.tail_size_ref_s
    if ctl.goal.kind != "deadline" or tail is None or node.speed >= fastest:
        return math.inf
    left = snap.started_at_s + float(ctl.goal.value) - now
    return left * node.speed - max(tail - fit_size, 0.0)


def replicate(snap: Snapshot, now: float, mean: float, idle_slots, s: Scratch) -> None:
    """Tail replication: copy the running task expected to end last onto an idle paid slot
    when the copy would end sooner there (first result wins).

    A task's expected end is its start plus its size (estimate, else the mean) at its
    node's speed. A task already past that is *overdue*, and nothing says how long it
    still needs; it is taken to need as long again as it has run (its total twice its
    age: heavy-tailed runtimes, 2^x minutes, keep going the longer they have gone), so
    an overdue task is copied to a node more than twice as fast. The copy only uses paid
    time nobody else wants; it never keeps a machine longer (``keep_running_work``
    protects one copy of a task, on the machine kept longest).

    Each idle slot takes the first task, latest end first, that it can copy sooner. The
    tasks are kept in a heap and drawn in that order only as far as a scan goes (it stops at
    the first end no copy can beat). A slot no faster and with no more paid time than one
    whose scan found nothing can only copy a task of that slot's node (any other would have
    been copied there): it looks at those alone, so a tail of 4,000 running tasks and 1,000
    idle slots costs a few scans, not 1,000."""
    tasks = _Tail(snap, now, mean, max((node.speed for node, _, _ in idle_slots), default=0.0))
    least = tasks.least
    beaten = None  # (limit, speed, node) of a slot whose full scan found nothing to copy
    for node, slot, limit_ref in idle_slots:
        if limit_ref < least:
            continue  # the slot's paid time is too short for any copy
        if beaten is not None and limit_ref <= beaten[0] and node.speed <= beaten[1]:
            scan = tasks.on_node(beaten[2]) if beaten[2] != node.id else ()
        else:
            scan = tasks.in_order()
        pick = _first_copy(scan, node, limit_ref, now, least, tasks.copied)
        if pick is None:
            if beaten is None or not (limit_ref <= beaten[0] and node.speed <= beaten[1]):
                beaten = (limit_ref, node.speed, node.id)
            continue
        r = pick[4]
        tasks.copied.add(r.task_id)
        s.actions.append(Replicate(r.task_id, SlotRef(node.id, slot), r.attempt + 1, WorkCause.TAIL_REPLICATION))
        if len(tasks.copied) == tasks.count:
            return


class _Tail:
    """The running tasks with a single copy, as ``(-end, task, k, size, task, node)``: a heap
    drawn into ``order`` as scans need it (latest end first, ties by task id), and by node.

    Only the tasks of nodes slower than ``below`` (the fastest idle slot) are kept (and those
    of a node with a start after ``now``): a copy ends sooner only on a faster node
    (``_copy_may_win``), so the others can never be drawn, and
    leaving them out changes no scan (``least`` over the kept ones still bounds every copy).
    Their copies are still counted: a task with two copies is out of the running."""

    def __init__(self, snap: Snapshot, now: float, mean: float, below: float = math.inf):
        copies: dict[str, int] = {}
        heap: list = []
        self.by_node: dict[str, list] = {}
        least = math.inf
        counted = 0
        for n in snap.nodes:
            if not n.running:
                continue
            if n.speed >= below and all(r.started_at_s <= now for r in n.running):
                for r in n.running:
                    copies[r.task_id] = copies.get(r.task_id, 0) + 1
                counted += len(n.running)
                continue
            counted += len(n.running)
            speed, mine = n.speed, []
            for r in n.running:
                tid = r.task_id
                copies[tid] = copies.get(tid, 0) + 1
                if r.queued:
                    continue  # not started (queue_ahead.py): nothing to copy ahead of
                est = r.estimate_ref_s if r.estimate_ref_s is not None else mean
                end = r.started_at_s + est / speed
                size = est
                if end <= now:  # overdue
                    age_ref = (now - r.started_at_s) * speed
                    size = max(est, 2.0 * age_ref)
                    end = r.started_at_s + size / speed
                x = (-end, tid, len(heap), size, r, n)
                heap.append(x)
                mine.append(x)
                least = size if size < least else least
            self.by_node[n.id] = mine
        if len(copies) < counted:  # tasks with two copies are out of the running for good
            heap = [x for x in heap if copies[x[1]] < 2]
            least = min((x[3] for x in heap), default=math.inf)
            self.copies = copies
        else:
            self.copies = None
        heapq.heapify(heap)
        self.heap, self.order, self.count, self.least = heap, [], len(heap), least
        self.copied: set[str] = set()  # copied here: two copies now, out of the running

    def in_order(self):
        order, heap = self.order, self.heap
        i = 0
        while True:
            if i == len(order):
                if not heap:
                    return
                order.append(heapq.heappop(heap))
            yield order[i]
            i += 1

    def on_node(self, node_id: str) -> list:
        mine = self.by_node.get(node_id, [])
        if self.copies is not None:
            mine = [x for x in mine if self.copies[x[1]] < 2]
        return sorted(mine)


def _first_copy(scan, node: NodeView, limit_ref: float, now: float, least: float, copied: set[str]):
    """The first task of ``scan`` (latest end first) that ``node`` would end sooner, within
    ``limit_ref``, if it is not already on ``node`` (None: none)."""
    for x in scan:
        neg_end, tid, _, size, _, n = x
        end = -neg_end
        if end <= now + least / node.speed:
            return None  # ends only get sooner down the list: no copy can beat one from here on
        if n.id == node.id or size > limit_ref or now + size / node.speed >= end or tid in copied:
            continue
        return x
    return None
