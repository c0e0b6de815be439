"""The documentation: the MkDocs site under docs/ builds with --strict (a broken link or
anchor, a missing image or a page left out of the nav fails it), and README stays short,
keeps CI's commands and points at pages and anchors that exist.

The site is split in two. Reading pages (docs/*.md) are read: every word on them counts
against a budget that reads in about an hour and leaves room for what docs/extending.md
tells a contributor to add. Reference pages (docs/reference/*.md) are looked up: the CLI's
usage and the tables the reading pages summarise; no word cap (it would invite cutting
evidence), but every table on them is written by a script or declared with what keeps it
true, and each is linked from a reading page."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
REFERENCE = DOCS / "reference"
LINK = re.compile(r"\]\((docs/[^)\s]+)\)")


def reading_pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def reference_pages() -> list[Path]:
    return sorted(REFERENCE.glob("*.md"))


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
                        "--site-dir", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"mkdocs build --strict failed:\n{r.stdout}\n{r.stderr}"
    return out


def test_site_builds_strict(site):
    assert (site / "index.html").is_file()
    for page in DOCS.rglob("*.md"):
        if page.name != "index.md":
            rel = page.relative_to(DOCS).with_suffix("")
            assert (site / rel / "index.html").is_file(), rel


def readme_links() -> list[str]:
    return LINK.findall(README.read_text())


def test_readme_links_point_at_pages_and_anchors_that_exist(site):
    links = readme_links()
    assert links, "README links to no docs page"
    for link in links:
        path, _, anchor = link.partition("#")
        assert (ROOT / path).is_file(), f"README links to {path}, which does not exist"
        if anchor:
            rel = Path(path).relative_to("docs")
            html = site / ("index.html" if rel.name == "index.md" else f"{rel.with_suffix('')}/index.html")
            assert f'id="{anchor}"' in html.read_text(), f"README links to {link}: no such anchor"


def test_readme_maps_every_page():
    linked = {link.partition("#")[0] for link in readme_links()}
    pages = {str(p.relative_to(ROOT)) for p in DOCS.rglob("*.md")}
    assert pages <= linked, f"pages missing from README's map: {sorted(pages - linked)}"


def test_readme_is_short_and_keeps_the_commands():
    text = README.read_text()
    assert len(text.encode()) <= 10_000, f"README is {len(text.encode())} bytes; keep it under 10 KB, move detail to docs/"
    for cmd in ("pip install -e . && sim run --trace swebench --policy continuum --jps 0.5 --num-gpu-blocks 6000", "make test", "make test-fast"):
        assert cmd in text, cmd
    assert "make test" in (ROOT / ".ci" / "run").read_text()  # what CI runs is what README says


def test_cli_usage_blocks_are_what_sim_prints():
    r = subprocess.run([sys.executable, "-m", "agentsim.cli_usage", "--check"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_every_policy_is_documented():
    from policies.registry import POLICIES

    cli, pol = (REFERENCE / "cli.md").read_text(), (DOCS / "policies.md").read_text()
    rows = (REFERENCE / "policies.md").read_text()
    missing = [p for p in POLICIES if f"`{p}`" not in pol or f"| `{p}` |" not in rows or p not in cli]
    assert not missing, f"policies missing from docs/policies.md, a row of docs/reference/policies.md or docs/reference/cli.md: {missing}"


def test_every_router_is_documented():
    from sim.cluster.router import router_names

    config, clusters = (REFERENCE / "config.md").read_text(), (DOCS / "offload.md").read_text()
    row = next(ln for ln in config.splitlines() if ln.startswith("| `cluster.router` |"))
    missing = [r for r in router_names() if r not in row or f"`{r}`" not in clusters]
    assert not missing, f"routers missing from docs/reference/config.md's cluster.router row or docs/offload.md: {missing}"


# --- reading pages: read in about an hour, with room for a policy and a router ---------------

WORDS_PER_MINUTE = 230  # a technical reader
BUDGET = 13_000  # words on all reading pages: about 57 minutes


def reading_words(text: str) -> int:
    """Every word a reader meets: prose, tables and generated blocks alike; not code (fenced
    blocks, indented lines) and not the HTML comments that mark generated blocks."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    text = "\n".join(ln for ln in text.splitlines() if not ln.startswith("    "))
    return sum(1 for w in re.split(r"[\s|]+", text) if re.search(r"\w", w))


