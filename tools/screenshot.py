"""Screenshot an HTML report in headless Chromium, to check by eye how it renders in a browser.

Run: ``.venv/bin/python tools/screenshot.py fusekit-report/index.html report.png`` (Debian's
``chromium`` package, or ``--browser PATH``). ``--height`` sets the window height in pixels; the
picture is cut there, so give a tall window for a long report, or ``--split N`` to take N
screenshots of consecutive window-sized slices (``report-1.png``, ``report-2.png``, ...).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

#: Flags that keep a headless run quiet, local and reproducible: no GPU, no network services.
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)


def find_browser(name: str | None = None) -> str | None:
    """The path of a Chromium binary, or None when there is none."""
    for candidate in (name,) if name else ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(candidate)
        if path:
            return path
    return None


def screenshot(
    page: Path,
    out: Path,
    width: int = 1280,
    height: int = 4000,
    browser: str | None = None,
    timeout_s: float = 120.0,
) -> Path:
    """Render ``page`` headless and write a PNG of its first ``width`` x ``height`` pixels.

    Args:
        page: the HTML file.
        out: the PNG to write.
        width: window width in pixels.
        height: window height in pixels.
        browser: the Chromium binary; found on PATH by default.
        timeout_s: how long the browser may take.

    Returns:
        ``out``.

    Raises:
        FileNotFoundError: no page, or no browser.
        RuntimeError: the browser failed or wrote no PNG.
    """
    page = Path(page).resolve()
    if not page.is_file():
        raise FileNotFoundError(f"screenshot: no page at {page}")
    binary = find_browser(browser)
    if binary is None:
        raise FileNotFoundError("screenshot: no chromium on PATH (apt-get install chromium)")
    out = Path(out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="fusekit-chromium-") as profile:
        command = [
            binary,
            *FLAGS,
            f"--user-data-dir={profile}",
            f"--screenshot={out}",
            f"--window-size={width},{height}",
            page.as_uri(),
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0 or not out.is_file():
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"screenshot: {binary} exited {done.returncode}: {tail}")
    return out


def split_png(path: Path, parts: int) -> list[Path]:
    """Cut a tall PNG into ``parts`` horizontal slices beside it (``name-1.png``, ...)."""
    import matplotlib.image as mpimg

    image = mpimg.imread(path)
    step = -(-image.shape[0] // parts)
    written = []
    for k in range(parts):
        piece = image[k * step : (k + 1) * step]
        if piece.shape[0] == 0:
            break
        target = path.with_name(f"{path.stem}-{k + 1}{path.suffix}")
        mpimg.imsave(target, piece)
        written.append(target)
    return written


def main() -> int:
    """Parse the command line and take the screenshot(s)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("page", type=Path, help="the HTML file (e.g. fusekit-report/index.html)")
    parser.add_argument("out", type=Path, help="the PNG to write")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=4000)
    parser.add_argument("--split", type=int, default=1, help="also cut the PNG into N slices")
    parser.add_argument("--browser", help="the Chromium binary (default: found on PATH)")
    args = parser.parse_args()
    try:
        out = screenshot(args.page, args.out, args.width, args.height, args.browser)
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    written = split_png(out, args.split) if args.split > 1 else []
    print(" ".join(str(p) for p in (out, *written)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
