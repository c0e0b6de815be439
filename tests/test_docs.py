"""The documentation: the MkDocs site under docs/ builds with --strict (a broken link or
anchor, a missing image or a page left out of the nav fails it), and README stays short,
keeps CI's commands and points at pages and anchors that exist."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
LINK = re.compile(r"\]\((docs/[^)\s]+)\)")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
                        "--site-dir", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"mkdocs build --strict failed:\n{r.stdout}\n{r.stderr}"
    return out


def test_site_builds_strict(site):
    assert (site / "index.html").is_file()
    for page in DOCS.glob("*.md"):
        if page.name != "index.md":
            assert (site / page.stem / "index.html").is_file(), page.name


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
    linked = {Path(link.partition("#")[0]).name for link in readme_links()}
    pages = {p.name for p in DOCS.glob("*.md")}
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

    cli, pol = (DOCS / "cli.md").read_text(), (DOCS / "policies.md").read_text()
    missing = [p for p in POLICIES if f"`{p}`" not in pol or p not in cli]
    assert not missing, f"policies missing from docs/cli.md or docs/policies.md: {missing}"


def test_every_router_is_documented():
    from sim.cluster.router import router_names

    config, clusters = (DOCS / "config.md").read_text(), (DOCS / "offload.md").read_text()
    row = next(ln for ln in config.splitlines() if ln.startswith("| `cluster.router` |"))
    missing = [r for r in router_names() if r not in row or f"`{r}`" not in clusters]
    assert not missing, f"routers missing from docs/config.md's cluster.router row or docs/offload.md: {missing}"


def prose_words(text: str) -> int:
    """Words a reader reads: outside generated blocks (a script rewrites them), code blocks,
    indented examples and Markdown tables."""
    text = re.sub(r"<!-- (\w+): .*?-->.*?<!-- end \1 -->", "", text, flags=re.S)
    text = re.sub(r"<!-- ([\w-]+:[\w.-]+):begin -->.*?<!-- \1:end -->", "", text, flags=re.S)
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return len(" ".join(ln for ln in text.splitlines() if not ln.startswith(("|", "    "))).split())


def test_the_docs_stay_within_their_word_budget():
    # the site is a product: what is true now, at most 15,000 words of prose; findings and
    # superseded figures go to the CHANGELOG
    per_page = {p.name: prose_words(p.read_text()) for p in sorted(DOCS.glob("*.md"))}
    assert len(per_page) > 10 and sum(per_page.values()) <= 15_000, per_page
    assert prose_words("a b\n<!-- t: x -->\nc d\n<!-- end t -->\n| e |\n    f\n```\ng\n```\nh") == 3