def test_reading_words_counts_tables_and_generated_text_but_not_code():
    page = "a b\n<!-- t: x -->\nc d\n<!-- end t -->\n| e | f |\n|---|---|\n    g\n```\nh\n```\ni"
    assert reading_words(page) == 7  # a b c d e f i


def reading_total() -> dict[str, int]:
    return {p.name: reading_words(p.read_text()) for p in reading_pages()}


def test_the_reading_pages_read_in_about_an_hour():
    # findings and superseded figures go to the CHANGELOG, tables to docs/reference/
    per_page = reading_total()
    total = sum(per_page.values())
    assert len(per_page) > 10 and total <= BUDGET, (f"the reading pages hold {total} words "
                                                    f"({total / WORDS_PER_MINUTE:.0f} min), over {BUDGET}: {per_page}")


def section(text: str, heading: str) -> str:
    """The text of the `## heading` section (to the next heading of its level or above)."""
    m = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^##? |\Z)", text, re.S | re.M)
    assert m, heading
    return m[1]


def recipe_words() -> int:
    """What docs/extending.md's recipe adds to the reading pages for one policy and one
    router, sized as the largest of their kind there now: the policy's name in
    docs/policies.md's list, a section as long as its longest `##` section, and a sentence
    in docs/offload.md as long as its longest one that names a router (their rows go to
    docs/reference/policies.md and docs/reference/config.md, looked up, not counted)."""
    from sim.cluster.router import router_names

    policies = (DOCS / "policies.md").read_text()
    sections = re.findall(r"^## .*?\n(.*?)(?=^## |\Z)", policies, re.S | re.M)
    routers = section((DOCS / "offload.md").read_text(), "Replicas and routers")
    sentences = [s for s in re.split(r"(?<=[.:;])\s", routers) if any(f"`{r}`" in s for r in router_names())]
    assert sections and sentences
    return 1 + max(map(reading_words, sections)) + max(map(reading_words, sentences))


def test_adding_a_policy_and_a_router_fits_the_budget():
    extending = (DOCS / "extending.md").read_text()
    assert "## A policy" in extending and "## A router" in extending  # the recipe sized here
    headroom = BUDGET - sum(reading_total().values())
    assert headroom >= recipe_words(), (f"{headroom} words left under the reading budget, fewer than the "
                                        f"{recipe_words()} a policy and a router per docs/extending.md add")


# --- reference pages: generated tables, each page reached from a reading page -----------

# a block a script writes: <!-- NAME: FLAGS --> or <!-- NAME --> ... <!-- end NAME -->,
# <!-- NAME:KEY:begin --> ... <!-- NAME:KEY:end -->, <!-- NAME:start --> ... <!-- NAME:end -->
GENERATED = re.compile(r"^<!-- (?P<a>[\w-]+)(?:: .*?)? -->\n.*?^<!-- end (?P=a) -->$"
                       r"|^<!-- (?P<b>[\w-]+)(?P<key>:[\w.-]+):begin -->\n.*?^<!-- (?P=b)(?P=key):end -->$"
                       r"|^<!-- (?P<c>[\w-]+):start -->\n.*?^<!-- (?P=c):end -->$", re.S | re.M)
WRITERS = [*(ROOT / "benchmarks").glob("*.py"), *(ROOT / "agentsim").glob("*.py")]

# Tables kept by hand on reference pages, each with what keeps it true. A new table goes
# between a script's markers, or here with its reason; a listed one that is gone fails too.
HAND_TABLES = {
    ("cli.md", "| command | what | page |"): "test_every_command_has_its_row_in_the_cli_table",
    ("cli.md", "| file | column | unit | meaning |"): "tests/test_newcomer_pitfalls.py: every output column with its unit",
    ("config.md", "| field | flag / sweep axis | default | meaning |"): "tests/test_config.py: every config field",
    ("policies.md", "| name | what |"): "test_every_policy_is_documented",
    ("traces.md", "| FORMAT | reads |"): "test_every_import_format_has_its_row",
    ("disaggregation.md", "| class | bandwidth (per direction) |"): "test_every_link_class_has_its_row",
    ("traces.md", "| source | segments |"): "descriptive: what each importer and bundled trace gives",
    ("traces.md", "| client → server |"): "descriptive, each row with its sources",
    ("traces.md", "| spec | rests on |"): "each shipped spec's provenance, in the spec itself",
    ("serving_systems.md", "| row | what runs"): "the systems benchmarks/serving_systems_table.py builds",
    ("profiles.md", "| flag | reference | notes |"): "descriptive: sim/hardware/check.py's references",
}


