"""HotSpot file mode over HTTP (seed §4.5 (A), §11.1): export our stack and a power map as HotSpot inputs, import
HotSpot inputs and solve them through exactly the ``tasmoe hotspot`` code path.

Export writes ``logic.flp`` (cores ``C_<y>_<x>``, row y from the north edge), ``dram_<d>.flp`` (banks
``D<d>_<by>_<bx>``), ``tim.flp`` (one block), ``stack.lcf`` (layers farthest from the sink first), ``power.ptrace``
(one line) and ``hotspot.config`` (package, convection ``r_convec = 1/(h·s_sink²)``, grid, ambient). HotSpot run on
these files (``hotspot -c hotspot.config -f logic.flp -p power.ptrace -grid_layer_file stack.lcf -model_type grid
-steady_file ...``) computes the ``hotspot`` variant of our model; when a ``hotspot`` binary is on PATH, ``run_hotspot``
does that and reads its block temperatures back.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from services.thermal import hotspot
from services.thermal.hotspot_io import parse_lcf, parse_temp_file
from services.thermal.model import HOTSPOT_C_CONVEC, KELVIN, get_model
from shared.configs import ArchConfig
from shared.configs.arch import MAX_TRANSIENT_SUBSTEPS
from shared.errors import BadInput, UpstreamError


def _flp(names: list[str], w: float, h: float, x: np.ndarray, y: np.ndarray) -> str:
    lines = ["# Line Format: <unit-name>\\t<width>\\t<height>\\t<left-x>\\t<bottom-y>  (meters)"]
    lines += [f"{n}\t{w:.9f}\t{h:.9f}\t{xx:.9f}\t{yy:.9f}" for n, xx, yy in zip(names, x, y, strict=True)]
    return "\n".join(lines) + "\n"


def export_files(arch: ArchConfig, core_w: list[float], bank_w: list[list[float]] | None = None) -> dict[str, str]:
    """HotSpot input files (name -> text) for ``arch`` and one power map (W)."""
    model = get_model(arch)
    cw = np.asarray(core_w, dtype=float)
    nd, nb = len(model.dram_layers), model.n_banks_per_layer
    bw = np.zeros((nd, nb)) if bank_w is None else np.asarray(bank_w, dtype=float)
    if cw.shape != (model.n_cores,):
        raise BadInput(f"core_w needs {model.n_cores} values", field="core_w")
    if bw.shape != (nd, nb):
        raise BadInput(f"bank_w must be {nd} x {nb}", field="bank_w")
    if np.any(~np.isfinite(cw)) or np.any(cw < 0) or np.any(~np.isfinite(bw)) or np.any(bw < 0):
        raise BadInput("powers must be finite and >= 0", field="core_w")
    g = arch.geometry
    W, H = g.die_mm[0] * 1e-3, g.die_mm[1] * 1e-3
    files: dict[str, str] = {}
    cx, cy = arch.mesh.cores
    xs, ys = np.tile(np.arange(cx), cy), np.repeat(np.arange(cy), cx)
    core_names = [f"C_{y}_{x}" for x, y in zip(xs, ys, strict=True)]
    files["logic.flp"] = _flp(core_names, W / cx, H / cy, xs * W / cx, H - (ys + 1) * H / cy)
    bx, by, _ = arch.dram.banks
    bxs, bys = np.tile(np.arange(bx), by), np.repeat(np.arange(by), bx)
    bank_names = {d: [f"D{d}_{y}_{x}" for x, y in zip(bxs, bys, strict=True)] for d in range(nd)}
    for d in range(nd):
        files[f"dram_{d}.flp"] = _flp(bank_names[d], W / bx, H / by, bxs * W / bx, H - (bys + 1) * H / by)
    files["tim.flp"] = _flp(["TIM"], W, H, np.zeros(1), np.zeros(1))
    lcf = ["# HotSpot layer configuration exported by the TAS-MoE thermal service",
           "# <layer no>, <lateral Y/N>, <power Y/N>, <J/(m^3 K)>, <(m K)/W>, <thickness m>, <floorplan>"]
    header: list[str] = []
    values: list[float] = []
    dram_seen = 0
    for n, layer in enumerate(g.expanded_stack()):
        if layer.kind == "logic":
            flp, power = "logic.flp", True
            header += core_names
            values += cw.tolist()
        elif layer.kind == "dram":
            flp, power = f"dram_{dram_seen}.flp", True
            header += bank_names[dram_seen]
            values += bw[dram_seen].tolist()
            dram_seen += 1
        else:
            flp, power = "tim.flp", False
        lcf += ["", f"# layer {n}: {layer.name}", str(n), "Y", "Y" if power else "N", f"{layer.rho_c_jm3k:.6e}",
                f"{1.0 / layer.k_wmk:.12g}", f"{layer.thickness_um * 1e-6:.6e}", flp]
    files["stack.lcf"] = "\n".join(lcf) + "\n"
    files["power.ptrace"] = "\t".join(header) + "\n" + "\t".join(f"{v:.6f}" for v in values) + "\n"
    cool = g.cooling
    s_sink = cool.sink.side_mm * 1e-3
    amb = cool.ambient_c + KELVIN
    cfg = {
        "s_sink": s_sink, "t_sink": cool.sink.thickness_mm * 1e-3, "k_sink": cool.sink.k_wmk,
        "p_sink": cool.sink.rho_c_jm3k, "r_convec": 1.0 / (cool.h_wmk2k * s_sink * s_sink),
        "c_convec": HOTSPOT_C_CONVEC, "s_spreader": cool.spreader.side_mm * 1e-3,
        "t_spreader": cool.spreader.thickness_mm * 1e-3, "k_spreader": cool.spreader.k_wmk,
        "p_spreader": cool.spreader.rho_c_jm3k, "ambient": amb, "init_temp": amb, "model_secondary": 0,
        "leakage_used": 0, "package_model_used": 0, "model_type": "grid", "grid_rows": model.net.rows,
        "grid_cols": model.net.cols, "grid_map_mode": "avg", "sampling_intvl": 0.001,
    }
    files["hotspot.config"] = "# HotSpot configuration exported by the TAS-MoE thermal service\n" + "".join(
        f"\t-{k}\t{v:.10g}\n" if isinstance(v, float) else f"\t-{k}\t{v}\n" for k, v in cfg.items())
    return files


SAFE_NAME = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def _is_plain(name: str) -> bool:
    """A plain file name: letters, digits, '.', '_' and '-' only, not empty, no leading dot (so no directory part)."""
    return bool(name) and set(name) <= SAFE_NAME and not name.startswith(".")


def _write_files(d: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        if not _is_plain(name):
            raise BadInput(f"file name {name!r}: use letters, digits, '.', '_' and '-' only", field=f"files.{name}")
        (d / name).write_text(text)


_OUTPUTS = ("o", "steady_file", "grid_steady_file")


def _plain(name: str, value: str) -> str:
    """A file option's value must be a plain name (no directory part, no leading dot)."""
    if not _is_plain(value):
        raise BadInput(f"-{name} must be a plain file name (letters, digits, '.', '_', '-')", field=name)
    return value


