"""``fusekit sparse sam-replay``: SAM's primitive test vectors through fusekit's primitives."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from fusekit.console import print_json, print_table


def load_vectors(path: Path) -> list[dict[str, Any]]:
    """The records of a vectors file (a JSON list of objects).

    Raises:
        ValueError: naming the file, when it is not such a list.
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise ValueError(f"{path}: expected a JSON list of records (objects)")
    return data


def sam_replay(
    vectors: Annotated[Path, typer.Argument(help="A JSON list of SAM primitive test records.")],
    out: Annotated[
        Path | None, typer.Option(help="Write each record's source and produced streams here.")
    ] = None,
    json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Replay SAM test vectors through the primitives; a pass/fail table (exit 1 if any fail)."""
    from fusekit.sparse.sam.vectors import LATENCY, mismatches, replay_record  # loads numpy

    records = load_vectors(vectors)
    results = []
    for k, record in enumerate(records):
        done = replay_record(record)
        bad = mismatches(record, done)
        results.append(
            {
                "source": record.get("source", f"record {k}"),
                "primitive": record.get("primitive"),
                "passed": not bad,
                "differs": bad,
                "cycles": done.cycles,
                "produced": {p: done.streams.get(p) for p in record.get("expected", done.streams)},
            }
        )
    passed = sum(r["passed"] for r in results)
    if out is not None:
        out.write_text(json_dumps(results), encoding="utf-8")
    if json:
        print_json({"passed": passed, "failed": len(results) - passed, "records": results})
    else:
        print_table(
            f"{vectors}: {passed} of {len(results)} records pass (channel latency {LATENCY})",
            ("source", "primitive", "result"),
            [
                (
                    str(r["source"]).split("::")[-1],
                    r["primitive"],
                    "pass" if r["passed"] else "FAIL: " + ", ".join(r["differs"]),
                )
                for r in results
            ],
        )
    if passed < len(results):
        raise typer.Exit(1)


def json_dumps(data: Any) -> str:
    """Indented JSON (the --out file)."""
    return json.dumps(data, indent=1)
