"""HTTP layer of the metrics service: routers only; the logic lives in plain functions beside this module.

- ``POST /v1/reduce``: a run's windows -> the unified result row and its CSV text (services.metrics.reduce);
  ``POST /v1/reduce/fold`` folds a chunk of a long run's windows into a partial that ``/reduce`` finishes.
- ``POST /v1/compare``: result rows -> the scenario comparison as CSV and Markdown (services.metrics.compare).
- ``POST /v1/plots/{kind}?format=png|svg``: the figure's bytes (services.metrics.plots).
- ``POST /v1/plots/sweep/{kind}?format=png|svg``: a sweep's figure from its table's rows
  (services.metrics.sweep_plots).
"""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, FastAPI, Query, Response
from starlette.concurrency import run_in_threadpool

from services.metrics.compare import compare_all, compare_csv, compare_markdown
from services.metrics.plots import MEDIA_TYPES, render_plot
from services.metrics.reduce import fold_windows, power_report_markdown, reduce_with_power, row_csv
from services.metrics.sweep_plots import render_sweep_plot
from shared.contracts.metrics import (
    CompareRequest,
    CompareResponse,
    FoldRequest,
    PlotKind,
    PlotRequest,
    PowerTableRequest,
    PowerTableResponse,
    ReducePartial,
    ReduceRequest,
    ReduceResponse,
    SweepPlotKind,
    SweepPlotRequest,
)
from shared.service_app import JsonRoute, create_service_app
from shared.settings import Settings, get_settings

router = APIRouter(route_class=JsonRoute, tags=["metrics"])


@router.post("/reduce")
def reduce(req: ReduceRequest) -> ReduceResponse:
    """Reduce a run's per-window metrics to one row of ``results/<scenario>/<workload>.csv`` (with the serving SLO
    ``slo_ttft_p99_ms`` / ``slo_tpot_p99_ms``, both or neither: goodput and whether the run met it)."""
    row, power = reduce_with_power(req.windows, scenario=req.scenario, workload=req.workload, thot_c=req.thot_c,
                                   bw_raw_gbps=req.bw_raw_gbps, partial=req.partial,
                                   slo_ttft_p99_ms=req.slo_ttft_p99_ms, slo_tpot_p99_ms=req.slo_tpot_p99_ms)
    return ReduceResponse(row=row, csv=row_csv(row), power=power)


@router.post("/reduce/fold")
def fold(req: FoldRequest) -> ReducePartial:
    """Fold the next chunk of a run's windows into ``partial`` (sums and extremes, checked as ``/reduce`` checks
    them): a long run is reduced chunk by chunk, then ``/reduce`` with the last chunk and the partial."""
    return fold_windows(req.windows, thot_c=req.thot_c, partial=req.partial)


@router.post("/power/table")
def power_table(req: PowerTableRequest) -> PowerTableResponse:
    """Markdown table of scenarios' power reports: mean / peak W (energy J) per component and per die."""
    return PowerTableResponse(markdown=power_report_markdown({str(k): v for k, v in req.reports.items()}))


@router.post("/compare")
def compare(req: CompareRequest) -> CompareResponse:
    """Scenario comparison per workload with deltas against baseline (°C for temperatures, % for the others)."""
    tables = compare_all(req.rows)
    return CompareResponse(csv=compare_csv(tables), markdown=compare_markdown(tables))


@router.post(
    "/plots/{kind}",
    response_class=Response,
    responses={200: {"content": {"image/png": {}, "image/svg+xml": {}}, "description": "the figure"}},
)
async def plot(kind: PlotKind, req: PlotRequest,
               format: Literal["png", "svg"] = Query(default="png")) -> Response:
    """Render a figure (temperature, performance or heatmap) as PNG or SVG."""
    data = await run_in_threadpool(render_plot, kind, req, format)
    return Response(content=data, media_type=MEDIA_TYPES[format])


@router.post(
    "/plots/sweep/{kind}",
    response_class=Response,
    responses={200: {"content": {"image/png": {}, "image/svg+xml": {}}, "description": "the figure"}},
)
async def sweep_plot(kind: SweepPlotKind, req: SweepPlotRequest,
                     format: Literal["png", "svg"] = Query(default="png")) -> Response:
    """Render a sweep's figure from the rows of its table (orchestrator ``GET /v1/sweeps/{id}``): ``pareto``,
    throughput at the DTM limit against cooling and against the limit per scenario, and the policies' Pareto front
    of energy per token against throughput."""
    data = await run_in_threadpool(render_sweep_plot, kind, req, format)
    return Response(content=data, media_type=MEDIA_TYPES[format])


def create_app(settings: Settings | None = None) -> FastAPI:
    return create_service_app("metrics", settings or get_settings(), [router])
