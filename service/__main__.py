"""``python -m service``: run the gateway alone (Triton must already be running)."""

from __future__ import annotations

import uvicorn

from service.settings import settings_or_exit


def main() -> None:
    settings = settings_or_exit()
    uvicorn.run(
        "service.app:create_app", factory=True, host=settings.host, port=settings.port,
        workers=settings.workers, log_level=settings.log_level, access_log=False,
        # without it uvicorn waits for every open connection, a stalled upload too
        timeout_graceful_shutdown=settings.shutdown_timeout_s,
    )


if __name__ == "__main__":
    main()
