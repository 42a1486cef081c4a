"""``broker plan``: the Pareto front of makespan against cost for a bag, and the chosen point.

    broker plan --inventory INV [BAG | --tasks N --mean-runtime DUR [--runtime-sd DUR]]
                [--sample RULE [--eps E] [--delta D] [--run-dir DIR]]
                [--deadline DUR | --budget USD | --point K | --theta X]
                [--policy broker|bats] [--json] [--plot FILE.png]

The work planned for is the point estimate plus 1.645 standard deviations of the sum of the
task runtimes (sd x sqrt(n): a one-sided 95% upper value when runtimes are independent).

With ``--sample RULE`` the mean runtime is learnt by running random tasks of the bag on the
inventory's private nodes (local, or over SSH) until the stopping rule's (eps, delta) contract is met
(ALGORITHMS.md 2.1, 2.2; the runner is :mod:`broker.shells.sampling_runner`). The tasks that finished while
sampling are done: the plan covers the others only (``work.tasks`` in ``--json``), and
``RUN_DIR/samples.json`` lists them for ``broker run``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Sequence

import structlog

from broker.cli import UsageError
from broker.cli.frontview import FrontView, plot_front, render_table
from broker.core.units import format_duration, parse_duration
from broker.core.estimate import Estimate
from broker.core.estimate.rules import RULE_NAMES
from broker.core.model import Bag
from broker.shells.nodes import AGENTS_DIR
from broker.shells.sampling_runner import SamplingInterrupted, SamplingStopped, samples_document
from broker.core.plan import (
    Goal,
    NoFeasiblePlan,
    Plan,
    Work,
    bats_configuration,
    plan_for_goal,
    plan_front,
)

# One-sided 95% normal quantile for the upper value of the total work.
_UPPER_Z = 1.645
_NO_ESTIMATES = (
    "this bag has no estimate columns: give --mean-runtime, or learn it by running samples (--sample ebstop)"
)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "plan",
        help="print the makespan/cost Pareto front and the plan for a goal",
        description="Plan the fleet for a bag: the Pareto front of makespan against cost, "
        "with the point meeting your goal marked. Nothing is launched.",
    )
    p.add_argument("--inventory", required=True, metavar="INV", help="inventory file (YAML)")
    p.add_argument("bag", nargs="?", help="bag file; its estimate columns give the runtimes")
    p.add_argument("--tasks", type=int, metavar="N", help="number of tasks (instead of a bag)")
    p.add_argument("--mean-runtime", metavar="DUR", help="mean task runtime on a speed-1 slot, e.g. 10m")
    p.add_argument("--runtime-sd", metavar="DUR", help="standard deviation of a task's runtime")
    sampling = p.add_argument_group("sampling (learn the mean runtime by running random tasks of BAG)")
    sampling.add_argument("--sample", choices=RULE_NAMES, metavar="RULE",
                          help=f"stopping rule: {', '.join(RULE_NAMES)}; tasks run on the inventory's "
                          "private nodes and count as done (--mean-runtime is then only a guess "
                          "for the expected sample count)")
    sampling.add_argument("--eps", type=float, default=0.1, metavar="E",
                          help="relative error of the mean (default 0.1)")
    sampling.add_argument("--delta", type=float, default=0.05, metavar="D",
                          help="probability of missing it (default 0.05)")
    sampling.add_argument("--run-dir", metavar="DIR",
                          help="where the agents' state, the task outputs and samples.json go "
                          "(default: a new ./runs/plan-<timestamp>/)")
    add_goal_arguments(p)
    p.add_argument("--policy", choices=("broker", "bats"), default="broker",
                   help="broker: the front and the ILP (default); bats: BaTS's configuration (needs --budget)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--plot", metavar="FILE.png", help="draw the front with the chosen point (matplotlib)")
    p.set_defaults(func=run)


def add_goal_arguments(parser: argparse.ArgumentParser) -> None:
    """The goal flags ``plan``, ``simulate`` and ``run`` share (at most one of them)."""
    goal = parser.add_mutually_exclusive_group()
    goal.add_argument("--deadline", metavar="DUR", help="finish within this time at least cost (e.g. 6h)")
    goal.add_argument("--budget", metavar="USD", help="finish as soon as possible spending at most this")
    goal.add_argument("--point", metavar="K", help="the K-th row of the printed front")
    goal.add_argument("--theta", metavar="X", help="weight 0..1 between time (0, fastest) and cost (1, cheapest)")
    parser.add_argument("--confidence", metavar="C", default="0.9",
                        help="the promise's confidence 1 - delta: makespan and cost come with a C interval, and a "
                        "deadline is held with probability C (default 0.9)")
    parser.add_argument("--estimate-bias", metavar="B", default=None,
                        help="how far the bag's estimates may be off as a whole (their total against the truth), "
                        "at the confidence, e.g. 2%% or 0.02: the promise's prior until tasks with estimates "
                        "have run (default 15%%)")


def goal_from_args(args: argparse.Namespace) -> Goal | None:
    """The goal the flags name, or None; bad values raise UsageError."""
    if getattr(args, "deadline", None) is not None:
        try:
            seconds = parse_duration(args.deadline)
        except ValueError as exc:
            raise UsageError(f"--deadline: {exc}") from None
        if seconds <= 0:
            raise UsageError("--deadline: must be more than 0 seconds")
        return Goal("deadline", seconds)
    if getattr(args, "budget", None) is not None:
        return Goal("budget", _number("--budget", args.budget.lstrip("$"), 0.0, math.inf))
    if getattr(args, "point", None) is not None:
        value = _number("--point", args.point, 1.0, math.inf)
        if value != int(value):
            raise UsageError(f"--point: a row number of the front (1, 2, ...), got {args.point!r}")
        return Goal("point", value)
    if getattr(args, "theta", None) is not None:
        return Goal("theta", _number("--theta", args.theta, 0.0, 1.0))
    return None


def confidence_from_args(args: argparse.Namespace) -> float:
    value = _number("--confidence", str(getattr(args, "confidence", "0.9")), 0.0, 1.0)
    if not 0.0 < value < 1.0:
        raise UsageError(f"--confidence: must lie strictly between 0 and 1, got {args.confidence!r}")
    return value


def estimate_bias_from_args(args: argparse.Namespace) -> float | None:
    """``--estimate-bias``: a share (``2%`` or ``0.02``) in [0, 1), or None when not given."""
    text = getattr(args, "estimate_bias", None)
    if text is None:
        return None
    text = str(text).strip()
    value = _number("--estimate-bias", text.rstrip("%"), 0.0, math.inf) / (100.0 if text.endswith("%") else 1.0)
    if not 0.0 <= value < 1.0:
        raise UsageError(f"--estimate-bias: must be a share in [0, 1) (e.g. 2% or 0.02), got {text!r}")
    return value


def promise_options(args: argparse.Namespace) -> dict:
    """The ControllerConfig fields the promise's flags set (bad values raise UsageError)."""
    return {"confidence": confidence_from_args(args), "estimate_bias": estimate_bias_from_args(args)}