def _confined_options(d: Path, files: dict[str, str], args: list[str]) -> hotspot.HotspotOptions:
    """HotSpot's options resolved once, the way ``hotspot.parse_options`` resolves them (the ``-c`` config file, then
    the command line over it), and every file option checked *after* resolution, wherever it came from.

    - No option may be given twice on the command line: HotSpot and our CLI would disagree on which one counts.
    - Every file option (``-c -f -p -o -init_file -steady_file -grid_layer_file -grid_steady_file``), from the command
      line or the config file, is a plain name: an input among the uploaded ``files``, an output a new name. It is
      rewritten to its path inside the scratch directory ``d`` before the run, so nothing is read or written outside.
    - Every floorplan named in the effective layer file is a plain name among the uploaded files.
    Nothing of a file's content is echoed unless the user uploaded that file."""
    if len(args) % 2:
        raise BadInput("options come in '-name value' pairs", field="args")
    seen: set[str] = set()
    for k in range(0, len(args), 2):
        if not args[k].startswith("-"):
            raise BadInput(f"expected an option '-name', got {args[k]!r}", field="args")
        name = args[k].lstrip("-")
        if name in seen:
            raise BadInput(f"option -{name} is given twice", field=name)
        seen.add(name)
    cmd = {args[k].lstrip("-"): args[k + 1] for k in range(0, len(args), 2)}
    cfg_name = cmd.get("c")
    if cfg_name is not None and _plain("c", cfg_name) not in files:
        raise BadInput(f"-c {cfg_name}: no such file among the uploaded files", field="c")
    argv = [x for k, v in cmd.items() for x in (f"-{k}", str(d / v) if k == "c" else v)]
    opts = hotspot.parse_options(argv)  # reads the config file from d: the same resolution the run uses
    resolved = dict(opts.values)
    outputs: set[str] = set()
    for name in sorted(hotspot._FILES - {"c"}):  # -c was checked and rewritten above
        value = resolved.get(name)
        if value is None:
            continue
        _plain(name, value)
        if name in _OUTPUTS:
            if value in files or value in outputs:
                raise BadInput(f"-{name} {value}: an output may not overwrite an input or another output",
                               field=name)
            outputs.add(value)
        elif value not in files:
            raise BadInput(f"-{name} {value}: no such file among the uploaded files", field=name)
        resolved[name] = str(d / value)
    lcf = resolved.get("grid_layer_file")
    if lcf is not None:
        for layer in parse_lcf(files[Path(lcf).name], "grid_layer_file"):
            if not _is_plain(layer.flp_file) or layer.flp_file not in files:
                raise BadInput(f"layer {layer.no}: floorplan {layer.flp_file} is not among the uploaded files",
                               field=f"layer {layer.no}")
    for path in (Path(v) for k, v in resolved.items() if k in hotspot._FILES):
        if path.resolve().parent != d.resolve():  # belt and braces: every file the run touches is in d
            raise BadInput(f"{path.name}: outside the scratch directory", field="args")
    return hotspot.HotspotOptions(resolved)


