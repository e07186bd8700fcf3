"""The whole service past its capacity, with clients that give up: how much engine work goes to
requests nobody waits for any more.

    python3 benchmarks/bench_overload.py --rate 60 --duration 30 --client-timeout 1 \
        [--repo PATH] --label NAME --out overload-NAME.json

Starts ``python -m service.launcher`` of the checkout ``--repo`` (default: this one; another
checkout measures the code before a change) on free ports, sends ``python -m loadtest run``'s
open-loop load at ``--rate`` for ``--duration`` s with a client deadline of
``--client-timeout`` s, waits until Triton has drained its queue, and reads Triton's and the
gateway's metrics before and after. Reports answered requests per second (goodput), how
long Triton kept working after the load stopped (the drain), the requests it dropped from its
queue and those the model skipped as cancelled, and the gateway's outcomes. Ends with one
table row; the JSON keeps everything.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from loadtest.promtext import Samples, read_samples, sample_sum  # noqa: E402
from loadtest.ready import wait_http  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(url: str) -> Samples:
    return read_samples(httpx.get(url, timeout=10).text)


def delta(after: Samples, before: Samples, name: str, **match: str) -> float:
    return sample_sum(after, name, **match) - sample_sum(before, name, **match)


def drain(triton_metrics: str, model: str, started: float) -> float:
    """Seconds from ``started`` until Triton's queue is empty and no execution ended for 1 s."""
    last, last_change = -1.0, time.monotonic()
    while True:
        m = scrape(triton_metrics)
        executions = sample_sum(m, "nv_inference_exec_count_total", model=model)
        if executions != last:
            last, last_change = executions, time.monotonic()
        pending = sample_sum(m, "nv_inference_pending_request_count", model=model)
        if pending == 0 and time.monotonic() - last_change >= 1.0:
            return last_change - started
        time.sleep(0.1)


def run(args: argparse.Namespace) -> dict[str, Any]:
    ports = {"QA_PORT": free_port(), "QA_TRITON_HTTP_PORT": free_port(),
             "QA_TRITON_METRICS_PORT": free_port()}
    grpc = free_port()
    env = {**os.environ, **{k: str(v) for k, v in ports.items()}, "QA_HOST": "127.0.0.1",
           "QA_TRITON_URL": f"127.0.0.1:{grpc}", "QA_LOG_LEVEL": "warning",
           "QA_REQUEST_TIMEOUT_MS": str(args.request_timeout_ms), "BERT_QA_THREADS": "2"}
    gateway = f"http://127.0.0.1:{ports['QA_PORT']}"
    triton_metrics = f"http://127.0.0.1:{ports['QA_TRITON_METRICS_PORT']}/metrics"
    python = args.repo / ".venv" / "bin" / "python"
    launcher = subprocess.Popen([str(python if python.exists() else sys.executable),
                                 "-m", "service.launcher"], cwd=args.repo, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http(f"{gateway}/health/ready", launcher, 300, interval_s=0.5)
        httpx.post(f"{gateway}/v1/qa", json={"context": "Warm up the model.", "question": "What?"},
                   timeout=30)
        before_t, before_g = scrape(triton_metrics), scrape(f"{gateway}/metrics")
        with tempfile.TemporaryDirectory() as out:
            cmd = [sys.executable, "-m", "loadtest", "run", "--url", gateway, "--rate",
                   str(args.rate), "--duration", str(args.duration), "--timeout",
                   str(args.client_timeout), "--warmup", "0", "--budget-ms", "100000",
                   "--max-error-rate", "1", "--out", out, "--quiet"]
            subprocess.run(cmd, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
            load_end = time.monotonic()
            step = json.loads((Path(out) / "results.json").read_text())["steps"][0]
        drain_s = drain(triton_metrics, args.model, load_end)
        after_t, after_g = scrape(triton_metrics), scrape(f"{gateway}/metrics")
    finally:
        launcher.terminate()
        launcher.wait(60)
    model = args.model
    counted = "qa_request_duration_seconds_count"
    names = {dict(labels)["outcome"] for name, labels in after_g
             if name == counted and dict(labels).get("route") == "/v1/qa"}
    outcomes = {o: n for o in sorted(names)
                if (n := delta(after_g, before_g, counted, route="/v1/qa", outcome=o))}
    return {
        "label": args.label, "repo": str(args.repo), "rate": args.rate,
        "duration_s": args.duration, "client_timeout_s": args.client_timeout,
        "request_timeout_ms": args.request_timeout_ms,
        "sent": step["scheduled"], "answered": step["ok"],
        "goodput_rps": step["achieved_rps"], "client_errors": step["errors"],
        # Triton adds each request's share of a batch's time: a batch of n counts n times
        "compute_s_summed_over_requests": delta(
            after_t, before_t, "nv_inference_compute_infer_duration_us_total", model=model) / 1e6,
        "drain_s": drain_s,
        "triton_requests": delta(after_t, before_t, "nv_inference_request_success_total", model=model)
        + delta(after_t, before_t, "nv_inference_request_failure_total", model=model),
        "triton_cancelled_in_queue": delta(after_t, before_t, "nv_inference_request_failure_total",
                                           model=model, reason="CANCELED"),
        "model_skipped_cancelled": delta(after_t, before_t, "qa_model_skipped_requests_total",
                                         model=model, reason="cancelled"),
        "gateway_outcomes": outcomes,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repo", type=Path, default=REPO, help="checkout whose service is measured")
    p.add_argument("--rate", type=float, default=60.0, help="offered requests per second")
    p.add_argument("--duration", type=float, default=30.0)
    p.add_argument("--client-timeout", type=float, default=1.0, help="the clients' deadline (s)")
    p.add_argument("--request-timeout-ms", type=float, default=2000.0,
                   help="the gateway's deadline for a Triton call (QA_REQUEST_TIMEOUT_MS)")
    p.add_argument("--model", default="bert_qa")
    p.add_argument("--label", default="")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    result = run(args)
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    print("| label | offered rps | sent | answered | goodput rps | drain s "
          "| cancelled in Triton's queue | skipped by the model | gateway outcomes |")
    print("|---|---|---|---|---|---|---|---|---|")
    r = result
    print(f"| {r['label']} | {r['rate']:g} | {r['sent']} | {r['answered']} | "
          f"{r['goodput_rps']:.1f} | {r['drain_s']:.1f} | "
          f"{r['triton_cancelled_in_queue']:g} | {r['model_skipped_cancelled']:g} | "
          f"{json.dumps(r['gateway_outcomes'])} |")


if __name__ == "__main__":
    main()
