"""Fixtures for the drivers: the cluster and the PgBouncer of tests/pooler, reused as
they are (see tests/clients/conftest.py, which loads them the same way).

  pg        a database of its own with etc_batch installed
  bouncer   PgBouncer in front of the cluster, transaction pooling, 3 server connections
"""

import importlib.util
import sys
from pathlib import Path

_POOLER_CONFTEST = Path(__file__).resolve().parents[1] / "pooler" / "conftest.py"
_MODULE = "etc_batch_pooler_fixtures"


def _load_pooler_fixtures():
    if _MODULE in sys.modules:
        return sys.modules[_MODULE]
    spec = importlib.util.spec_from_file_location(_MODULE, _POOLER_CONFTEST)
    module = importlib.util.module_from_spec(spec)
    sys.modules[_MODULE] = module
    spec.loader.exec_module(module)
    return module


pooler = _load_pooler_fixtures()

pg = pooler.pg
bouncer = pooler.bouncer
