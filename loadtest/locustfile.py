# mypy: disable-error-code="untyped-decorator,misc"
# (locust is optional: without it installed its decorators and base class are untyped)
"""Locust users for the QA gateway, for people who like Locust's live web dashboard.

    pip install locust
    locust -f loadtest/locustfile.py --host http://127.0.0.1:8080 -u 20 -r 5

Each user asks about one real SQuAD dev question per second (``constant_throughput(1)``), so
``-u`` is roughly the offered rate. Locust users wait for their response before the next request:
when the service stalls they stop sending (coordinated omission), so its percentiles flatter a
slow service. For SLO numbers use ``python -m loadtest`` (open loop); this file is for watching.
Server-Timing phases appear in the statistics as requests of type ``phase``. Only loopback hosts
are accepted.
"""

from __future__ import annotations

import random
from typing import Any, ClassVar

from locust import FastHttpUser, constant_throughput, events, task

from loadtest.servertiming import parse_server_timing
from loadtest.targets import TargetNotAllowed, require_loopback
from loadtest.workload import Payload, squad_payloads


@events.test_start.add_listener
def refuse_remote_hosts(environment: Any, **_: Any) -> None:
    """Fail the run at once (exit code 2); each user's on_start refuses too, before sending."""
    try:
        require_loopback(environment.host or "")
    except TargetNotAllowed:
        environment.process_exit_code = 2
        raise


class QAUser(FastHttpUser):
    wait_time = constant_throughput(1.0)
    bodies: ClassVar[list[Payload]] = []

    def on_start(self) -> None:
        require_loopback(self.host or "")
        if not QAUser.bodies:
            QAUser.bodies = squad_payloads(limit=2000)

    @task
    def ask(self) -> None:
        body = random.choice(QAUser.bodies)
        with self.client.post("/v1/qa", json=body, name="/v1/qa", catch_response=True) as resp:
            if resp.status_code != 200:
                resp.failure(f"HTTP {resp.status_code}")
                return
            for phase, ms in parse_server_timing(resp.headers.get("Server-Timing") or "").items():
                events.request.fire(request_type="phase", name=phase, response_time=ms,
                                    response_length=0, exception=None, context={})
