"""One COMET run evaluated from its own files, as the COMET binary evaluates it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fusekit.accel.comet.files import CometInputError, load_document, read_arch, read_case
from fusekit.accel.compat import DEVIATIONS, Compat
from fusekit.accel.noc import MeshShapeError
from fusekit.accel.tree import tree_from_dict
from fusekit.accel.tree_model.records import FitError as CometFitError
from fusekit.accel.tree_model.records import TreeModelError as CometModelError
from fusekit.accel.tree_model.report import Report
from fusekit.accel.tree_model.stages import analyse
from fusekit.hw import Accelerator, load
from fusekit.hw.cpu_gpu import plain

__all__ = [
    "DEVIATIONS",
    "CometFitError",
    "CometInputError",
    "CometModelError",
    "Compat",
    "MeshShapeError",
    "arch_document",
    "evaluate",
]

#: Top-level keys of a COMET arch file (``arch.yaml``).
_ARCH_KEYS = ("ComputeTiles", "MemoryTypes", "Hierarchy")


def arch_document(hw: str | Path) -> dict[str, Any]:
    """COMET's arch description of ``hw``, as the tree model reads it.

    ``hw``: a COMET ``arch.yaml`` (read and checked as COMET's files are), or an accelerator
    preset or file with a ``comet_arch`` block (``edge``, ``cloud``).

    Raises:
        CometInputError: a malformed COMET arch file (names the file and the entry).
        ValueError: ``hw`` names hardware without a COMET description (a CPU, a GPU).
    """
    p = Path(hw)
    if p.suffix in (".yaml", ".yml") and p.is_file():
        doc = load_document(p)
        if any(k in doc for k in _ARCH_KEYS):
            read_arch(doc, str(p))
            return doc
    target = load(str(hw))
    if not isinstance(target, Accelerator):
        raise ValueError(
            f"expected an accelerator with a comet_arch, or a COMET arch.yaml (got {hw})"
        )
    preset: dict[str, Any] = plain(target.comet_arch)
    return preset


def evaluate(
    case_dir: str | Path,
    calc_noc_energy: bool | None = None,
    compat: bool | Compat = True,
    hw: str | None = None,
) -> Report:
    """Evaluate one COMET run from its four input files.

    Args:
        case_dir: folder with ``arch.yaml``, ``problem.yaml``, ``mapping.yaml``, ``constants.yaml``;
            or a YAML file holding fusekit's own form of a tree
            (:func:`fusekit.accel.tree.tree_to_dict`).
        calc_noc_energy: add the NoC energy rows (COMET's ``--calc_noc_energy``); by default on,
            unless the folder's ``command.txt`` shows a run without it.
        compat: which of COMET's defects to reproduce (:class:`Compat`, named in
            :data:`DEVIATIONS`): ``True`` all (the binary), ``False`` none (the native model).
        hw: an accelerator preset (``edge``, ``cloud``) whose ``comet_arch`` replaces the run's
            ``arch.yaml``, or another COMET ``arch.yaml`` (:func:`arch_document`); ``None``
            reads the folder's ``arch.yaml``.

    Returns:
        ``total_cycles``, ``total_energy_pj``, ``cycles`` (unit -> CS/OS/TMW parts and total),
        ``energy_pj`` (COMET's energy rows) and ``root_cycles``
        (:class:`fusekit.accel.tree_model.report.Report`).

    Raises:
        CometFitError: the tiling overflows a level (every overflowing level is named).
        CometInputError: a malformed file (names the file and the node).
        CometModelError: a mapping COMET cannot evaluate (names the node).
        MeshShapeError: a collective on a sub-mesh outside COMET's table (compat only).
    """
    d = Path(case_dir)
    if isinstance(compat, bool):
        compat = Compat() if compat else Compat.native()
    if d.is_file():  # fusekit's own form of a tree (tree_to_dict), e.g. from --write-mapping
        tm = tree_from_dict(load_document(d), str(d))
        return analyse(tm, calc_noc=calc_noc_energy is not False, compat=compat)
    if calc_noc_energy is None:
        cmd = d / "command.txt"
        calc_noc_energy = not cmd.exists() or "--calc_noc_energy" in cmd.read_text()
    arch_doc = None
    if hw is not None:
        try:
            arch_doc = arch_document(hw)
        except CometInputError:
            raise
        except ValueError as e:
            raise ValueError(f"comet: {e}") from None
    inp = read_case(d, arch_doc)
    try:
        return analyse(inp, calc_noc=calc_noc_energy, compat=compat)
    except (CometFitError, CometInputError):
        raise
    except (CometModelError, MeshShapeError) as e:
        raise type(e)(f"{inp.mapping_file}: {e}") from None
    except (KeyError, IndexError, ZeroDivisionError, TypeError, AttributeError) as e:
        raise CometModelError(
            f"{inp.mapping_file}: cannot be evaluated ({type(e).__name__}: {e})"
        ) from None
