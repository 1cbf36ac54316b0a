"""Line-count report of src/fusekit by part (tinygrad-style): code lines, not blanks or comments.

Run by ``make test`` so that every CI log shows where the code is; parts should shrink by moving
shared code down into ``ir``, ``hw`` or ``search``, never sideways.
"""

from __future__ import annotations

import sys
import tokenize
from collections import Counter
from pathlib import Path


def code_lines(path: Path) -> int:
    """Lines holding at least one token other than comments, docstrings and blank lines."""
    lines: set[int] = set()
    previous = tokenize.NEWLINE
    with path.open("rb") as f:
        for token in tokenize.tokenize(f.readline):
            if token.type in (
                tokenize.COMMENT,
                tokenize.NL,
                tokenize.NEWLINE,
                tokenize.ENCODING,
                tokenize.INDENT,
                tokenize.DEDENT,
                tokenize.ENDMARKER,
            ):
                previous = token.type if token.type != tokenize.COMMENT else previous
                continue
            is_docstring = token.type == tokenize.STRING and previous in (
                tokenize.NEWLINE,
                tokenize.INDENT,
                tokenize.DEDENT,
            )
            if not is_docstring:
                lines.update(range(token.start[0], token.end[0] + 1))
            previous = token.type
    return len(lines)


def main() -> None:
    """Print the table for the folder given (default: src/fusekit)."""
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "src/fusekit")
    per_part: Counter[str] = Counter()
    files: Counter[str] = Counter()
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        part = relative.parts[0] if len(relative.parts) > 1 else "(top)"
        per_part[part] += code_lines(path)
        files[part] += 1
    width = max(len(p) for p in per_part)
    print(f"{'part':<{width}}  files  code lines")
    for part, count in sorted(per_part.items(), key=lambda kv: -kv[1]):
        print(f"{part:<{width}}  {files[part]:>5}  {count:>10}")
    print(f"{'total':<{width}}  {sum(files.values()):>5}  {sum(per_part.values()):>10}")


if __name__ == "__main__":
    main()
