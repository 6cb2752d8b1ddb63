"""The README and the reference pages read as they are written: every code block runs as shown
(tests/test_readme.py runs the shell commands) or is an excerpt whose lines are in the file it links; the output
the README quotes is the command's output; every link leads somewhere; the README reads top-down."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rlgrad import cli
from tests.conftest import REPO
from tests.helpers.readme import PAGES

FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>\S*)\n(?P<body>.*?)^(?P=indent)```$", re.S | re.M)
LANGS = {"bash", "python", "text", "yaml"}
EXCERPT = re.compile(r"[Ee]xcerpt of\s+\[`?(?P<label>[^\]`]+)`?\]\((?P<target>[^)#]+)\)")


def _blocks(page: str) -> list[tuple[str, str, str, str]]:
    """(language, body, text before the block, text after it) of each fenced block of a page."""
    text = (REPO / page).read_text()
    return [(m["lang"], m["body"], text[max(0, m.start() - 400):m.start()], text[m.end():m.end() + 300])
            for m in FENCE.finditer(text)]


@pytest.mark.parametrize("page", PAGES)
def test_every_block_says_its_language(page):
    blocks = _blocks(page)
    assert blocks, page
    assert {lang for lang, *_ in blocks} <= LANGS, [lang for lang, *_ in blocks]


@pytest.mark.parametrize("page", PAGES)
def test_every_python_block_is_an_excerpt_of_the_file_it_links(page):
    """A Python block cannot run as shown (it needs a model, a batch, a TRL setup), so it is marked as an excerpt
    next to it, linking the runnable file, and each of its lines but `...` is a line of that file."""
    for lang, body, before, after in _blocks(page):
        if lang != "python":
            continue
        near = before.rsplit("\n\n", 2)[-2:] + after.split("\n\n", 2)[:2]
        marks = [m for chunk in near for m in EXCERPT.finditer(chunk)]
        assert marks, f"{page}: a Python block not marked as an excerpt:\n{body}"
        source = (REPO / page).parent / marks[0]["target"]
        assert source.is_file(), source
        lines = {line.strip() for line in source.read_text().splitlines()}
        for line in body.splitlines():
            assert line.strip() in ("", "...") or line.strip() in lines, f"{page}: not in {source.name}: {line}"


def test_the_doctor_output_the_readme_quotes_is_what_the_doctor_prints(capsys):
    readme = (REPO / "README.md").read_text()
    fixture = re.search(r"Excerpt of its output on `(tests/data/doctor/\w+)`", readme)[1]
    quoted = next(body for lang, body, before, _ in _blocks("README.md") if lang == "text" and fixture in before)
    assert cli.main(["doctor", str(REPO / fixture)]) in (0, 1)
    printed = capsys.readouterr().out
    assert quoted.strip() and quoted.strip() in printed


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"^ *```.*?^ *```$", "", path.read_text(), flags=re.S | re.M)
    return {_slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


def test_slug_follows_github():
    assert _slug("Your own reward function (verl's `custom_reward_function`)") == \
        "your-own-reward-function-verls-custom_reward_function"
    assert _slug("Is my run healthy? `rlgrad doctor`") == "is-my-run-healthy-rlgrad-doctor"


@pytest.mark.parametrize("page", ["README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))])
def test_every_link_leads_somewhere(page):
    path = REPO / page
    text = re.sub(r"^ *```.*?^ *```$", "", path.read_text(), flags=re.S | re.M)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(target)
    assert not broken, f"{page}: {broken}"


PAGE_REF = re.compile(r"(?<![\w/])((?:README|docs/\w+)\.md)(?:#([\w-]+))?")
QUOTED_SECTION = re.compile(r"(README(?:\.md)?|docs/\w+\.md)\W{0,4}\"([^\"]+)\"")


def test_every_preset_description_is_whole_and_its_references_resolve():
    """`rlgrad presets` shows each description whole (no sentence cut off before an indented command), and every
    page, anchor or section a preset names exists (sections moved from the README to docs/ once)."""
    from rlgrad.config.load import presets

    cut = [name for name, about in presets() if not re.search(r"[.!?][)`\"']?$", about)]
    assert not cut, f"descriptions cut off: {cut}"
    broken = []
    for path in sorted((REPO / "configs").glob("*.yaml")):
        comments = "\n".join(line for line in path.read_text().splitlines() if line.lstrip().startswith("#"))
        for file, anchor in PAGE_REF.findall(comments):
            if not (REPO / file).is_file() or (anchor and anchor not in _anchors(REPO / file)):
                broken.append(f"{path.name}: {file}#{anchor}")
        for page, section in QUOTED_SECTION.findall(comments):
            dest = REPO / (page if page.endswith(".md") else "README.md")
            if not any(anchor.startswith(_slug(section)) for anchor in _anchors(dest)):
                broken.append(f"{path.name}: {page} \"{section}\"")
    assert not broken, broken


def test_the_readme_reads_top_down():
    """What rlgrad shows (a figure, a diagnosis) before the Quickstart, then Install, then pointers to the
    reference pages, which hold the reference itself."""
    readme = (REPO / "README.md").read_text()
    heads = re.findall(r"^## (.+)$", readme, flags=re.M)
    assert heads[:4] == ["What you get", "Quickstart", "Install", "What to run next"], heads
    top = readme[:readme.index("## Quickstart")]
    assert "![" in top and "[CRITICAL]" in top
    for page in PAGES[1:]:
        assert f"]({page})" in readme, page
    assert len(readme.splitlines()) < 200
    install = readme[readme.index("## Install"):readme.index("## What to run next")]
    assert "source .venv/bin/activate" in install and "not on a package index" in install
    assert "pip install -e '.[trl]'" in install and "pip install -e '.[verl]'" in install
    assert not re.search(r"pip install '?rlgrad\[", "\n".join((REPO / p).read_text() for p in PAGES))
