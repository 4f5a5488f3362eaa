"""shared.blas caps every BLAS library numpy and scipy load (they ship separate OpenBLAS builds)."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import json
from shared.blas import limit_blas_threads
limit_blas_threads({n})
from threadpoolctl import threadpool_info
print(json.dumps([(i["filepath"], i["num_threads"]) for i in threadpool_info() if i["user_api"] == "blas"]))
"""


def _blas_threads_after(n: int) -> list[tuple[str, int]]:
    out = subprocess.run([sys.executable, "-c", PROBE.format(n=n)], check=True, capture_output=True, text=True)
    return [(str(p), int(n)) for p, n in json.loads(out.stdout)]


def test_limit_reaches_numpys_and_scipys_blas_in_a_fresh_process() -> None:
    libs = _blas_threads_after(3)  # 3, not 1: the default on a 1- or 2-core machine could not tell them apart
    assert len(libs) >= 2, libs  # numpy's and scipy's OpenBLAS
    assert all(n == 3 for _, n in libs), libs
