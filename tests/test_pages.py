"""The docs' results pages are their render from the published tables (studies/pages.py): no number
typed by hand, none drifted from its table."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from studies import pages, stale

PAGES = pages.pages()


def test_the_readme_the_index_and_the_study_pages_are_rendered():
    assert {"README.md", "docs/results.md", "docs/studies/tiny.md"} <= set(PAGES)


@pytest.mark.parametrize("output", sorted(PAGES))
def test_page_is_its_render_from_the_published_tables(output):
    assert pages.differences(PAGES[output]) == [], "rerender: python -m studies pages"


@pytest.mark.parametrize("output", sorted(PAGES))
def test_page_prints_no_number_that_no_table_gave(output):
    assert pages.typed_numbers(PAGES[output]) == []


def _page(tmp_path, text: str, study: str | None = "tiny") -> pages.Page:
    template = tmp_path / "page.md.j2"
    template.write_text(text)
    return pages.Page(str(tmp_path / "page.md"), str(template), study)


def test_a_typed_number_is_found_and_named(tmp_path):
    """The audit's kind of error: a count typed into prose ("6 of its 18 cells never rose") instead of
    read from the table."""
    page = _page(tmp_path, "and 6 of its {{ s.csv('stability.csv', 'avx512-amx').rows() | count }} cells "
                           "never rose (`min_rise: 0.1`, qwen2-m, k3, 0.32.0)\n")
    hits = pages.typed_numbers(page)
    assert [t.split(":")[0] for t in hits] == ["line 1", "line 1"]
    assert "measured number '12' in prose" in hits[0] and "'6'" in hits[1]  # the table's count: in prose too


@pytest.mark.parametrize("typed", ["0.5", "36x", "58%", "1e-6", "2-4", "3.1e-4", "1,024", "12.", "about a third",
                                   "tenfold", "three orders of magnitude", "half"])
def test_every_shape_of_number_is_caught(tmp_path, typed):
    assert pages.typed_numbers(_page(tmp_path, f"cuts it {typed} here\n")), typed


@pytest.mark.parametrize("name", ["qwen2-m", "k3", "bf16", "Qwen3-8B", "vLLM 0.32.0", "AVX-512", "(2026)",
                                  "`steps: 60`", "[x](../a/b2.md)", "<!-- 5 -->"])
def test_names_versions_code_and_links_are_not_numbers(tmp_path, name):
    assert pages.typed_numbers(_page(tmp_path, f"a {name} b\n")) == []


def test_a_page_that_drifted_from_its_table_is_found(tmp_path):
    page = _page(tmp_path, "{{ s.csv('stability.csv', 'avx512-amx').rows() | count }} cells\n")
    pages.write(page)
    assert pages.differences(page) == []
    (tmp_path / "page.md").write_text("11 cells\n")  # a number edited by hand
    assert "differs from its render" in pages.differences(page)[0]


def test_the_ledger_names_each_number_and_its_source(tmp_path):
    page = _page(tmp_path, "{% set h = s.csv('headline.csv', 'avx512-amx').where(ablation='all') %}"
                           "{{ between(h.col('k3 KL').min(), h.col('k3 KL').max(), 'sig') }}\n")
    text, ledger = pages.render(page)
    table = pd.read_csv(pages.ROOT / "studies/tiny/published/avx512-amx/headline.csv")
    k3 = table[table["ablation"] == "all"]["k3 KL"]
    assert text == f"{pages.TEXTS['sig'][0](k3.min())}-{pages.TEXTS['sig'][0](k3.max())}\n"
    assert list(ledger["value"].astype(float)) == [k3.min(), k3.max()]
    assert ledger["source"].str.contains("headline.csv\\[ablation=all\\]\\['k3 KL'\\]").all()


def test_counts_over_rows_name_what_they_counted(tmp_path):
    page = _page(tmp_path, "{% set st = s.csv('stability.csv', 'avx512-amx') %}"
                           "{{ st.col('max_k3_kl').above(st.col('max_k3_kl').median()) | count }} of "
                           "{{ st.rows() | count }}; {{ st.col('reason').count('no_rise') | count }}\n")
    text, ledger = pages.render(page)
    table = pd.read_csv(pages.ROOT / "studies/tiny/published/avx512-amx/stability.csv")
    above = int((table["max_k3_kl"] > table["max_k3_kl"].median()).sum())
    assert text == f"{above} of {len(table)}; {int((table['reason'] == 'no_rise').sum())}\n"
    assert "count of values above median of" in ledger["source"].iloc[0]


def test_a_number_typed_into_a_placeholder_is_refused(tmp_path):
    with pytest.raises(TypeError, match="not a number read from a table"):
        pages.render(_page(tmp_path, "{{ 36 | fold }}\n"))
    with pytest.raises(TypeError, match="typed into a template"):
        pages.render(_page(tmp_path, "{{ (s.csv('headline.csv', 'avx512-amx').col('k3 KL').max() / 2) | fold }}\n"))


def test_a_missing_column_or_file_is_named(tmp_path):
    with pytest.raises(KeyError, match="no column 'k4'"):
        pages.render(_page(tmp_path, "{{ s.csv('headline.csv', 'avx512-amx').col('k4').max() | sig }}\n"))
    with pytest.raises(FileNotFoundError, match="published no studies/tiny/published/nope.csv"):
        pages.render(_page(tmp_path, "{{ s.csv('nope.csv').rows() | count }}\n"))


def test_formats():
    sig, fold, pct = (pages.TEXTS[h][0] for h in ("sig", "fold", "pct"))
    assert [sig(7.46e-5), sig(2.0), sig(36.3), fold(4.0), pct(0.5759)] == ["7.5e-5", "2.0", "36", "4.0", "58"]


def test_a_range_whose_ends_print_alike_prints_one_number():
    between = pages.formatters(pages.Ledger(marking=False))["between"]
    assert between(pages.Num(0.0, "a"), pages.Num(0.0, "b"), "count") == "0"
    assert between(pages.Num(3.12, "a"), pages.Num(3.14, "b"), "fold") == "3.1x"
    assert between(pages.Num(3.12, "a"), pages.Num(3.2, "b"), "fold") == "3.1-3.2x"


def test_the_command_checks_without_writing():
    from studies.__main__ import main

    before = (pages.ROOT / "docs/studies/tiny.md").stat().st_mtime_ns
    assert main(["pages", "--check"]) == 0
    assert (pages.ROOT / "docs/studies/tiny.md").stat().st_mtime_ns == before


@pytest.mark.parametrize("output", sorted(PAGES))
def test_every_table_of_measured_numbers_states_its_conditions(output):
    assert pages.table_problems(PAGES[output]) == []


def test_a_measured_number_in_prose_is_found_and_a_setting_is_not(tmp_path):
    page = _page(tmp_path, "cut {{ s.csv('headline.csv', 'avx512-amx').col('k3 KL').max() | sig }} in "
                           "{{ config('experiments/tiny.yaml', 'steps') | count }} steps\n")
    assert [t.split(":")[0] for t in pages.typed_numbers(page)] == ["line 1"]
    assert "measured number" in pages.typed_numbers(page)[0]


def _conditions(**given):
    said = {c.replace(" ", "_"): f"its {c}" for c in pages.CONDITIONS}
    return {**said, **given}


def test_a_table_without_its_conditions_is_found(tmp_path):
    typed = ("| ablation | k3 |\n| --- | --- |\n"
             "| all | {{ s.csv('headline.csv', 'avx512-amx').col('k3 KL').max() | sig }} |\n")
    assert "states no machine, engine" in pages.table_problems(_page(tmp_path, typed))[0]
    built = ("{% set t = rows(**c) %}{% do t.row(ablation='all', k3=s.csv('headline.csv', 'avx512-amx')"
             ".col('k3 KL').max() | sig) %}{{ t }}\n")
    whole = _page(tmp_path, "{% set c = " + repr(_conditions()) + " %}" + built)
    assert pages.table_problems(whole) == [] and pages.typed_numbers(whole) == []
    lacking = _page(tmp_path, "{% set c = " + repr({k: v for k, v in _conditions().items() if k != "seeds"})
                    + " %}" + built)
    with pytest.raises(ValueError, match="states no \\['seeds'\\]"):
        pages.render(lacking)
    with pytest.raises(ValueError, match="give its conditions"):
        pages.render(_page(tmp_path, "{{ s.table('headline.md', 'avx512-amx') }}\n"))


def test_a_caption_missing_a_condition_is_found(tmp_path):
    """The check reads the rendered caption, not the builder: a caption written by hand that drops a
    condition fails."""
    caption = "*Conditions:* " + "; ".join(f"**{c}** x" for c in pages.CONDITIONS if c != "reference")
    page = _page(tmp_path, "| k3 |\n| --- |\n| {{ s.csv('headline.csv', 'avx512-amx').col('k3 KL').max() | sig }} |\n\n"
                           + caption + "\n")
    assert "states no machine" in pages.table_problems(page)[0]  # a caption typed by hand is no caption


def test_conditions_that_vary_become_columns_and_the_rest_the_caption(tmp_path):
    page = _page(tmp_path, "{% set t = rows(**c) %}"
                           "{% do t.row(reference='engine forward', k3=h.col('k3 KL').max() | sig) %}"
                           "{% do t.row(reference='engine sampling', k3=h.col('k3 KL').min() | sig) %}{{ t }}\n")
    page_text = "{% set c = " + repr(_conditions()) + " %}{% set h = s.csv('headline.csv', 'avx512-amx') %}"
    (tmp_path / "page.md.j2").write_text(page_text + (tmp_path / "page.md.j2").read_text())
    text, _ = pages.render(page)
    header, caption = text.split("\n")[0], text.strip().split("\n")[-1]
    assert header == "| k3 | reference |"
    assert caption.startswith("*Conditions:* **machine** its machine") and "**reference**" not in caption
    assert pages.table_problems(page) == []


def test_a_publication_says_whether_it_is_stale(tmp_path):
    text, _ = pages.render(_page(tmp_path, "{{ s.conditions('avx512-amx')['publication'] }}\n"))
    status = stale.publication("studies/tiny/published/avx512-amx").status
    assert text.strip() == status and status.startswith(("stale: ", "current at "))


def test_the_readme_is_one_screen_with_both_commands_first():
    text = (pages.ROOT / "README.md").read_text()
    lines = text.split("\n")
    assert len(lines) <= 80 and len(text) <= 6000, (len(lines), len(text))
    first = "\n".join(lines[:30])
    assert "make run" in first and "make test" in first