def import_and_solve(files: dict[str, str], args: list[str]) -> dict[str, str]:
    """Run ``tasmoe hotspot <args>`` on the given files in a per-request scratch directory and return the output files
    it wrote (name -> text). File options are confined to the scratch directory (``_confined_options``)."""
    with tempfile.TemporaryDirectory(prefix="tasmoe-hotspot-") as tmp:
        d = Path(tmp)
        _write_files(d, files)
        try:
            opts = _confined_options(d, files, args)
            res = hotspot.run(opts, max_substeps=MAX_TRANSIENT_SUBSTEPS)  # a request's bound (not the CLI's)
            written = hotspot.write_outputs(opts, res)
        except BadInput as exc:  # messages name files as the user did, not by their server path
            def scrub(text: str) -> str:
                return text.replace(f"{d}/", "").replace(str(d), ".")
            raise BadInput(scrub(exc.message), field=scrub(exc.field) if exc.field else exc.field) from None
        return {p.name: p.read_text() for p in written}


def run_hotspot(files: dict[str, str], binary: str = "hotspot") -> dict[str, float]:
    """Run a real HotSpot on exported files (when on PATH) and read its block steady temperatures (K)."""
    exe = shutil.which(binary)
    if exe is None:
        raise UpstreamError(f"no {binary!r} executable on PATH", field="hotspot")
    with tempfile.TemporaryDirectory(prefix="tasmoe-hotspot-") as tmp:
        d = Path(tmp)
        _write_files(d, files)
        cmd = [exe, "-c", "hotspot.config", "-f", "logic.flp", "-p", "power.ptrace", "-grid_layer_file",
               "stack.lcf", "-model_type", "grid", "-steady_file", "out.steady"]
        proc = subprocess.run(cmd, cwd=d, capture_output=True, text=True, timeout=600, check=False)
        if proc.returncode != 0 or not (d / "out.steady").exists():
            raise UpstreamError(f"hotspot failed ({proc.returncode}): {proc.stderr.strip()[:300]}", field="hotspot")
        return parse_temp_file((d / "out.steady").read_text(), "out.steady")
