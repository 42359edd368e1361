"""The links and section references between README.md, docs/ and the deployment kits resolve.

* ``[text](path#anchor)``: the file exists and, for a Markdown file, the anchor is one of its headings as GitHub
  makes them (lower case, punctuation dropped, spaces to hyphens, ``-1``, ``-2``, … for repeats) or an explicit
  ``<a id=…>``/``<a name=…>``; ``#anchor`` alone names a heading of the page itself.
* ``page.md, "Section"`` (the pages' way of pointing into another page, also ``page.md ("Section"`` and
  ``README, "Section"``): the section is a heading of that page or a bold lead-in (``**Section.**``), so that moving
  or renaming a section cannot leave a reference behind.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "server" / "README.md",
         ROOT / "client" / "README.md"]
_FENCED = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_SECTION_REF = re.compile(r"((?:\.\./)?[\w./-]*\.md|\bREADME)\)?`?[,:]? \(?\"([^\"]+)\"")


def _prose(text: str) -> str:
    """``text`` without its fenced code blocks (a ``# comment`` in a bash block is no heading)."""
    return _FENCED.sub("", text)


def _headings(text: str) -> list[str]:
    """The headings of a Markdown text, as written (inline code and emphasis marks dropped)."""
    return [re.sub(r"[`*]", "", h) for h in re.findall(r"^#{1,6}\s+(.*?)\s*#*\s*$", _prose(text), re.M)]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: ``## `hacrl-fed simulate`: the whole`` -> ``hacrl-fed-simulate-the-whole``."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)        # a link keeps its text
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    found, seen = set(), {}
    for heading in _headings(text):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found | set(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", text))


def sections(text: str) -> list[str]:
    """What a ``page.md, "Section"`` reference may name: headings and bold lead-ins, whitespace collapsed."""
    bold = re.findall(r"\*\*([^*]+?)\*\*", _prose(text))
    named = [" ".join(s.split()) for s in (*_headings(text), *bold)]
    return named + [re.sub(r"^\d+\. ", "", s) for s in named]          # "3. Network exposure" or "Network exposure"


def _resolve(page: Path, target: str) -> Path | None:
    """The file a reference names: relative to the page, else to the repository root, else in docs/."""
    if target == "README":
        return ROOT / "README.md"
    for base in (page.parent, ROOT, ROOT / "docs"):
        if (base / target).is_file():
            return (base / target).resolve()
    return None


def broken_links(page: Path, text: str) -> list[str]:
    problems = []
    for target in _LINK.findall(_prose(text)):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue                                   # https:, mailto:
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            problems.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text(encoding="utf-8")):
            problems.append(f"{target}: no heading with anchor #{anchor} in {dest.name}")
    return problems


def broken_section_refs(page: Path, text: str) -> list[str]:
    problems = []
    for target, name in _SECTION_REF.findall(_prose(text)):
        dest = _resolve(page, target)
        if dest is None:
            continue                                   # a file named in prose only (a benchmark's results.md)
        name = " ".join(name.split())
        if not any(s.startswith(name) for s in sections(dest.read_text(encoding="utf-8"))):
            problems.append(f'{target}, "{name}": no such section in {dest.relative_to(ROOT)}')
    return problems


def _name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def test_every_link_and_anchor_resolves():
    problems = [f"{_name(p)}: {m}" for p in PAGES for m in broken_links(p, p.read_text(encoding="utf-8"))]
    assert problems == []


def test_every_section_reference_names_a_section():
    problems = [f"{_name(p)}: {m}" for p in PAGES for m in broken_section_refs(p, p.read_text(encoding="utf-8"))]
    assert problems == []


def test_the_readme_links_every_docs_page():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    linked = {Path(t.partition("#")[0]).name for t in _LINK.findall(readme) if t.startswith("docs/")}
    assert {p.name for p in (ROOT / "docs").glob("*.md")} <= linked


def test_the_checks_catch_a_broken_anchor_and_a_moved_section():
    page = ROOT / "docs" / "results.md"
    assert slug("`hacrl-fed simulate`: the whole federation, on one machine") == \
        "hacrl-fed-simulate-the-whole-federation-on-one-machine"
    assert anchors("## A b\n\n## A b\n```bash\n# not a heading\n```\n") == {"a-b", "a-b-1"}
    assert broken_links(page, "[x](commands.md#real-models-offline)") == []
    assert broken_links(page, "[x](commands.md#no-such-section)") != []
    assert broken_links(page, "[x](no-such-page.md)") != []
    assert broken_section_refs(page, '[commands.md](commands.md), "Real models offline"') == []
    assert broken_section_refs(page, 'see commands.md, "No such section"') != []
