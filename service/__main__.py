"""``python -m service``: run the gateway alone (Triton must already be running)."""

from __future__ import annotations

import uvicorn

from service.settings import settings_or_exit


def main() -> None:
    settings = settings_or_exit()
    uvicorn.run(
        "service.app:create_app", factory=True, host=settings.host, port=settings.port,
        workers=settings.workers, log_level=settings.log_level, access_log=False,
    )


if __name__ == "__main__":
    main()