def hand_tables(page: Path) -> list[str]:
    """The header lines of the tables on page outside generated blocks."""
    lines = GENERATED.sub("", page.read_text()).splitlines()
    return [ln for i, ln in enumerate(lines) if ln.startswith("|") and (i == 0 or not lines[i - 1].startswith("|"))]


def test_reference_tables_are_generated_or_declared():
    assert reference_pages(), "no docs/reference/ pages"
    sources = "".join(w.read_text() for w in WRITERS)
    seen = set()
    for page in reference_pages():
        for m in GENERATED.finditer(page.read_text()):
            name = m["a"] or m["b"] or m["c"]
            assert name in sources, f"{page.name}: no script in benchmarks/ or agentsim/ writes the block {name!r}"
        for header in hand_tables(page):
            key = next((k for k in HAND_TABLES if k[0] == page.name and header.startswith(k[1])), None)
            assert key, f"docs/reference/{page.name}: the table {header[:60]!r} is neither written by a script nor in HAND_TABLES"
            seen.add(key)
    assert not set(HAND_TABLES) - seen, f"HAND_TABLES lists tables that are gone: {sorted(set(HAND_TABLES) - seen)}"


def test_generated_blocks_live_on_reference_pages():
    # scripts write evidence where it is looked up; a reading page carries its conclusion
    on_reading = {p.name: [m[0].splitlines()[0] for m in GENERATED.finditer(p.read_text())] for p in reading_pages()}
    assert not any(on_reading.values()), {k: v for k, v in on_reading.items() if v}


def test_every_reference_page_is_linked_from_a_reading_page():
    reading = "".join(p.read_text() for p in reading_pages())
    unlinked = [p.name for p in reference_pages() if f"reference/{p.name}" not in reading]
    assert not unlinked, f"reference pages no reading page links to: {unlinked}"


def test_every_command_has_its_row_in_the_cli_table():
    from agentsim.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    rows = [ln for ln in (REFERENCE / "cli.md").read_text().splitlines() if ln.startswith("| `sim ")]
    missing = [c for c in sub.choices if not any(r.startswith(f"| `sim {c}") for r in rows)]
    assert not missing, f"sim commands without a row in docs/reference/cli.md's table: {missing}"


def test_every_import_format_has_its_row():
    from traces.importers import FORMATS

    text = (REFERENCE / "traces.md").read_text()
    missing = [f for f in FORMATS if f"| `{f}` |" not in text]
    assert not missing, f"`sim trace import` formats without a row in docs/reference/traces.md: {missing}"


def test_every_link_class_has_its_row():
    import json

    classes = json.loads((ROOT / "sim" / "hardware" / "specs" / "gpus.json").read_text())["kv_transfer"]["classes"]
    rows = [ln for ln in (REFERENCE / "disaggregation.md").read_text().splitlines() if ln.startswith("| `")]
    for name, spec in classes.items():
        row = next((r for r in rows if r.startswith(f"| `{name}`")), None)
        assert row and f"| {spec['bandwidth_GBps']:g} GB/s |" in row, (name, row)


def test_docs_say_what_is_true_now():
    # no lab log: dated sections, sessions of work, tables against a commit live in the CHANGELOG
    bad = re.compile(r"^#+ .*(\d{4}-\d{2}-\d{2}|[Ss]ession \d|Against [0-9a-f]{7})|\b(this|last|previous) session\b", re.M)
    hits = [f"{p.relative_to(ROOT)}: {m[0]}" for p in DOCS.rglob("*.md") for m in bad.finditer(GENERATED.sub("", p.read_text()))]
    assert not hits, hits
