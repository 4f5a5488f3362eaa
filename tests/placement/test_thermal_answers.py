"""What the placement service does with the thermal service's answers for TAPS's die shares
(``services/placement/service.py``): only a pulse-response refusal of ``lags`` (a stack too large) falls back to the
steady model; any other refusal is the request's error; an answer for other die shares than asked (an older thermal
service that ignores ``vault_dies``) is an upstream error, not silently the even matrix."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import services.placement.service as svc
from shared.configs import ArchConfig
from shared.contracts.thermal import InfluenceMatrix, PulseResponse
from shared.errors import BadInput, UpstreamError

REQ: Any = SimpleNamespace(arch=ArchConfig())
DIES = np.array([0.0, 0.0, 1.0, 3.0])


def _pulse(vault_dies: list[float] | None) -> PulseResponse:
    return PulseResponse(model="m", cores=2, slot_ms=1.0, lags=1, core=[[[1.0, 0.0], [0.0, 1.0]]],
                         vault=[[[0.5, 0.0], [0.0, 0.5]]], vault_dies=vault_dies)


def test_only_a_lags_refusal_falls_back_to_the_steady_model(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(field: str) -> Any:
        def call(*a: Any, **k: Any) -> PulseResponse:
            raise BadInput("no", field=field)
        return call

    monkeypatch.setattr(svc, "thermal_pulse_response", refuse("lags"))
    assert svc._pulse_fn(REQ, None)(0.005, 4, DIES) is None  # type: ignore[arg-type]
    monkeypatch.setattr(svc, "thermal_pulse_response", refuse("vault_dies"))
    with pytest.raises(BadInput) as exc:
        svc._pulse_fn(REQ, None)(0.005, 4, DIES)  # type: ignore[arg-type]
    assert exc.value.field == "vault_dies"


def test_an_answer_for_other_die_shares_is_an_upstream_error(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = (DIES / DIES.sum()).tolist()
    for answered, ok in ((asked, True), (None, False), ([0.25] * 4, False)):
        monkeypatch.setattr(svc, "thermal_pulse_response", lambda *a, _v=answered, **k: _pulse(_v))
        monkeypatch.setattr(svc, "thermal_influence", lambda *a, _v=answered, **k: InfluenceMatrix(
            model="m", cores=2, H=[[1.0, 0.0], [0.0, 1.0]], H_vault=[[0.5, 0.1], [0.1, 0.5]], vault_dies=_v))
        if ok:
            got = svc._pulse_fn(REQ, None)(0.005, 1, DIES)  # type: ignore[arg-type]
            assert got is not None and got[1].shape == (1, 2, 2)
            assert svc._vault_influence_fn(REQ, None)(DIES).shape == (2, 2)  # type: ignore[arg-type]
        else:
            with pytest.raises(UpstreamError):
                svc._pulse_fn(REQ, None)(0.005, 1, DIES)  # type: ignore[arg-type]
            with pytest.raises(UpstreamError):
                svc._vault_influence_fn(REQ, None)(DIES)  # type: ignore[arg-type]
    # no shares asked (TACS, the even matrix): nothing to check
    monkeypatch.setattr(svc, "thermal_pulse_response", lambda *a, **k: _pulse(None))
    assert svc._pulse_fn(REQ, None)(0.005, 1, None) is not None  # type: ignore[arg-type]
