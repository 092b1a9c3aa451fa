"""Every relative link in README.md and docs/*.md points to a file that exists, and every #anchor
to a heading of its target, under GitHub's anchor rules. Links to http(s) pages are not checked."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^(```|~~~).*?^\1", flags=re.S | re.M)
CODE_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)", flags=re.S)
LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*<?([^()\s<>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$", flags=re.M)


def without_code(text):
    """The page with fenced blocks and inline code spans blanked (their brackets are not links)."""
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return CODE_SPAN.sub("", text)


def anchor(heading):
    """GitHub's anchor for a heading: the rendered text lower-cased, every character that is not a
    letter, digit, '_', '-' or space removed, spaces turned into '-'."""
    text = re.sub(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text).lower()  # inline HTML
    text = "".join(c for c in text if c.isalnum() or c in "_- ")
    return text.replace(" ", "-")


def anchors(path):
    """Every anchor of a page, with GitHub's -1, -2, ... for repeated headings."""
    seen, result = {}, set()
    for _, title in HEADING.findall(FENCE.sub("", path.read_text())):
        base = anchor(title)
        count = seen.get(base, 0)
        seen[base] = count + 1
        result.add(base if count == 0 else f"{base}-{count}")
    return result


def links(path):
    """(line, target) for every relative link of the page, code excluded."""
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), path.read_text())
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        for _, target in LINK.findall(CODE_SPAN.sub("", line)):
            if target and not re.match(r"[a-z][a-z0-9+.-]*:", target, flags=re.I):  # http:, mailto:
                found.append((number, target))
    return found


def broken_links(path, root=ROOT):
    """A message for each link of the page whose file or anchor does not exist."""
    problems = []
    for number, target in links(path):
        file_part, _, fragment = target.partition("#")
        target_path = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(root)}:{number}: ({target})"
        if not target_path.exists():
            problems.append(f"{where} no such file")
        elif fragment and target_path.suffix == ".md" and fragment not in anchors(target_path):
            problems.append(f"{where} no heading with anchor #{fragment} in {target_path.relative_to(root)}")
    return problems


def test_the_anchor_rules():
    assert anchor("Hierarchical Transformer Memory (HTM) — [`docs/htm.md`](docs/htm.md)") == (
        "hierarchical-transformer-memory-htm--docshtmmd")
    assert anchor("What does not work yet") == "what-does-not-work-yet"
    assert anchor("Agents: episode ends inside a call, streaming at any split") == (
        "agents-episode-ends-inside-a-call-streaming-at-any-split")
    assert anchor("`read_impl` and top_k") == "read_impl-and-top_k"


def test_a_broken_link_is_found(tmp_path):
    (tmp_path / "a.md").write_text(
        "# Title\n\n## Second part\n\n[ok](#second-part) [ok](b.md#b-page) [ok](b.md)\n"
        "[gone](missing.md) [gone](b.md#no-such) [gone](#title-2) ![gone](c.png)\n"
        "`[code](not-a-link.md)`\n\n```\n[code](not-a-link.md)\n```\n[web](https://example.com/x)\n")
    (tmp_path / "b.md").write_text("# B page\n")
    problems = broken_links(tmp_path / "a.md", root=tmp_path)
    assert [p.split(" ", 1)[0] for p in problems] == ["a.md:6:"] * 4, problems
    assert "(missing.md)" in problems[0] and "#no-such" in problems[1] and "#title-2" in problems[2]


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_link_resolves(page):
    assert not broken_links(page), "\n".join(broken_links(page))
