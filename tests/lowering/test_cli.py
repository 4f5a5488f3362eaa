"""``tasmoe lower`` CLI."""

from __future__ import annotations

import json

import pytest

from services.cli import main


def test_lower_gemm_json(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["lower", "gemm", "--m", "32", "--k", "4096", "--n", "14336", "--array", "32x32", "--dataflow", "ws",
               "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("compute_cycles", "total_cycles", "dram_bytes", "energy_j", "instructions"):
        assert key in out
    assert out["compute_cycles"] == 128 * 448 * (32 + 64 + 30)  # ceil(K/R)·ceil(N/C)·(M+2R+C−2)
    assert out["total_cycles"] >= out["compute_cycles"]
    assert out["dram_bytes"] >= out["compulsory_bytes"]
    assert out["instructions"] > 0 and out["violations"] == 0


def test_lower_op_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lower", "op", "rmsnorm", "M=8", "N=1024", "--json", "--emit"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kind"] == "rmsnorm" and out["instructions"] and out["violations"] == []
    assert main(["lower", "op", "softmax", "M=4", "N=0"]) == 2
    assert "N" in capsys.readouterr().err
    assert main(["lower", "gemm", "--m", "4", "--k", "4", "--n", "4", "--dtype", "fp4"]) == 2
    assert "dtype" in capsys.readouterr().err
    assert main(["lower", "op", "softmax", "M=4", "bogus"]) == 2
    assert "key=value" in capsys.readouterr().err
