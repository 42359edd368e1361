"""Rebuild the generated tables of ``docs/results.md`` from the committed cells (:mod:`collab.page` says which
tables and from which results directories), or check that the page agrees with them.

    python benchmarks/results_page.py            # rewrite the tables in place
    python benchmarks/results_page.py --check    # exit 1 and name the tables that differ
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from collab.page import BLOCK, PAGE, render_page  # noqa: E402

MAX_PAGE_BYTES = 2_000_000


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="do not write; exit 1 when a table differs from its cells")
    p.add_argument("--page", type=Path, default=PAGE, help="the Markdown page (default: docs/results.md)")
    args = p.parse_args(argv)
    if not args.page.is_file() or args.page.stat().st_size > MAX_PAGE_BYTES:
        p.error(f"{args.page}: not a file of at most {MAX_PAGE_BYTES} bytes")
    text = args.page.read_text(encoding="utf-8")
    try:
        new = render_page(text)
    except (ValueError, OSError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.check:
        old = {m["name"]: m["body"] for m in BLOCK.finditer(text)}
        stale = [m["name"] for m in BLOCK.finditer(new) if old.get(m["name"]) != m["body"]]
        if stale:
            print(f"{args.page}: tables differ from their cells: {', '.join(stale)} "
                  "(python benchmarks/results_page.py rewrites them)", file=sys.stderr)
            return 1
        print(f"{args.page}: {len(old)} tables agree with their cells")
        return 0
    if new != text:
        args.page.write_text(new, encoding="utf-8")
    print(f"{args.page}: {sum(1 for _ in BLOCK.finditer(new))} tables rebuilt from their cells")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
