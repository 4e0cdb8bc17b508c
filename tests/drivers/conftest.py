"""Fixtures for the drivers: the cluster and the PgBouncer of tests/pooler, reused as
they are (see tests/clients/conftest.py, which loads them the same way).

  pg        a database of its own with etc_batch installed
  bouncer   PgBouncer in front of the cluster, transaction pooling, 3 server connections
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support import pooler_fixtures  # noqa: E402

pooler = pooler_fixtures()

pg = pooler.pg
bouncer = pooler.bouncer
