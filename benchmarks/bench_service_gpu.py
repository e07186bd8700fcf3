"""The gateway over HTTP with the fused engine in process, on a GPU: latency vs the budget.

What it measures: uvicorn + the real gateway (validation, tokenization, windows, decoding,
metrics) + ``EngineBackend(FusedEngine)`` on CUDA, driven by the open-loop load generator
replaying SQuAD v1.1 dev questions. What it leaves out: the Triton hop (gRPC to
``tritonserver`` and its python backend), which could not travel to the lent GPU (the repo
plus a Triton bundle exceed its 64 MiB transfer limit).

    python benchmarks/bench_service_gpu.py --out DIR [--budget-ms 10]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import uvicorn

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from engine.fused.engine import FusedEngine  # noqa: E402
from service.app import create_app  # noqa: E402
from service.backend import EngineBackend  # noqa: E402
from service.settings import Settings  # noqa: E402


def serve(port: int, device: str, dtype: str) -> uvicorn.Server:
    engine = FusedEngine.from_pretrained(REPO / "models" / "minilm-l6-squad", device, dtype)
    app = create_app(Settings(request_timeout_ms=5000, max_in_flight=1024),
                     backend=EngineBackend(engine))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning", access_log=False))
    threading.Thread(target=server.run, daemon=True).start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health/ready", timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError("gateway not ready")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--port", type=int, default=18080)
    p.add_argument("--dtype", default="float16")
    p.add_argument("--device", default="cuda")
    p.add_argument("--start-rate", type=float, default=50.0)
    p.add_argument("--budget-ms", type=float, default=10.0)
    p.add_argument("--max-total", type=float, default=150.0)
    args = p.parse_args()
    server = serve(args.port, args.device, args.dtype)
    url = f"http://127.0.0.1:{args.port}"
    # warm the CUDA graphs of common bucket sizes with real traffic first
    subprocess.run([sys.executable, "-m", "loadtest", "run", "--url", url, "--rate", "50",
                    "--duration", "6", "--quiet", "--out", str(args.out / "warmup")],
                   cwd=REPO, check=True)
    subprocess.run([sys.executable, "-m", "loadtest", "capacity", "--url", url,
                    "--budget-ms", str(args.budget_ms), "--start-rate", str(args.start_rate), "--factor", "2",
                    "--max-rate", "6400", "--step-duration", "6", "--refine", "3",
                    "--warmup", "1", "--max-total", str(args.max_total), "--quiet",
                    "--out", str(args.out / "capacity")], cwd=REPO, check=True)
    server.should_exit = True


if __name__ == "__main__":
    main()
