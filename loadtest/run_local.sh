#!/usr/bin/env bash
# `make loadtest`: start the service locally (Triton + gateway, CPU engine), find its capacity at
# the p99 budget with the open-loop generator, write loadtest/results/capacity-<time>/, stop.
# Knobs (environment): LOADTEST_PORT (gateway, default 8080), LOADTEST_ARGS (extra arguments for
# `python -m loadtest capacity`, e.g. "--budget-ms 50 --max-rate 100 --step-duration 5").
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
PORT=${LOADTEST_PORT:-8080}
URL="http://127.0.0.1:${PORT}"
export QA_HOST=127.0.0.1 QA_PORT="$PORT" QA_LOG_LEVEL=warning

"$PY" -m service.launcher &
launcher=$!
trap 'kill -TERM "$launcher" 2>/dev/null || true; wait "$launcher" 2>/dev/null || true' EXIT

deadline=$((SECONDS + 300))
until curl -fsS "$URL/health/ready" >/dev/null 2>&1; do
  if ! kill -0 "$launcher" 2>/dev/null; then echo "launcher exited before ready" >&2; exit 1; fi
  if (( SECONDS > deadline )); then echo "service not ready after 300 s" >&2; exit 1; fi
  sleep 0.5
done

# shellcheck disable=SC2086  # LOADTEST_ARGS is a list of arguments
"$PY" -m loadtest capacity --url "$URL" --start-rate 5 --max-rate 400 --step-duration 10 \
  --out "loadtest/results/capacity-$(date +%Y%m%d-%H%M%S)" ${LOADTEST_ARGS:-}
