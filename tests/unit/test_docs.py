"""The README is a page for users and the docs hold the reference: short, findable, links that resolve,
commands that exist, no work-log wording."""
import re

import pytest

from tests.conftest import ROOT

README = ROOT / "README.md"
DOCS = ROOT / "docs"
# Work-log wording: who measured what, when. Allowed only in docs/benchmarks.md, whose history is dated.
WORK_LOG = re.compile(
    r"session \d+|this session|we measured|as on this project's machines|did not hold|on this machine's disk"
    r"|\bI (measured|tried|ran)\b",
    re.IGNORECASE,
)
# What a newcomer looks for, and the words its table-of-contents entry must hold.
TOC_TOPICS = {
    "install": "install", "quick start": "quick start", "job file": "job file", "data": "data",
    "Hugging Face": "hugging face", "CLI": "cli", "Kubernetes": "kubernetes", "security": "security",
}
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def markdown_pages():
    return [README, *sorted(DOCS.glob("*.md"))]


def prose(text: str) -> str:
    """The text without fenced code blocks and inline code: links there are not links."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, flags=re.M)}


def section(text: str, title: str) -> str:
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def test_readme_is_short():
    lines = README.read_text().splitlines()
    assert len(lines) <= 450, f"README.md has {len(lines)} lines; reference detail belongs in docs/"
    count = sum("RAYTRAIN_" in line for line in lines)  # as `grep -c RAYTRAIN_ README.md` counts
    assert count <= 15, f"{count} README lines name RAYTRAIN_ variables; the table is docs/settings.md"


def test_table_of_contents_finds_what_a_newcomer_needs():
    text = README.read_text()
    toc = section(text, "Contents")
    entries = re.findall(r"^- \[([^\]]+)\]\(#([^)]+)\)(.*)$", toc, flags=re.M)
    assert entries, "README.md has no '## Contents' list of links"
    headings = anchors(README)
    for title, anchor, _ in entries:
        assert anchor in headings, f"contents entry {title!r} points at #{anchor}, which no README heading has"
    for topic, words in TOC_TOPICS.items():
        assert any(words in (title + rest).lower() for title, _, rest in entries), f"contents lack {topic!r}"
    assert re.search(r"^## (.+)$", text, flags=re.M).group(1) == "Contents", "the contents come first"


@pytest.mark.parametrize("page", markdown_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"[a-z]+:", target):  # http(s), mailto: not checked here
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target} (no heading #{anchor} in {dest.relative_to(ROOT)})")
    assert not broken, f"{page.relative_to(ROOT)}: broken links: {broken}"


@pytest.mark.parametrize("page", [p for p in markdown_pages() if p.name != "benchmarks.md"],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_no_work_log_wording(page):
    found = sorted({m.group(0) for m in WORK_LOG.finditer(page.read_text())})
    assert not found, f"{page.relative_to(ROOT)} reads like a work log: {found} (dated figures: docs/benchmarks.md)"


TEST_COMMAND = ".venv/bin/python -m pytest -n 2"


def test_the_quick_start_commands_are_the_ones_ci_runs():
    """One command sets up and runs the main job, one runs the tests; .ci/run does the same two steps."""
    text = README.read_text()
    setup = ("bash scripts/install.sh && .venv/bin/raytrain submit jobs/gpt_zero.py --workers 2 --zero 3 "
             "--precision bf16 --grad-accum 4")
    assert setup in text
    assert f"\n{TEST_COMMAND}\n" in text
    ci = (ROOT / ".ci" / "run").read_text()
    assert "bash scripts/install.sh" in ci and f"\nCI=true {TEST_COMMAND} " in ci  # the same command (+ CI's report flags)
    assert (ROOT / "scripts" / "install.sh").exists() and (ROOT / "jobs" / "gpt_zero.py").exists()


def test_the_cli_at_a_glance_names_real_commands_and_options():
    """Every command and submit option the README's CLI tables name exists (a rename would leave the README
    stale)."""
    import click

    from raytrain.cli.main import main as cli

    ctx = click.Context(cli)
    cli_text = section(README.read_text(), "The CLI at a glance")
    commands = re.findall(r"^\| `raytrain ([^`]+)` \|", cli_text, flags=re.M)
    assert len(commands) >= 6, commands
    for command in commands:
        words = command.replace("\\|", "|").split()
        group = cli.get_command(ctx, words[0])
        assert group is not None, f"raytrain {words[0]}: no such command"
        if isinstance(group, click.Group):
            for sub in words[1].split("|"):
                assert group.get_command(ctx, sub) is not None, f"raytrain {words[0]} {sub}: no such command"
    submit = cli.get_command(ctx, "submit")
    known = {opt for param in submit.params for opt in (*param.opts, *param.secondary_opts)}
    named = set()
    for first_cell in re.findall(r"^\| (`-[^|]*?) \|", cli_text, flags=re.M):
        named |= set(re.findall(r"(?<![\w-])(--?[a-z][a-z0-9-]*)", first_cell))
    assert len(named) >= 20, sorted(named)
    assert not named - known, f"not submit options: {sorted(named - known)}"


def test_settings_page_lists_every_variable_the_docs_name():
    settings = (DOCS / "settings.md").read_text()
    rows = "".join(line for line in settings.splitlines(True) if line.startswith("| `RAYTRAIN_"))
    listed = set(re.findall(r"`(RAYTRAIN_[A-Z0-9_]+)`", rows))
    for page in markdown_pages():
        if page.name == "benchmarks.md":  # its history may name a switch since removed
            continue
        named = set(re.findall(r"\b(RAYTRAIN_[A-Z0-9_]*[A-Z0-9])\b", page.read_text()))  # not _RAYTRAIN_COMPLETE
        missing = named - listed
        assert not missing, f"{page.relative_to(ROOT)} names {sorted(missing)}, which docs/settings.md lacks"


def test_every_docs_page_has_one_title():
    for page in DOCS.glob("*.md"):
        lines = page.read_text().splitlines()
        assert lines and lines[0].startswith("# "), f"{page.name} starts without a '# ' title"
        assert sum(1 for line in prose(page.read_text()).splitlines() if line.startswith("# ")) == 1, page.name


def test_the_readme_security_section_points_at_the_whole_model():
    sec = section(README.read_text(), "Security")
    assert "(docs/security.md)" in sec and "(k8s/README.md)" in sec


# Work-log wording in the code's comments and docstrings: a comment says why, in a line or two, and points to
# docs/benchmarks.md for the figures. (Not "session" alone: a process session is a thing the code manages.)
CODE_LOG = re.compile(
    r"\bmeasured (on|at|in|with|by|against)\b|\b(we|I) (measured|tried|ran)\b|\bsessions? \d+\b|\bthis session\b"
    r"|\b20[2-9]\d-[01]\d\b",
    re.IGNORECASE,
)


def comments_and_docstrings(path):
    """(line, text) of every comment and docstring of a Python file."""
    import ast
    import io
    import tokenize

    source = path.read_text()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield node.body[0].lineno, doc


def work_log_in_code(root) -> list[str]:
    return [f"{path.relative_to(root.parent)}:{line}: {match.group(0)!r}"
            for path in sorted(root.rglob("*.py")) for line, text in comments_and_docstrings(path)
            for match in CODE_LOG.finditer(text)]


def test_no_work_log_wording_in_code_comments_or_the_readme():
    assert work_log_in_code(ROOT / "raytrain") == [], "say why in the code; the figures go in docs/benchmarks.md"
    found = sorted({m.group(0) for m in CODE_LOG.finditer(README.read_text())})
    assert not found, f"README.md reads like a work log: {found}"


def test_the_code_work_log_check_sees_a_dated_measurement(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "m.py").write_text('"""Fast."""\n# steps took 62 ms, measured on 2026-12-05 (session 7)\nX = 1\n')
    assert work_log_in_code(pkg) == ["pkg/m.py:2: 'measured on'", "pkg/m.py:2: '2026-12'", "pkg/m.py:2: 'session 7'"]
