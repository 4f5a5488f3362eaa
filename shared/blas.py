"""The number of threads of the BLAS library under numpy/scipy (OpenBLAS), per process.

OpenBLAS starts one thread per core and uses them for every product above a small size. The services' products are
small (64 × 64 DCT matrices, per-window mat-vecs) and a machine runs several service processes or scenario runs at
once, so the threads mostly wait for each other: on the 2-core machine under load one thermal window step took 16 ms
with the default and 3.5 ms with one thread. ``Settings.blas_threads`` (default 1) is applied when a service app is
built (``shared.service_app.create_service_app``) and by the benchmarks; threadpoolctl does it for whichever BLAS is
loaded.
"""

from __future__ import annotations

import threading

_lock = threading.Lock()
_applied: int | None = None


def limit_blas_threads(n: int) -> None:
    """Cap the loaded BLAS libraries at ``n`` threads for the rest of the process (``n <= 0``: leave them)."""
    global _applied
    if n <= 0:
        return
    with _lock:
        if _applied == n:
            return
        # threadpoolctl acts on the libraries loaded now: load numpy's and scipy's (separate OpenBLAS builds) first
        import numpy  # noqa: F401
        import scipy.linalg  # noqa: F401
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=n, user_api="blas")
        _applied = n


__all__ = ["limit_blas_threads"]
