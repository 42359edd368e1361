"""docs/results.md's generated tables agree with a recomputation from the committed cells
(``benchmarks/results_page.py``, :mod:`collab.page`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from collab import page  # noqa: E402

SCRIPT = ROOT / "benchmarks" / "results_page.py"


def test_every_generated_table_of_the_results_page_agrees_with_its_cells():
    text = page.PAGE.read_text(encoding="utf-8")
    names = [m["name"] for m in page.BLOCK.finditer(text)]
    assert set(names) == set(page.TABLES), "every table of collab.page.TABLES sits in docs/results.md once"
    assert len(names) == len(set(names))
    assert page.render_page(text) == text, "python benchmarks/results_page.py rewrites the stale tables"


def test_a_number_changed_by_hand_is_caught_and_restored(tmp_path):
    text = page.PAGE.read_text(encoding="utf-8")
    body = next(m for m in page.BLOCK.finditer(text) if m["name"] == "collab-tasks")["body"]
    assert "+20.7" in body   # HACPO cross-family − isolated GSPO for Gemma, mean over 2 seeds × 128 items
    edited = tmp_path / "results.md"
    edited.write_text(text.replace(body, body.replace("+20.7", "+21.7", 1)), encoding="utf-8")
    run = subprocess.run([sys.executable, str(SCRIPT), "--check", "--page", str(edited)], capture_output=True,
                         text=True, cwd=ROOT)
    assert run.returncode == 1 and "collab-tasks" in run.stderr
    assert subprocess.run([sys.executable, str(SCRIPT), "--page", str(edited)], cwd=ROOT,
                          capture_output=True).returncode == 0
    assert edited.read_text(encoding="utf-8") == text


def test_an_unknown_table_name_is_refused(tmp_path):
    bad = tmp_path / "results.md"
    bad.write_text("<!-- table: no-such-table -->\n| x |\n<!-- end table -->\n", encoding="utf-8")
    run = subprocess.run([sys.executable, str(SCRIPT), "--check", "--page", str(bad)], capture_output=True,
                         text=True, cwd=ROOT)
    assert run.returncode == 2 and "no-such-table" in run.stderr
    with pytest.raises(ValueError, match="unknown table"):
        page.render_page(bad.read_text(encoding="utf-8"))


def test_differences_are_t_intervals_on_the_seeds_and_bold_only_when_they_exclude_zero():
    before, cells = page.load(ROOT / "benchmarks" / "results" / "collab-tasks")
    # Gemma, HACPO cross-family − GSPO×2: +13.3 and +7.0 points at the two seeds; one degree of freedom
    assert page.cell(("per_seed", "hacpo_cross_family", "gspo_x2", "gemma3", "held_out"), before, cells) \
        == "+13.3, +7.0"
    text = page.cell(("diff", "hacpo_cross_family", "gspo_x2", "gemma3", "held_out"), before, cells)
    assert text.startswith("+10.2 [−") and "**" not in text
    assert page.cell(("mde", "hacpo_cross_family", "gspo_x2", "gemma3", "held_out"), before, cells) == "49.0"


def test_a_recipe_without_cells_renders_as_not_run_and_the_others_still_render():
    before, cells = page.load(ROOT / "benchmarks" / "results" / "collab-tasks")
    partial = {r: cs for r, cs in cells.items() if r != "gspo_x2"}
    for spec in (("acc", "gspo_x2", "gemma3", "held_out"), ("seeds", "gspo_x2", "gemma3", "held_out"),
                 ("diff", "hacpo_cross_family", "gspo_x2", "gemma3", "held_out"),
                 ("mde", "gspo_x2", "gspo", "gemma3", "held_out"),
                 ("contrib_rows", "gspo_x2+contrib", "gemma3")):
        assert page.cell(spec, before, partial) == page.NOT_RUN
    assert page.cell(("diff", "hacpo_cross_family", "gspo", "gemma3", "held_out"), before, partial) \
        == page.cell(("diff", "hacpo_cross_family", "gspo", "gemma3", "held_out"), before, cells) != page.NOT_RUN
    assert page.cell(("before", "gemma3", "held_out"), before, {}) != page.NOT_RUN


def test_before_task_is_the_accuracy_on_one_tasks_items():
    before = {"agents": {"a": {"held_out": {"chain_sum-0": "correct", "chain_sum-1": "wrong_answer",
                                            "decimal_chain_sum-0": "correct", "decimal_chain_sum-1": "correct",
                                            "decimal_chain_sum-2": "truncated", "decimal_chain_sum-3": "correct"}}},
              "tasks": {"chain_sum-0": "chain_sum", "chain_sum-1": "chain_sum", "decimal_chain_sum-0": "decimal_chain_sum",
                        "decimal_chain_sum-1": "decimal_chain_sum", "decimal_chain_sum-2": "decimal_chain_sum",
                        "decimal_chain_sum-3": "decimal_chain_sum"}}
    assert page.cell(("before_task", "a", "held_out", "chain_sum"), before, {}) == "50.0"
    assert page.cell(("before_task", "a", "held_out", "decimal_chain_sum"), before, {}) == "75.0"


def test_a_new_cell_rewrites_the_tables_made_from_its_directory_only(tmp_path):
    import json
    import shutil

    dirs = sorted({spec["dir"] for spec in page.TABLES.values()})
    for d in dirs:
        shutil.copytree(ROOT / d, tmp_path / d)
    doc = tmp_path / "docs" / "results.md"
    doc.parent.mkdir()
    doc.write_text(page.PAGE.read_text(encoding="utf-8"), encoding="utf-8")
    unused = tmp_path / "benchmarks" / "results" / "not-on-the-page"
    unused.mkdir()
    assert page.refresh_page(unused, doc, tmp_path) == []
    # a cell whose Gemma answers are all right lands in collab-tasks: its tables change, the others stay
    cells = tmp_path / "benchmarks/results/collab-tasks/cells"
    rec = json.loads((cells / "hacpo_cross_family-s0.json").read_text())
    held_out = rec["after"]["gemma3"]["held_out"]   # problem id → outcome
    rec["after"]["gemma3"]["held_out"] = dict.fromkeys(held_out, "correct")
    (cells / "hacpo_cross_family-s0.json").write_text(json.dumps(rec))
    old = {m["name"]: m["body"] for m in page.BLOCK.finditer(doc.read_text(encoding="utf-8"))}
    names = page.refresh_page(tmp_path / "benchmarks/results/collab-tasks", doc, tmp_path)
    assert set(names) == {n for n, s in page.TABLES.items() if s["dir"] == "benchmarks/results/collab-tasks"}
    new = {m["name"]: m["body"] for m in page.BLOCK.finditer(doc.read_text(encoding="utf-8"))}
    changed = {n for n in new if new[n] != old[n]}
    assert changed and changed <= set(names)
