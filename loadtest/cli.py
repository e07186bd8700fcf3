"""``python -m loadtest run|capacity|report``: the command line over the library."""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from loadtest.capacity import find_capacity, rate_ladder
from loadtest.generator import StepConfig, new_client
from loadtest.measure import Criteria, Target, measure_step, warm_up
from loadtest.progress import Display
from loadtest.report import write_html
from loadtest.results import RunResult, StepResult, read_json, to_dict, write_json
from loadtest.targets import TargetNotAllowed
from loadtest.workload import DEFAULT_DATA, Payload, squad_payloads, with_options
from service.settings import Settings

RESULTS_DIR = Path(__file__).resolve().parent / "results"
MAX_DURATION_S = 3600.0


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default="http://127.0.0.1:8080", help="gateway base URL (loopback)")
    p.add_argument("--route", default="/v1/qa", help="QA route, also the histogram's route label")
    p.add_argument("--metrics-url", default="", help="gateway /metrics ('none' to skip)")
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help="SQuAD JSON(.xz) to replay")
    p.add_argument("--questions-per-request", type=int, default=1)
    p.add_argument("--top-k", type=int, default=None, help="send top_k with every request")
    p.add_argument("--max-answer-len", type=int, default=None)
    p.add_argument("--arrival", choices=("constant", "poisson"), default="constant")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=5.0, help="per-request deadline (s)")
    p.add_argument("--max-requests", type=int, default=100_000, help="cap per step")
    p.add_argument("--max-connections", type=int, default=256)
    p.add_argument("--warmup", type=float, default=2.0, help="unrecorded seconds before a run")
    p.add_argument("--budget-ms", type=float, default=None,
                   help="p99 budget (default: QA_LATENCY_BUDGET_MS / the gateway setting)")
    p.add_argument("--max-error-rate", type=float, default=0.01)
    p.add_argument("--out", type=Path, default=None,
                   help="directory for results.json and report.html")
    p.add_argument("--quiet", action="store_true", help="no live display")


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="python -m loadtest", description=__doc__)
    sub = root.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="one open-loop step at a fixed rate")
    _common(run)
    run.add_argument("--rate", type=float, required=True, help="requests per second")
    run.add_argument("--duration", type=float, required=True, help="seconds")
    cap = sub.add_parser("capacity", help="step the rate up to find capacity at the p99 budget")
    _common(cap)
    cap.add_argument("--start-rate", type=float, default=5.0)
    cap.add_argument("--max-rate", type=float, default=400.0)
    cap.add_argument("--factor", type=float, default=2.0, help="rate multiplier per step")
    cap.add_argument("--step-duration", type=float, default=10.0)
    cap.add_argument("--refine", type=int, default=2, help="bisection steps after a failure")
    cap.add_argument("--max-total", type=float, default=900.0, help="stop climbing after (s)")
    rep = sub.add_parser("report", help="render report.html again from a results.json")
    rep.add_argument("json", type=Path)
    rep.add_argument("--html", type=Path, default=None)
    return root


@dataclass(frozen=True)
class Plan:
    target: Target
    bodies: list[Payload]
    criteria: Criteria
    out: Path


def _plan(args: argparse.Namespace) -> Plan:
    metrics = None if args.metrics_url == "none" else args.metrics_url
    target = Target.from_base(args.url, args.route, metrics)
    options = {k: v for k, v in (("top_k", args.top_k), ("max_answer_len", args.max_answer_len))
               if v is not None}
    bodies = with_options(squad_payloads(args.data, args.questions_per_request, seed=args.seed),
                          options)
    budget = args.budget_ms
    if budget is None:
        budget = Settings.model_validate({}).latency_budget_ms
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = args.out or RESULTS_DIR / f"{args.command}-{stamp}"
    return Plan(target, bodies, Criteria(budget, args.max_error_rate), out)


def _config(args: argparse.Namespace, rate: float, duration: float) -> StepConfig:
    if not 0 < duration <= MAX_DURATION_S:
        raise SystemExit(f"duration must be in (0, {MAX_DURATION_S:g}] s")
    return StepConfig(rate=rate, duration_s=duration, max_requests=args.max_requests,
                      arrival=args.arrival, seed=args.seed, timeout_s=args.timeout)


async def _steps(args: argparse.Namespace, plan: Plan) -> tuple[list[StepResult], float | None]:
    display = Display(plan.criteria.budget_ms, enabled=not args.quiet)
    async with new_client(args.max_connections) as client:
        async def measure(rate: float) -> StepResult:
            duration = args.duration if args.command == "run" else args.step_duration
            config = _config(args, rate, duration)
            await warm_up(client, plan.target, plan.bodies, config, args.warmup)
            return await measure_step(client, plan.target, plan.bodies, config, plan.criteria,
                                      display)

        if args.command == "run":
            return [await measure(args.rate)], None
        deadline = time.monotonic() + args.max_total
        ladder = rate_ladder(args.start_rate, args.max_rate, args.factor)
        return await find_capacity(measure, ladder, args.refine,
                                   may_continue=lambda: time.monotonic() < deadline)


def _summary(result: RunResult) -> Table:
    table = Table(title=f"{result.kind}: {result.url}", title_justify="left")
    for column in ("offered", "achieved", "n", "p50 ms", "p99 ms", "p99.9 ms", "gw p50",
                   "gw p99", "err %", "SLO"):
        table.add_column(column, justify="right")
    for s in result.steps:
        gw = s.gateway
        table.add_row(
            f"{s.offered_rps:g}", f"{s.achieved_rps:.1f}", str(s.completed),
            f"{s.latency_ms.p50:.2f}", f"{s.latency_ms.p99:.2f}", f"{s.latency_ms.p999:.2f}",
            f"{gw.p50_ms:.2f}" if gw else "-", f"{gw.p99_ms:.2f}" if gw else "-",
            f"{100 * s.error_rate:.2f}", {True: "pass", False: "FAIL", None: "-"}[s.passed])
    return table


def _notes(steps: Sequence[StepResult], budget_ms: float | None) -> list[str]:
    notes = []
    for s in steps:
        if budget_ms is not None and s.lag_ms.p99 > budget_ms / 2:
            notes.append(f"at {s.offered_rps:g} rps the generator itself sent late (p99 lag "
                         f"{s.lag_ms.p99:.1f} ms): that lag is inside the measured latency")
        if s.gateway is None:
            notes.append(f"at {s.offered_rps:g} rps the gateway's /metrics could not be read")
    return notes


def _execute(args: argparse.Namespace) -> int:
    plan = _plan(args)
    started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    steps, capacity = asyncio.run(_steps(args, plan))
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    result = RunResult(
        kind=args.command, url=plan.target.qa_url, started_at=started,
        budget_ms=plan.criteria.budget_ms, max_error_rate=plan.criteria.max_error_rate,
        settings=settings, steps=steps, capacity_rps=capacity,
        notes=_notes(steps, plan.criteria.budget_ms),
    )
    write_json(result, plan.out / "results.json")
    write_html(to_dict(result), plan.out / "report.html")
    console = Console(stderr=True, width=None if sys.stderr.isatty() else 120)
    console.print(_summary(result))
    if args.command == "capacity":
        console.print(f"capacity at p99 <= {plan.criteria.budget_ms:g} ms: "
                      + (f"{capacity:g} rps" if capacity is not None else "none"))
    console.print(f"wrote {plan.out / 'results.json'} and {plan.out / 'report.html'}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "report":
        html_path = args.html or args.json.with_name("report.html")
        write_html(read_json(args.json), html_path)
        print(html_path)
        return 0
    try:
        return _execute(args)
    except TargetNotAllowed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
