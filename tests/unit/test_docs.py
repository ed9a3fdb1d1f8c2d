"""The repository's own account of itself: the README is the product's front page (its two set-up
commands first, at most about 300 lines), every relative link in the README and under docs/ leads
to a file of the repository and, where it names one, to a heading of that file, and no tracked
file cites a path outside the repository."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", REPO / "ARCHITECTURE.md", *sorted((REPO / "docs").glob("*.md"))]
OUTSIDE = re.compile(r"\.\./shared|PRODUCT\.md|PRODUCT" r"\s§")  # the contract outside the repository; in two pieces, so this line is not one
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but hyphens dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(line.lstrip("#")) for line in page.read_text().splitlines() if re.match(r"^#{1,6} ", line)}


def test_the_readme_starts_with_the_two_commands_and_stays_short():
    lines = (REPO / "README.md").read_text().splitlines()
    assert lines[:4] == ["```bash", "bash scripts/install.sh && .venv/bin/tucano serve",
                         "bash scripts/install.sh && .venv/bin/python -m pytest -q", "```"]
    assert len(lines) <= 300, len(lines)


def test_the_ci_runs_the_readme_test_command():
    ci = (REPO / ".ci" / "run").read_text()
    assert "bash scripts/install.sh" in ci and "\n.venv/bin/python -m pytest -q\n" in ci


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_relative_link_leads_somewhere(page):
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists() or (REPO not in file.parents and file != REPO) or (anchor and file.suffix == ".md" and anchor not in anchors(file)):
            broken.append(target)
    assert not broken, f"{page.name}: {broken}"


def test_no_tracked_file_cites_a_path_outside_the_repository():
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    text = {".py", ".md", ".sh", ".toml", ".yaml", ".yml", ".js", ".html", ".json"}
    citing = [name for name in files if (REPO / name).is_file() and (REPO / name).suffix in text
              and OUTSIDE.search((REPO / name).read_text(errors="replace"))]
    assert not citing, citing


def defined_names(path: Path) -> set[str]:
    """Every name a module defines: functions, classes, their methods and fields, module constants."""
    import ast

    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign):
            names |= {target.id for target in node.targets if isinstance(target, ast.Name)}
    return names


def test_where_is_answers_with_files_and_names_that_exist():
    """ARCHITECTURE.md's "where is X?" table: each file it names exists, and each code name after
    a file (`Store.change_route()`, `SAMPLING`) is defined in that file."""
    table = (REPO / "ARCHITECTURE.md").read_text().partition("## Where is")[2]
    wrong = []
    for row in (line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| question")):
        current = None
        for token in re.findall(r"`([^`]+)`", row.split("|")[2]):
            if re.fullmatch(r"[\w/<>.-]+\.py|[\w/]+/", token):
                current = REPO / token if "<" not in token else None
                if current is not None and not current.exists():
                    wrong.append(token)
                    current = None
            elif (current is not None and current.suffix == ".py" and re.fullmatch(r"[A-Za-z_][\w.]*(\(\))?", token)
                  and not token.startswith("TUCANO_") and re.search(r"[()._A-Z]", token)):  # code, not a setting's variable or a word
                missing = [part for part in token.removesuffix("()").split(".") if part not in defined_names(current)]
                if missing:
                    wrong.append(f"{current.relative_to(REPO)}: {token}")
    assert not wrong, wrong
