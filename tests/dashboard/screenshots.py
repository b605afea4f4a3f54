"""Take the README's screenshots of the dashboard: a real cluster, real actors, real Chromium.

The same harness as the dashboard's tests: a master serving the dashboard and two workers on
this machine, a few actors that print and work in waves so that the load charts have something
to show, then headless Chromium through Playwright saves `docs/dashboard.png` (the cluster page),
`docs/dashboard-actors.png` and `docs/dashboard-logs.png` (an actor's log, with a traceback).
Every process stops by PID at the end.

    python -m tests.dashboard.screenshots [--warmup 300]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import tempfile
import time
from pathlib import Path

import parl_remote
from tests.dashboard.conftest import chromium, start_dashboard_cluster
from tests.remote.conftest import client_env

DOCS = Path(__file__).resolve().parents[2] / "docs"


@parl_remote.remote_class(wait=False)
class Sampler:
    """Stands in for an environment sampler: prints progress, burns some CPU."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        print(f"sampler {seed}: environment ready", flush=True)

    def rollout(self, steps: int) -> float:
        """Step a pretend environment `steps` times."""
        total = 0.0
        for i in range(steps):
            total += (i * self.seed) % 7
        print(f"sampler {self.seed}: {steps} steps, mean return {total / steps:.3f}", flush=True)
        return total

    def fail(self) -> None:
        """Raise, as a broken environment would."""
        raise RuntimeError("the environment lost its connection to the simulator")


@parl_remote.remote_class
class Learner:
    """Stands in for a learner that logs its losses."""

    def learn(self, step: int) -> float:
        """One pretend update."""
        loss = 1.0 / (1 + step)
        print(f"step {step}: loss {loss:.4f}", flush=True)
        return loss


def main() -> None:
    """Run the cluster, the workload, and the browser."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=float, default=300.0, help="seconds of load history")
    args = parser.parse_args()
    cluster = start_dashboard_cluster(Path(tempfile.mkdtemp(prefix="parl-shots-")), (4, 2))
    try:
        with client_env(cluster):
            parl_remote.connect(cluster.address, log_to_driver=False)
            samplers = [Sampler(seed) for seed in range(1, 5)]
            learner = Learner()
            deadline = time.monotonic() + args.warmup
            step = 0
            while time.monotonic() < deadline:
                busy = step % 30 < 12  # waves of work, for the charts
                for future in [s.rollout(3_000_000 if busy else 10_000) for s in samplers]:
                    future.get()
                learner.learn(step)
                step += 1
                time.sleep(0.2 if busy else 2.0)
            with contextlib.suppress(RuntimeError):
                samplers[0].fail().get()
            samplers[0].rollout(1000).get()
            del future, samplers[3]  # released: it shows as dead, with why
            gc.collect()
            time.sleep(2)
            _shoot(cluster.url, samplers[0]._parl_ref.actor_id)
    finally:
        cluster.stop()


def _shoot(url: str, sampler_id: str) -> None:
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1360, "height": 760})
        for path, name in [
            ("", "dashboard.png"),
            ("actors", "dashboard-actors.png"),
            (f"actors/{sampler_id}/logs", "dashboard-logs.png"),
        ]:
            page.goto(url + path)
            page.wait_for_selector("#live-status[data-state=live]")
            page.evaluate("window.scrollTo(0, document.scrollingElement.scrollHeight)")
            time.sleep(1.0)
            page.screenshot(path=str(DOCS / name))


if __name__ == "__main__":
    main()