def _number(flag: str, text: str, lo: float, hi: float) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"{flag}: expected a number, got {text!r}") from None
    if not math.isfinite(value):
        # `--budget inf` ran and wrote "goal_value": Infinity, which strict JSON parsers reject.
        hint = (": without a budget, give --theta 0 (fastest) or no goal (cheapest)" if flag == "--budget" else "")
        raise UsageError(f"{flag}: must be a finite number, got {text!r}{hint}")
    if not (lo <= value <= hi):
        raise UsageError(f"{flag}: must be between {lo:g} and {hi:g}, got {text!r}")
    return value


def work_from_args(args: argparse.Namespace) -> Work:
    """Work from a bag's estimate columns, or from --tasks and --mean-runtime."""
    mean_s = _duration("--mean-runtime", args.mean_runtime)
    sd_s = _duration("--runtime-sd", args.runtime_sd) or 0.0
    if args.bag and args.tasks is not None:
        raise UsageError("give a bag or --tasks, not both")
    if args.bag:
        from broker.config.bag import load_bag

        bag = load_bag(args.bag)
        n = len(bag)
        per_task = [statistics.fmean(t.estimates_s.values()) for t in bag.tasks if t.estimates_s]
        if per_task and mean_s is None:
            mean_s = statistics.fmean(per_task)
            if args.runtime_sd is None and len(per_task) > 1:
                sd_s = statistics.stdev(per_task)
        elif mean_s is None:
            raise UsageError(_NO_ESTIMATES)
    else:
        if args.tasks is None or mean_s is None:
            raise UsageError("give a bag, or --tasks N with --mean-runtime DUR")
        if args.tasks < 1:
            raise UsageError(f"--tasks: must be at least 1, got {args.tasks}")
        n = args.tasks
    planned = n * mean_s + _UPPER_Z * sd_s * math.sqrt(n)
    return Work(total_ref_s=planned, tasks=n, mean_ref_s=mean_s, sd_ref_s=sd_s)


