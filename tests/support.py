"""What every pytest suite of etc_batch shares: bounded waiting.

Each suite's conftest.py puts this directory on sys.path and imports from here.
"""

import time

# Upper bound for anything a test waits for (a backend to reach a point, a lock to be
# requested, a backend to exit). Generous, for slow machines; a test only ever waits
# this long when something is wrong.
WAIT = 20.0
POLL_INTERVAL = 0.05


def wait_until(predicate, what, timeout=WAIT, interval=POLL_INTERVAL):
    """Polls predicate() until it returns something truthy and returns that, or fails
    the test after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)
