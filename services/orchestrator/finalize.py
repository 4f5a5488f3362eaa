"""After the last scenario of an experiment: the comparison table and plots (best effort: a plot the metrics service
cannot draw is logged, the results stand)."""

from __future__ import annotations

import logging
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from services.orchestrator import repository as repo
from services.orchestrator.pipeline_clients import Pipeline
from services.orchestrator.service import results_csv, window_series
from shared.client import ServiceClients
from shared.errors import TasmoeError

log = logging.getLogger(__name__)

PLOT_KINDS = ("temperature", "performance")


def finalize_experiment(*, sessions: sessionmaker[Session], clients: ServiceClients, exp_id: str) -> Path | None:
    """Write ``<out>/summary.csv`` (the scenario rows under one header) and ``<out>/plots/*``."""
    with sessions() as s:
        exp = repo.get_experiment(session=s, exp_id=exp_id)
        if exp is None:
            return None
        out = Path(exp.out_dir)
        table = results_csv(session=s, exp_id=exp_id)
        series = window_series(session=s, exp_id=exp_id, scenario=None)
    out.mkdir(parents=True, exist_ok=True)
    summary = out / "summary.csv"
    summary.write_text(table, encoding="utf-8")
    pipe = Pipeline(clients, run_key=exp_id)
    plots = out / "plots"
    for kind in PLOT_KINDS:
        try:
            data, ctype = pipe.plot(kind, {"csv": table, "series": series})
        except TasmoeError as exc:
            log.warning("plot %s for %s not drawn: %s", kind, exp_id, exc)
            continue
        ext = "svg" if "svg" in ctype else "png" if "png" in ctype else "bin"
        plots.mkdir(parents=True, exist_ok=True)
        (plots / f"{kind}.{ext}").write_bytes(data)
    return summary