def _duration(flag: str, text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise UsageError(f"{flag}: {exc}") from None


def run(args: argparse.Namespace) -> int:
    from broker.config.inventory import load_inventory

    goal = goal_from_args(args)
    confidence = confidence_from_args(args)
    sampled: Estimate | None = None
    if args.sample:
        try:
            work, sampled = work_by_sampling(args)
        except SamplingStopped as exc:
            print(f"broker plan: {exc}", file=sys.stderr)
            return 130 if isinstance(exc, SamplingInterrupted) else 1
    else:
        work = work_from_args(args)
    inventory = load_inventory(args.inventory)
    types, private = inventory.types, inventory.private
    front, cheapest, chosen, reason = _solve(args, types, private, work, goal, confidence)
    promised = None
    if args.policy != "bats" and chosen is not None:
        from broker.cli.plan_promise import promise_for

        pp = promise_for(args, types, private, work, goal, chosen, confidence, sampled)
        chosen, promised = pp.plan, pp.promise
        reason = reason or pp.warning
    spot = None
    if args.policy != "bats" and chosen is not None:
        from broker.core.plan.spotsummary import spot_summary

        spot = spot_summary(chosen, types, private, work, goal, confidence=confidence)
    solve_ms = sum(p.solve_ms for p in front) + (chosen.solve_ms if chosen and chosen not in front else 0.0)
    log = structlog.get_logger()
    if chosen is not None:
        log.info("plan.solved", policy=args.policy, goal=goal.describe() if goal else None,
                 makespan_s=round(chosen.makespan_s, 1), cost_usd=round(chosen.cost_usd, 4),
                 fleet={k: v for k, v in chosen.fleet.items() if v}, status=chosen.status,
                 front_points=len(front), solve_ms=round(solve_ms, 1),
                 promise=None if promised is None else promised.to_json())
    else:
        log.info("plan.solved", policy=args.policy, goal=goal.describe() if goal else None,
                 front_points=len(front), solve_ms=round(solve_ms, 1), reason=reason)

    view = FrontView(work, types, front, chosen, goal=goal, cheapest=cheapest)
    if args.plot:
        plot_front(view, args.plot)
    if args.json:
        document = {
            "work": {"tasks": work.tasks, "mean_ref_s": work.mean_ref_s,
                     "total_ref_s": work.tasks * work.mean_ref_s, "planned_ref_s": work.total_ref_s},
            "front": [p.row() for p in front],
            "cheapest": cheapest.row() if cheapest else (front[-1].row() if front else None),
            "chosen": chosen.row() if chosen else None,
            "promise": None if promised is None else promised.to_json(),
            "solve_ms": round(solve_ms, 3),
        }
        if any(t.is_spot for t in types):  # an inventory with spot offers: their market and the spot figures
            document |= {"markets": {t.name: t.market for t in types}, "spot": None if spot is None else spot.to_json()}
        if sampled is not None:
            document["sample"] = {"rule": sampled.rule, "samples": sampled.samples, "mean_ref_s": sampled.mean_ref_s,
                                  "eps": sampled.eps, "delta": sampled.delta, "capped": sampled.capped,
                                  "exact": sampled.exact}
        print(json.dumps(document))
        if reason:
            print(f"broker plan: {reason}", file=sys.stderr)
    else:
        print(render_table(view) if work.tasks else "nothing left to plan: every task of the bag ran while sampling")
        if promised is not None and work.tasks:
            print(f"promise: {promised.text()}")
        if spot is not None and work.tasks:
            print("\n".join(spot.lines()))
        if reason:
            print(f"cannot meet {goal.describe() if goal else 'the goal'}: {reason}")
    return 1 if reason else 0


def _solve(args, types, private, work: Work, goal, confidence: float = 0.9
           ) -> tuple[list[Plan], Plan | None, Plan | None, str | None]:
    """The front (its knee points), the cheapest plan when it is not one of them, the plan
    chosen for the goal, and why there is none."""
    chosen: Plan | None = None
    reason: str | None = None
    front: list[Plan] = []
    cheapest: Plan | None = None
    if args.policy == "bats":
        if goal is None or goal.kind != "budget":
            raise UsageError("the bats policy plans for a budget: give --budget USD")
        per_type_s = {t.name: work.mean_ref_s / t.speed for t in types}
        try:
            chosen = bats_configuration(types, work.tasks, per_type_s, goal.value)
            front = [chosen]
        except NoFeasiblePlan as exc:
            reason = str(exc)
    else:
        try:
            whole = plan_front(types, private, work)
            front = whole.points
            cheapest = None if any(p is whole.cheapest for p in front) else whole.cheapest
            if goal is not None:
                chosen = plan_for_goal(types, private, work, goal, front=whole, confidence=confidence)
                if goal.kind in ("point", "theta"):
                    chosen = _as_run_chooses(types, private, work, chosen)
        except NoFeasiblePlan as exc:
            reason = str(exc)
        except ValueError as exc:  # a point that is not on the front
            raise UsageError(str(exc)) from None
    return front, cheapest, chosen, reason


def _as_run_chooses(types, private, work: Work, chosen: Plan) -> Plan:
    """The plan ``broker run`` adopts for a point or theta goal: the chosen point's cost,
    finishing as soon as that money allows (``FleetPlanner.soonest_at_cost``), so that the
    plan printed here is the one the run promises."""
    from broker.core.control.planning import FleetPlanner, PlannerInput

    return FleetPlanner().soonest_at_cost(PlannerInput(tuple(types), tuple(private), (), work, 0.0), chosen)


# -- sampling -------------------------------------------------------------------------------
# Progress goes to the log every this many completed draws when stderr is not a terminal.
_PROGRESS_EVERY = 10
# The tighter timeout offered: max(_TIGHTER_MEANS x mean, mean + _TIGHTER_SDS x sd); it is
# only offered when the bag's timeout is at least _LOOSE_FACTOR times that.
_TIGHTER_MEANS = 2.0
_TIGHTER_SDS = 3.0
_LOOSE_FACTOR = 2.0


def work_by_sampling(args: argparse.Namespace) -> tuple[Work, Estimate]:
    """Run random tasks of the bag on the inventory's private nodes until ``--sample``'s rule
    is satisfied; the work is what is left, at the estimated mean.

    The planned work is ``m mu + 1.645 sd sqrt(m)`` for the ``m`` tasks not done while
    sampling, with ``mu`` the rule's estimate and ``sd`` the spread of the samples it used.
    Raises :class:`~broker.shells.sampling_runner.SamplingStopped` (after writing
    ``samples.json``) when sampling ends without an estimate.
    """
    import numpy as np

    from broker.config.bag import load_bag
    from broker.config.inventory import load_inventory
    from broker.core.estimate import make_rule
    from broker.shells.sampling_runner import attached_nodes, sample_bag

    if not args.bag:
        raise UsageError("--sample runs tasks of a bag: give the bag file")
    if args.tasks is not None:
        raise UsageError("--sample learns the runtimes of a bag: drop --tasks")
    for flag, value in (("--eps", args.eps), ("--delta", args.delta)):
        if not 0 < value < 1:
            raise UsageError(f"{flag}: must lie strictly between 0 and 1, got {value:g}")
    guess_mean_s = _duration("--mean-runtime", args.mean_runtime)
    guess_sd_s = _duration("--runtime-sd", args.runtime_sd)
    bag = load_bag(args.bag)
    inventory = load_inventory(args.inventory)
    private = inventory.private
    if not private:
        raise UsageError(f"sampling runs tasks on your own machines: {args.inventory} declares no private node "
                         "(add one, e.g. '- {name: here, local: true, slots: 4}', or plan with --mean-runtime)")
    notes = sys.stderr if args.json else sys.stdout
    rule = make_rule(args.sample, args.eps, args.delta, bag.timeout_s, n_tasks=len(bag))
    if guess_mean_s is None:
        per_task = [statistics.fmean(t.estimates_s.values()) for t in bag.tasks if t.estimates_s]
        if per_task:
            guess_mean_s = statistics.fmean(per_task)
            guess_sd_s = statistics.stdev(per_task) if len(per_task) > 1 else None
    print(expectation_lines(args.sample, args.eps, args.delta, bag.timeout_s, len(bag), guess_mean_s, guess_sd_s),
          file=notes)

    run_dir = _new_run_dir(args.run_dir)
    seed = int(np.random.SeedSequence().entropy)
    log = structlog.get_logger()
    log.info("sample.start", rule=args.sample, eps=args.eps, delta=args.delta, tasks=len(bag), r_max_s=bag.timeout_s,
             nodes=[n.name for n in private], slots=sum(n.slots for n in private), run_dir=str(run_dir), seed=seed)
    progress = SamplingProgressView(args.sample, args.eps, args.delta, bag.timeout_s, len(bag))
    samples_path = run_dir / "samples.json"
    local_nodes = {n.name for n in private if n.local}
    with attached_nodes(private, run_dir, run_id=run_dir.name) as (attached, inbox):
        # The bag's workdir: resolved here for this machine, left to the node's shell elsewhere.
        nodes = [replace(n, cwd=_task_cwd(bag) if n.name in local_nodes else bag.workdir) for n in attached]
        try:
            outcome = sample_bag(bag, nodes, inbox, rule, np.random.default_rng(seed), on_progress=progress)
        except SamplingStopped as exc:
            progress.close()
            _write_json(samples_path, samples_document(exc.tasks, failures=exc.failures) | {"seed": seed})
            raise type(exc)(f"{exc}\n(the tasks that ran are listed in {samples_path})", exc.tasks,
                            exc.failures) from None
        progress.close()
    _write_json(samples_path, samples_document(outcome.tasks, outcome.estimate, outcome.cancelled,
                                               outcome.failures) | {"seed": seed})
    estimate = outcome.estimate
    used = outcome.used_ref_s
    sd_s = statistics.stdev(used) if len(used) > 1 else 0.0
    done = len(outcome.done_task_ids)
    remaining = len(bag) - done
    print(sampled_lines(estimate, len(outcome.tasks), done, remaining, len(outcome.cancelled), samples_path),
          file=notes)
    planned = remaining * estimate.mean_ref_s + _UPPER_Z * sd_s * math.sqrt(remaining)
    return Work(total_ref_s=planned, tasks=remaining, mean_ref_s=estimate.mean_ref_s, sd_ref_s=sd_s), estimate


def expectation_lines(rule: str, eps: float, delta: float, r_max_s: float, n_tasks: int,
                      guess_mean_s: float | None, guess_sd_s: float | None) -> str:
    """What sampling is expected to cost, said before it starts; and, when the timeout is
    loose against the guessed runtimes, how many samples a tighter one would save."""
    from broker.core.estimate import expected_samples, tighter_rmax_saving

    head = f"sampling with {rule} (eps {eps:g}, delta {delta:g}), R_max = the bag's timeout {_duration_text(r_max_s)}"
    if rule == "bats":
        count = expected_samples(rule, eps, delta, 1.0, 0.0, n_tasks)
        return f"{head}\n  samples: {count:.0f} of {n_tasks} tasks (fixed by BaTS's formula)"
    whole = (f"\n  that is more than the bag's {n_tasks} tasks: sampling will run them all and so learn their "
             "exact mean")
    if guess_mean_s is None or not 0 < guess_mean_s:
        half, tenth = (expected_samples(rule, eps, delta, mu, mu / 2, n_tasks) for mu in (0.5, 0.1))
        return (f"{head}\n  expected samples: ~{half:.0f} if tasks take about half the timeout, ~{tenth:.0f} if a "
                f"tenth (of {n_tasks} tasks; give --mean-runtime for a closer figure)"
                + (whole if half >= n_tasks else ""))
    mean_s = min(guess_mean_s, r_max_s)
    sd_s = guess_sd_s if guess_sd_s is not None else mean_s / 2
    now = expected_samples(rule, eps, delta, mean_s / r_max_s, min(sd_s / r_max_s, 1.0), n_tasks)
    lines = [head, f"  expected samples: ~{now:.0f} of {n_tasks} tasks, if tasks take about "
                   f"{_duration_text(mean_s)} +/- {_duration_text(sd_s)}" + (whole if now >= n_tasks else "")]
    tighter_s = max(_TIGHTER_MEANS * mean_s, mean_s + _TIGHTER_SDS * sd_s)
    if r_max_s >= _LOOSE_FACTOR * tighter_s:
        saving = tighter_rmax_saving(rule, eps, delta, mean_s, sd_s, r_max_s, tighter_s, n_tasks)
        lines.append(f"  the timeout is loose: with timeout {_duration_text(tighter_s)} sampling would take "
                     f"~{saving.samples_tighter:.0f} samples ({saving.saved:.0f} fewer)")
    return "\n".join(lines)


def sampled_lines(estimate: Estimate, completed: int, done: int, remaining: int, cancelled: int,
                  samples_path: object) -> str:
    """The estimate, and what sampling already did of the bag."""
    extra = completed - estimate.samples
    if estimate.exact:
        head = (f"sampled: every task of the bag ran ({estimate.samples}; {estimate.capped} hit the timeout): "
                f"the exact mean is {estimate.mean_ref_s:.3g} ref-s")
    else:
        head = (f"sampled: mean {estimate.mean_ref_s:.3g} ref-s from {estimate.samples} samples ({estimate.rule}, "
                f"eps {estimate.eps:g}, delta {estimate.delta:g}; {estimate.capped} hit the timeout)")
    lines = [head, f"  {estimate.guarantee}"]
    lines += [f"  warning: {w}" for w in estimate.warnings]
    if remaining == 0:
        lines.append(f"  {done} tasks done while sampling: nothing left to plan; list in {samples_path}")
    else:
        lines.append(f"  {done} tasks done while sampling ({extra} beyond the rule's need"
                     + (f", {cancelled} cancelled" if cancelled else "")
                     + f"): planning the other {remaining}; list in {samples_path}")
    return "\n".join(lines)


class SamplingProgressView:
    """Sampling progress: a live bar on a terminal (stderr; log lines print above it), else a
    ``sample.progress`` event every ``_PROGRESS_EVERY`` completed draws. The expected total
    is re-derived from the samples so far."""

    def __init__(self, rule: str, eps: float, delta: float, r_max_s: float, n_tasks: int) -> None:
        from broker.cli.terminal import ProgressBoard, is_terminal

        self.rule, self.eps, self.delta, self.r_max_s, self.n_tasks = rule, eps, delta, r_max_s, n_tasks
        self.tty = is_terminal(sys.stderr)
        self.expected: float | None = None
        self.logged_at = 0
        self.board = ProgressBoard(sys.stderr) if self.tty else None
        if self.board is not None:
            self.board.bar("sample", "sampling", None, count="0")
            self.board.start()

    def __call__(self, p) -> None:
        if p.completed >= 2 and p.mean_ref_s and (self.expected is None or p.completed % _PROGRESS_EVERY == 0):
            from broker.core.estimate import expected_samples

            mu = min(p.mean_ref_s / self.r_max_s, 1.0)
            self.expected = expected_samples(self.rule, self.eps, self.delta, mu, (p.sd_ref_s or 0.0) / self.r_max_s,
                                             self.n_tasks)
        mean = "-" if p.mean_ref_s is None else f"{p.mean_ref_s:.3g}s"
        if self.board is not None:
            expected = None if self.expected is None else min(self.expected, self.n_tasks)
            total = expected if expected is not None and expected > p.completed else None
            if p.finished:
                total = p.completed
            info = f"{p.running} running, mean so far {mean}" + (f", {p.failures} failed" if p.failures else "")
            self.board.update("sample", completed=p.completed, total=total,
                              count=f"{p.completed}" + (f"/~{total:.0f}" if total and not p.finished else ""), info=info)
            if p.finished:
                self.close()
        elif p.completed - self.logged_at >= _PROGRESS_EVERY:
            self.logged_at = p.completed
            structlog.get_logger().info("sample.progress", completed=p.completed, running=p.running,
                                        mean_ref_s=p.mean_ref_s, expected_samples=self.expected, failures=p.failures)

    def close(self) -> None:
        if self.board is not None:
            self.board.stop()


def _duration_text(seconds: float) -> str:
    """Like format_duration, with sub-minute times to three figures (test bags run in ms)."""
    return f"{seconds:.3g}s" if seconds < 60 else format_duration(seconds)


def _new_run_dir(given: str | None) -> Path:
    """``--run-dir``, or a new ``./runs/plan-<timestamp>`` (never an existing one)."""
    if given is not None:
        path = Path(given)
        if (path / AGENTS_DIR).exists():
            # The agents there remember the attempts they ran and would refuse to run them again.
            raise UsageError(f"--run-dir: {path} holds the agents of an earlier run; give a new directory")
        path.mkdir(parents=True, exist_ok=True)
        return path
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for suffix in [""] + [f"-{k}" for k in range(2, 100)]:
        path = Path("runs") / f"plan-{stamp}{suffix}"
        try:
            path.mkdir(parents=True)
        except FileExistsError:
            continue
        return path
    raise UsageError(f"cannot create a new run directory under {Path('runs').resolve()}: give --run-dir")


def _task_cwd(bag: Bag) -> str | None:
    """The bag's workdir on this machine: ``~`` expanded, relative to the bag file's folder."""
    if bag.workdir is None:
        return None
    path = Path(bag.workdir).expanduser()
    if not path.is_absolute() and bag.source:
        path = Path(bag.source).parent / path
    return str(path.resolve())


def _write_json(path: Path, document: dict) -> None:
    path.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
